"""Token-checked Delta commits without Spark (neli_orchestrate.dagster.delta, on delta-rs):
the same outcomes as the Spark sink, on a real Delta table on disk."""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from neli_orchestrate.dagster import delta as sink
from neli_orchestrate.errors import ConfigError, StaleTokenError
from neli_orchestrate.spark.delta import delta_app_id

ROLE, DATE, OTHER_DATE = "daily_flights", "2013-01-05", "2013-01-06"
ZOMBIE, OWNER = 5, 7


def rows(writer, n, date=DATE):
    return pa.table({"date": [date] * n, "carrier": [f"C{i}" for i in range(n)],
                     "writer": [writer] * n})


def content(uri, date=DATE):
    table = DeltaTable(uri).to_pyarrow_table().to_pylist()
    return sorted((r["date"], r["carrier"], r["writer"]) for r in table if r["date"] == date)


def expected(writer, n, date=DATE):
    return sorted((r["date"], r["carrier"], r["writer"]) for r in rows(writer, n, date).to_pylist())


def write(uri, data, token, run_key=DATE):
    return sink.write_deltalake_fenced(data, uri, run_key, token, role=ROLE)


def test_zombie_commits_first_then_owner_replaces_its_rows(tmp_path):
    uri = str(tmp_path / "daily")
    write(uri, rows("other-day", 2, OTHER_DATE), 3, run_key=OTHER_DATE)
    write(uri, rows("zombie", 3), ZOMBIE)
    commit = write(uri, rows("owner", 2), OWNER)

    assert commit.committed
    assert content(uri) == expected("owner", 2)
    assert content(uri, OTHER_DATE) == expected("other-day", 2, OTHER_DATE)
    assert DeltaTable(uri).transaction_version(delta_app_id(ROLE, DATE)) == OWNER


def test_owner_commits_first_then_zombie_raises_and_table_is_unchanged(tmp_path):
    uri = str(tmp_path / "daily")
    write(uri, rows("owner", 2), OWNER)
    version = DeltaTable(uri).version()

    with pytest.raises(StaleTokenError) as raised:
        write(uri, rows("zombie", 3), ZOMBIE)

    assert (raised.value.token, raised.value.committed) == (ZOMBIE, OWNER)
    assert content(uri) == expected("owner", 2)
    assert DeltaTable(uri).version() == version


def test_zombie_that_read_before_the_owner_committed_is_refused(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="neli_orchestrate.dagster.delta")
    uri = str(tmp_path / "daily")
    write(uri, rows("other-day", 1, OTHER_DATE), 1, run_key=OTHER_DATE)
    # The zombie loads the table (no token recorded for the date yet) ...
    seen_by_zombie = DeltaTable(uri)
    # ... the owner commits ...
    write(uri, rows("owner", 2), OWNER)
    # ... and the zombie writes through what it had loaded: delta-rs' conflict check refuses
    # it, and the retry sees the owner's token.
    real_load, calls = sink._load, []

    def load_once_stale(u, options):
        calls.append(u)
        return seen_by_zombie if len(calls) == 1 else real_load(u, options)

    monkeypatch.setattr(sink, "_load", load_once_stale)
    with pytest.raises(StaleTokenError) as raised:
        write(uri, rows("zombie", 3), ZOMBIE)

    assert (raised.value.token, raised.value.committed) == (ZOMBIE, OWNER)
    assert sum("lost a race" in r.getMessage() for r in caplog.records) == 1
    assert content(uri) == expected("owner", 2)
    assert DeltaTable(uri).transaction_version(delta_app_id(ROLE, DATE)) == OWNER


def test_takeover_after_kill_after_job_does_not_duplicate_rows(tmp_path):
    uri = str(tmp_path / "daily")
    write(uri, rows("run", 4), ZOMBIE)
    commit = write(uri, rows("run", 4), OWNER)

    assert commit.committed
    assert content(uri) == expected("run", 4)


def test_same_token_twice_is_a_no_op_and_empty_output_is_refused(tmp_path):
    uri = str(tmp_path / "daily")
    first = write(uri, rows("owner", 2).to_pandas(), OWNER)
    again = write(uri, rows("owner-retry", 5), OWNER)
    assert first.committed and not again.committed and again.version == first.version
    assert content(uri) == expected("owner", 2)
    with pytest.raises(ConfigError, match="empty"):
        write(uri, rows("owner", 0), 9)
