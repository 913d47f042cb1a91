"""The Spark Delta and Spark Iceberg sinks on a local S3-compatible server (moto's server mode).

One SparkSession for the module, with the optional S3 jar set
(:func:`~neli_orchestrate.testing.table_jars.ensure_s3a_jars`: ``hadoop-aws`` and the AWS SDK v2
modules S3A loads, plus ``sqlite-jdbc``). Commit protocols on S3:

- Delta via Spark on ``s3a://``: Delta 4.4's default LogStore for the scheme,
  ``S3SingleDriverLogStore``, which makes the log's put-if-absent mutually exclusive *inside one
  driver JVM* only. The test checks that this is the LogStore in use; its writers share one
  driver, the case that LogStore is safe for.
- Iceberg via Spark: a JDBC catalog on SQLite, whose commit swaps the metadata pointer with a
  conditional row update; data and metadata files (unique names) go to ``s3a://`` through
  HadoopFileIO.

Each path, one table: the zombie held inside its write job (after it read the table) while the
owner commits is refused; then, the owner having committed first, the zombie is refused again
and nothing new reaches S3.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import boto3
import pytest
from sink_cases import DATE, OTHER_DATE, Background, Gate, frame, rows

from neli_orchestrate.errors import StaleTokenError
from neli_orchestrate.sinks.delta import committed_token, delta_app_id, write_delta_fenced
from neli_orchestrate.sinks.iceberg import committed_tokens, write_iceberg_fenced
from neli_orchestrate.testing.table_jars import ensure_s3a_jars, local_table_session

ROLE = "daily_flights"
ZOMBIE, OWNER = 5, 7
BUCKET = "lake"
CATALOG = "lake"


@pytest.fixture(scope="module")
def spark(s3: str, tmp_path_factory: Any) -> Any:
    boto3.client("s3", endpoint_url=s3, aws_access_key_id="test", aws_secret_access_key="test",
                 region_name="us-east-1").create_bucket(Bucket=BUCKET)
    catalog_db = tmp_path_factory.mktemp("catalog") / "catalog.db"
    conf = {
        "spark.hadoop.fs.s3a.endpoint": s3,
        "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.aws.credentials.provider":
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        "spark.hadoop.fs.s3a.access.key": "test",
        "spark.hadoop.fs.s3a.secret.key": "test",
        f"spark.sql.catalog.{CATALOG}": "org.apache.iceberg.spark.SparkCatalog",
        f"spark.sql.catalog.{CATALOG}.type": "jdbc",
        f"spark.sql.catalog.{CATALOG}.uri": f"jdbc:sqlite:{catalog_db}",
        f"spark.sql.catalog.{CATALOG}.warehouse": f"s3a://{BUCKET}/warehouse",
        f"spark.sql.catalog.{CATALOG}.io-impl": "org.apache.iceberg.hadoop.HadoopFileIO",
        f"spark.sql.catalog.{CATALOG}.cache-enabled": "false",
    }
    session = local_table_session(tmp_path_factory.mktemp("warehouse"),
                                  app_name="spark sinks on s3", extra_jars=ensure_s3a_jars(),
                                  extra_conf=conf)
    session.sql(f"CREATE NAMESPACE IF NOT EXISTS {CATALOG}.flights")
    yield session
    session.stop()


def lost_races(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records if "lost a race" in r.getMessage()]


def keys(s3: str, prefix: str) -> list[str]:
    client = boto3.client("s3", endpoint_url=s3, aws_access_key_id="test",
                          aws_secret_access_key="test", region_name="us-east-1")
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for o in listed.get("Contents", [])]


def log_entries(s3: str, prefix: str) -> list[str]:
    """The Delta log's commit files on S3 (not its checksums)."""
    names = (k.rsplit("/", 1)[-1] for k in keys(s3, f"{prefix}/_delta_log/"))
    return sorted(n for n in names if n.endswith(".json"))


# -- Delta via Spark, S3SingleDriverLogStore ------------------------------------------------------

def delta_rows(spark: Any, path: str, date: str = DATE) -> list[tuple]:
    df = spark.read.format("delta").load(path).where(f"date = '{date}'")
    return sorted(tuple(r) for r in df.select("date", "carrier", "flights", "writer").collect())


def delta_write(spark: Any, path: str, data: list, token: int, gate: Gate | None = None,
                run_key: str = DATE) -> Any:
    df = frame(spark, data)
    return write_delta_fenced(gate.hold(df) if gate else df, path, run_key, token, role=ROLE)


def test_delta_on_s3a_uses_the_single_driver_log_store(spark: Any) -> None:
    store = spark._jvm.org.apache.spark.sql.delta.storage.DelegatingLogStore
    assert str(store.getDefaultLogStoreClassName("s3a").get()) == (
        "io.delta.storage.S3SingleDriverLogStore")


def test_delta_on_s3_zombie_refused_in_a_race_and_after_the_owner(
        spark: Any, s3: str, tmp_path: Any, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="neli_orchestrate.sinks.delta")
    prefix = f"delta-{uuid.uuid4().hex[:8]}"
    path = f"s3a://{BUCKET}/{prefix}"
    delta_write(spark, path, rows("other-day", 1, OTHER_DATE), 1, run_key=OTHER_DATE)
    gate = Gate(tmp_path, "zombie")
    zombie = Background(lambda: delta_write(spark, path, rows("zombie", 3), ZOMBIE, gate))
    gate.wait_started(zombie)
    owner = delta_write(spark, path, rows("owner", 2), OWNER)
    gate.release()
    zombie.join()

    assert owner.committed
    assert ["commit of token 5 lost a race" in m for m in lost_races(caplog)] == [True]
    assert isinstance(zombie.error, StaleTokenError), zombie.error
    assert (zombie.error.token, zombie.error.committed) == (ZOMBIE, OWNER)
    assert delta_rows(spark, path) == sorted(rows("owner", 2))
    assert delta_rows(spark, path, OTHER_DATE) == sorted(rows("other-day", 1, OTHER_DATE))
    assert committed_token(spark, path, delta_app_id(ROLE, DATE)) == OWNER
    commits = log_entries(s3, prefix)
    assert commits == ["00000000000000000000.json", "00000000000000000001.json"]

    # the owner committed first: the zombie is refused before it writes anything to S3
    with pytest.raises(StaleTokenError) as raised:
        delta_write(spark, path, rows("zombie", 3), ZOMBIE)
    assert (raised.value.token, raised.value.committed) == (ZOMBIE, OWNER)
    assert delta_rows(spark, path) == sorted(rows("owner", 2))
    assert log_entries(s3, prefix) == commits


# -- Iceberg via Spark, JDBC catalog on SQLite, files on s3a:// ----------------------------------

@pytest.fixture
def table(spark: Any) -> str:
    name = f"{CATALOG}.flights.daily_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE TABLE {name} (date string, carrier string, flights bigint, writer string) "
              "USING iceberg PARTITIONED BY (date)")
    return name


def iceberg_rows(spark: Any, table: str, date: str = DATE) -> list[tuple]:
    df = spark.table(table).where(f"date = '{date}'")
    return sorted(tuple(r) for r in df.select("date", "carrier", "flights", "writer").collect())


def iceberg_write(spark: Any, table: str, data: list, token: int, gate: Gate | None = None,
                  run_key: str = DATE, **kwargs: Any) -> Any:
    df = frame(spark, data)
    return write_iceberg_fenced(gate.hold(df) if gate else df, table, run_key, token, role=ROLE,
                                **kwargs)


def test_iceberg_on_s3_zombie_refused_in_a_race_and_after_the_owner(
        spark: Any, table: str, s3: str, tmp_path: Any, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="neli_orchestrate.sinks.iceberg")
    iceberg_write(spark, table, rows("other-day", 1, OTHER_DATE), 1, run_key=OTHER_DATE)
    gate = Gate(tmp_path, "zombie")
    # allow_empty=True only skips the emptiness probe, which would run the held job early
    zombie = Background(lambda: iceberg_write(spark, table, rows("zombie", 3), ZOMBIE, gate,
                                              allow_empty=True))
    gate.wait_started(zombie)
    owner = iceberg_write(spark, table, rows("owner", 2), OWNER)
    gate.release()
    zombie.join()

    assert owner.committed
    assert ["commit of token 5 lost a race" in m for m in lost_races(caplog)] == [True]
    assert isinstance(zombie.error, StaleTokenError), zombie.error
    assert (zombie.error.token, zombie.error.committed) == (ZOMBIE, OWNER)
    assert iceberg_rows(spark, table) == sorted(rows("owner", 2))
    assert iceberg_rows(spark, table, OTHER_DATE) == sorted(rows("other-day", 1, OTHER_DATE))
    assert [t for t, _ in committed_tokens(spark, table, DATE, role=ROLE)] == [OWNER]
    snapshots = spark.sql(f"SELECT snapshot_id FROM {table}.snapshots").collect()

    # the owner committed first: the zombie is refused and no snapshot is added
    with pytest.raises(StaleTokenError) as raised:
        iceberg_write(spark, table, rows("zombie", 3), ZOMBIE)
    assert (raised.value.token, raised.value.committed) == (ZOMBIE, OWNER)
    assert iceberg_rows(spark, table) == sorted(rows("owner", 2))
    assert spark.sql(f"SELECT snapshot_id FROM {table}.snapshots").collect() == snapshots
    location = spark.sql(f"DESCRIBE TABLE EXTENDED {table}").where("col_name = 'Location'")
    assert location.collect()[0][1].startswith(f"s3a://{BUCKET}/warehouse/")
    name = table.rsplit(".", 1)[-1]
    assert any(k.endswith(".parquet") for k in keys(s3, f"warehouse/flights/{name}/data/"))
