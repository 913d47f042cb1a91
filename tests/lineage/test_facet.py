"""The ``neli`` OpenLineage run facet: one derivation, its schema in the package, the ledger
offset it reports (read back through a replay and through the replay cache)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from neli_orchestrate import __version__
from neli_orchestrate.ledger.cache import Checkpoint, ReplayCache
from neli_orchestrate.ledger.record import LedgerRecord, RunState, encode_key
from neli_orchestrate.ledger.replay import ReplayBuilder
from neli_orchestrate.lineage.facet import (
    SCHEMA_PATH,
    SCHEMA_URL,
    neli_facet,
    schema_file,
    sink_dataset,
)
from neli_orchestrate.sinks.delta import DeltaCommit
from neli_orchestrate.sinks.iceberg import IcebergCommit

ROLE, RUN_KEY = "daily", "daily/2013-01-05"


def schema() -> dict[str, object]:
    return json.loads(schema_file(SCHEMA_URL).read_text())


def completed(token: int, deployment: str = "eu-west-1") -> LedgerRecord:
    return LedgerRecord(ROLE, RUN_KEY, RunState.COMPLETED, token, deployment, "m", 1,
                        1_700_000_000.0)


def read_back(*records: LedgerRecord, first_offset: int = 40) -> ReplayBuilder:
    builder = ReplayBuilder(ROLE)
    for offset, record in enumerate(records, start=first_offset):
        builder.add(encode_key(ROLE, record.run_key), record.encode(), offset)
    return builder


def test_the_schema_url_names_the_schema_file_of_this_release_in_the_package() -> None:
    assert SCHEMA_URL == f"pkg:pypi/neli-orchestrate@{__version__}#{SCHEMA_PATH}"
    path = schema_file(SCHEMA_URL)
    assert path.as_posix().endswith(SCHEMA_PATH)
    jsonschema.Draft202012Validator.check_schema(schema())
    with pytest.raises(ValueError, match="0.0.1 is .* installed|names neli-orchestrate 0.0.1"):
        schema_file(SCHEMA_URL.replace(__version__, "0.0.1"))
    with pytest.raises(ValueError, match="not a neli-orchestrate schema URL"):
        schema_file("https://openlineage.io/spec/2-0-2/OpenLineage.json")


def test_the_region_that_ran_and_a_proxy_agree_on_the_run_and_differ_in_proxy() -> None:
    record = read_back(completed(37)).build(41, fenced=False).latest(RUN_KEY)
    assert record is not None and record.offset == 40  # the read path carries the offset
    ran = neli_facet(record, recorded_by="eu-west-1")
    proxy = neli_facet(record, recorded_by="us-east-1")
    for facet in (ran, proxy):
        jsonschema.validate(facet, schema())
        assert (facet["role"], facet["run_key"], facet["token"]) == (ROLE, RUN_KEY, 37)
        assert (facet["deployment"], facet["ledger_offset"], facet["state"]) == (
            "eu-west-1", 40, "COMPLETED")
    assert (ran["proxy"], proxy["proxy"]) == (False, True)
    assert (ran["recorded_by"], proxy["recorded_by"]) == ("eu-west-1", "us-east-1")


def test_a_record_not_read_back_has_no_offset_and_the_next_record_starts_without_one() -> None:
    record = read_back(completed(37)).build(41, fenced=False).latest(RUN_KEY)
    assert record is not None
    claimed = LedgerRecord(ROLE, "other", RunState.CLAIMED, 39, "eu-west-1", "m", 1, 1.0,
                           handoff_deadline=2.0)
    assert "ledger_offset" not in neli_facet(claimed, recorded_by="eu-west-1")
    running = read_back(claimed).build(41, fenced=False).latest("other")
    assert running is not None and running.offset == 40
    assert running.advance(RunState.RUNNING, at=3.0).offset is None
    assert running == claimed  # the offset is not part of the record's value or equality
    jsonschema.validate(neli_facet(claimed, recorded_by="x"), schema())


def test_the_replay_cache_keeps_each_record_s_offset(tmp_path: Path) -> None:
    builder = read_back(completed(5), first_offset=7)
    ReplayCache(tmp_path).put(Checkpoint("cluster", "ledger", "id-1", 0, 8, 1000.0,
                                         builder.state()))
    loaded = ReplayCache(tmp_path).get("cluster", "ledger", ROLE)
    assert loaded is not None
    record = ReplayBuilder(ROLE, loaded.state).build(8, fenced=False).latest(RUN_KEY)
    assert record is not None and record.offset == 7


def test_a_facet_that_breaks_the_schema_is_refused_by_it() -> None:
    facet = neli_facet(completed(37), recorded_by="us-east-1")
    facet["proxy"] = "yes"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(facet, schema())


def test_the_sinks_commits_are_datasets_with_their_table_version() -> None:
    delta = DeltaCommit("s3://lake/daily", "app", RUN_KEY, 37, committed=True, version=12)
    assert sink_dataset(delta) == {"namespace": "s3://lake", "name": "/daily", "version": "12"}
    local = DeltaCommit("/data/daily", "app", RUN_KEY, 37, committed=True, version=0)
    assert sink_dataset(local) == {"namespace": "file", "name": "/data/daily", "version": "0"}
    iceberg = IcebergCommit("db.daily", RUN_KEY, 37, committed=True, snapshot_id=991)
    assert sink_dataset(iceberg) == {"namespace": "iceberg", "name": "db.daily",
                                     "version": "991"}
    assert sink_dataset("ran") is None


def test_the_airflow_facet_serializes_to_what_the_schema_accepts() -> None:
    from openlineage.client.serde import Serde

    from neli_orchestrate.airflow.lineage import run_facet

    facet = neli_facet(completed(37), recorded_by="us-east-1")
    sent = json.loads(Serde.to_json(run_facet(facet)))
    jsonschema.validate(sent, schema())
    assert sent == facet
