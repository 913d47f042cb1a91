"""The claim travels whole: every sink, the commit guard and the Spark conf builder take a
:class:`~neli_orchestrate.claim.Claim`, and each loose-argument form (run key, token, role=,
deployment=) records exactly what the Claim form records."""

from __future__ import annotations

import json
import uuid

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyiceberg.catalog.sql import SqlCatalog
from sink_cases import SCHEMA

from neli_orchestrate.claim import Claim
from neli_orchestrate.errors import ConfigError, StaleTokenError
from neli_orchestrate.sinks import delta, iceberg
from neli_orchestrate.spark import (
    TokenCommitGuard,
    neli_spark_conf,
    read_neli_conf,
    write_delta_fenced,
    write_iceberg_fenced,
    write_parquet_fenced,
)
from neli_orchestrate.spark.commit import commit_output
from neli_orchestrate.spark.delta import delta_app_id, delta_history
from neli_orchestrate.testing.table_jars import local_table_session

ROLE, DATE, DEPLOYMENT = "daily_flights", "2013-01-05", "us-east-1"
CLAIM = Claim(token=7, run_key=DATE, role=ROLE, deployment=DEPLOYMENT)
LOOSE = {"role": ROLE, "deployment": DEPLOYMENT}


def marker_fields(marker):
    """What a directory commit records, less the instant and the place."""
    metadata = {k: v for k, v in marker.metadata.items() if k != "staging"}  # a random name
    return (marker.token, marker.run_key, marker.role, marker.deployment, marker.attempt,
            metadata)


def test_spark_conf_from_a_claim_equals_the_keyword_form_and_reads_back_whole():
    conf = neli_spark_conf(CLAIM)
    assert conf == neli_spark_conf(**CLAIM.xcom())
    assert read_neli_conf(conf) == CLAIM
    assert read_neli_conf(neli_spark_conf(CLAIM, attempt=2)) == Claim(
        token=7, run_key=DATE, role=ROLE, deployment=DEPLOYMENT, attempt=2)
    with pytest.raises(ConfigError, match="not both"):
        neli_spark_conf(CLAIM, token=8)
    with pytest.raises(ConfigError, match="needs a Claim"):
        neli_spark_conf()
    assert neli_spark_conf(7, DATE, ROLE, DEPLOYMENT) == conf  # the loose form, positional


def test_the_commit_guard_records_the_same_marker_for_a_claim_and_its_loose_form(tmp_path):
    whole, loose = TokenCommitGuard(tmp_path / "whole"), TokenCommitGuard(tmp_path / "loose")
    with whole.stage(CLAIM, metadata={"rows": 1}) as a:
        (a.path / "part").write_text("x")
    with loose.stage(DATE, 7, **LOOSE, metadata={"rows": 1}) as b:
        (b.path / "part").write_text("x")
    assert a.marker is not None and b.marker is not None
    assert marker_fields(a.marker) == marker_fields(b.marker)
    assert marker_fields(a.marker)[:5] == (7, DATE, ROLE, DEPLOYMENT, 0)
    assert a.marker.metadata["rows"] == 1
    # one record: a stale claim is refused whichever form wrote the newer one
    with pytest.raises(StaleTokenError):
        whole.check(CLAIM.with_token(5))
    with pytest.raises(StaleTokenError):
        loose.check(DATE, 5, role=ROLE)
    with pytest.raises(ConfigError, match="not both"):
        whole.stage(CLAIM, 8)
    with pytest.raises(ConfigError, match="no token"):
        whole.stage(DATE)


def test_commit_output_takes_a_claim_and_its_loose_form_alike(tmp_path):
    def write(path):
        (path / "part").write_text("x")

    a = commit_output(tmp_path / "whole", CLAIM, write)
    b = commit_output(tmp_path / "loose", DATE, 7, write, **LOOSE)
    assert marker_fields(a) == marker_fields(b)
    with pytest.raises(ConfigError, match="not both"):
        commit_output(tmp_path / "whole", CLAIM, write, role="other")


def arrow_rows(n=2):
    return pa.table({"date": [DATE] * n, "carrier": [f"C{i}" for i in range(n)]})


def test_delta_rs_records_the_same_transaction_for_a_claim_and_its_loose_form(tmp_path):
    whole, loose = str(tmp_path / "whole"), str(tmp_path / "loose")
    a = delta.write_deltalake_fenced(arrow_rows(), whole, CLAIM)
    b = delta.write_deltalake_fenced(arrow_rows(), loose, DATE, 7, **LOOSE)
    assert (a.app_id, a.run_key, a.token, a.committed) == (b.app_id, b.run_key, b.token, True)

    def recorded(uri):
        table = DeltaTable(uri)
        meta = [json.loads(h["userMetadata"]) for h in table.history() if "userMetadata" in h]
        return table.transaction_version(delta_app_id(ROLE, DATE)), meta

    assert recorded(whole) == recorded(loose)
    assert recorded(whole)[1][-1]["neli.deployment"] == DEPLOYMENT
    with pytest.raises(StaleTokenError):
        delta.write_deltalake_fenced(arrow_rows(), whole, CLAIM.with_token(5))


def test_pyiceberg_records_the_same_snapshot_for_a_claim_and_its_loose_form(tmp_path):
    catalog = SqlCatalog("neli", uri=f"sqlite:///{tmp_path}/catalog.db",
                         warehouse=(tmp_path / "wh").as_uri())
    catalog.create_namespace("flights")
    for name in ("whole", "loose"):
        catalog.create_table(f"flights.{name}", schema=arrow_rows(1).schema)
    a = iceberg.write_pyiceberg_fenced(arrow_rows(), catalog, "flights.whole", CLAIM)
    b = iceberg.write_pyiceberg_fenced(arrow_rows(), catalog, "flights.loose", DATE, 7, **LOOSE)
    assert (a.run_key, a.token, a.committed) == (b.run_key, b.token, True)

    def recorded(name):
        table = catalog.load_table(f"flights.{name}")
        summary = table.current_snapshot().summary.additional_properties
        neli = {k: v for k, v in summary.items() if k.startswith("neli.")}
        return neli, {k: v for k, v in table.properties.items() if k.startswith("neli.")}

    assert recorded("whole") == recorded("loose")
    assert recorded("whole")[0]["neli.deployment"] == DEPLOYMENT
    with pytest.raises(StaleTokenError):
        iceberg.write_pyiceberg_fenced(arrow_rows(), catalog, "flights.whole",
                                       CLAIM.with_token(5))


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    session = local_table_session(tmp_path_factory.mktemp("warehouse"), app_name="claim forms")
    yield session
    session.stop()


def test_the_spark_sinks_take_the_claim_read_back_from_spark_conf(spark, tmp_path):
    """A real SparkSession: the job's ``read_neli_conf`` result goes into each Spark sink
    whole, and records what the loose form records."""
    claim = read_neli_conf(neli_spark_conf(CLAIM))
    df = spark.createDataFrame([(DATE, "C0", 1, "w")], SCHEMA).coalesce(1)

    a = write_parquet_fenced(df, tmp_path / "pq-whole", claim, partition_column="date")
    b = write_parquet_fenced(df, tmp_path / "pq-loose", DATE, 7, **LOOSE, partition_column="date")
    assert marker_fields(a) == marker_fields(b)

    whole, loose = str(tmp_path / "delta-whole"), str(tmp_path / "delta-loose")
    write_delta_fenced(df, whole, claim)
    write_delta_fenced(df, loose, DATE, 7, **LOOSE)

    def delta_records(path):
        return [{k: v for k, v in h.items() if k not in ("version", "timestamp")}
                for h in delta_history(spark, path)]

    assert delta_records(whole) == delta_records(loose)
    assert delta_records(whole)[-1]["deployment"] == DEPLOYMENT

    tables = [f"neli.flights.claim_{name}_{uuid.uuid4().hex[:8]}" for name in ("whole", "loose")]
    for table in tables:
        spark.sql(f"CREATE TABLE {table} ({SCHEMA.replace('long', 'bigint')}) "
                  "USING iceberg PARTITIONED BY (date)")
    write_iceberg_fenced(df, tables[0], claim)
    write_iceberg_fenced(df, tables[1], DATE, 7, **LOOSE)

    def iceberg_summary(table):
        summary = spark.sql(f"SELECT summary FROM {table}.snapshots").collect()[-1][0]
        return {k: v for k, v in summary.items() if k.startswith("neli.")}

    assert iceberg_summary(tables[0]) == iceberg_summary(tables[1])
    assert iceberg_summary(tables[0])["neli.deployment"] == DEPLOYMENT
