"""The Spark-less sinks on a local S3-compatible server (moto's server mode, from PyPI).

First the server is checked to honour the conditional writes the formats rely on (``If-None-Match:
*`` and ``If-Match`` answered with 412), and delta-rs is shown to write every log entry with
``If-None-Match: *`` (moto's request recorder): its commit protocol on S3 is the conditional put,
no locking provider. pyiceberg's commit is the SQL catalog's compare-and-swap (SQLite here); S3
holds only files with unique names. Then the fencing cases run there: a zombie that checked
before the table existed, held just before its commit, is refused and the other role's
partition survives.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from typing import Any

import boto3
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyiceberg.catalog.sql import SqlCatalog

from neli_orchestrate.errors import StaleTokenError
from neli_orchestrate.sinks import delta as delta_sink
from neli_orchestrate.sinks import iceberg as iceberg_sink

ROLE, OTHER_ROLE = "daily_flights", "hourly_flights"
DATE, OTHER_DATE = "2013-01-05", "2013-01-06"
ZOMBIE, OWNER = 9, 10


def rows(writer: str, n: int, date: str = DATE) -> pa.Table:
    return pa.table({"date": [date] * n, "carrier": [f"C{i}" for i in range(n)],
                     "writer": [writer] * n})


@pytest.fixture
def bucket(s3: str) -> str:
    name = f"lake-{uuid.uuid4().hex}"  # one per test: nothing carries over
    client(s3).create_bucket(Bucket=name)
    return name


def client(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test",
                        aws_secret_access_key="test", region_name="us-east-1")


def delta_options(endpoint: str) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}


def moto_api(endpoint: str, path: str, method: str = "POST") -> bytes:
    with urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/{path}",
                                                       method=method)) as response:
        return response.read()


def hold_once(monkeypatch: pytest.MonkeyPatch, module: Any, stage: str, run_first: Any) -> list:
    fired: list[str] = []

    def hook(reached: str, where: str) -> None:
        if reached == stage and not fired:
            fired.append(reached)
            run_first()

    monkeypatch.setattr(module, "_before_commit", hook)
    return fired


def test_the_server_honours_conditional_writes(s3: str, bucket: str) -> None:
    s3c = client(s3)
    s3c.put_object(Bucket=bucket, Key="k", Body=b"1", IfNoneMatch="*")
    with pytest.raises(s3c.exceptions.ClientError, match="PreconditionFailed"):
        s3c.put_object(Bucket=bucket, Key="k", Body=b"2", IfNoneMatch="*")
    with pytest.raises(s3c.exceptions.ClientError, match="PreconditionFailed"):
        s3c.put_object(Bucket=bucket, Key="k", Body=b"3", IfMatch='"not-the-etag"')
    etag = s3c.head_object(Bucket=bucket, Key="k")["ETag"]
    s3c.put_object(Bucket=bucket, Key="k", Body=b"4", IfMatch=etag)
    assert s3c.get_object(Bucket=bucket, Key="k")["Body"].read() == b"4"


def test_delta_rs_commits_each_log_entry_with_a_conditional_put(s3: str, bucket: str) -> None:
    uri = f"s3://{bucket}/daily"
    moto_api(s3, "recorder/reset-recording")
    moto_api(s3, "recorder/start-recording")
    try:
        delta_sink.write_deltalake_fenced(rows("owner", 2), uri, DATE, OWNER, role=ROLE,
                                          storage_options=delta_options(s3))
    finally:
        moto_api(s3, "recorder/stop-recording")
    log_puts = []
    for line in moto_api(s3, "recorder/download-recording", "GET").decode().splitlines():
        entry = json.loads(line)
        if entry.get("method") == "PUT" and "/daily/_delta_log/" in entry.get("url", ""):
            headers = {k.lower(): v for k, v in (entry.get("headers") or {}).items()}
            log_puts.append((entry["url"].rsplit("/", 1)[-1], headers.get("if-none-match")))
    # version 0 (the create) and version 1 (the data), each put only if absent
    assert log_puts == [("00000000000000000000.json", "*"), ("00000000000000000001.json", "*")]


@pytest.mark.parametrize("stage", ["create", "write"])
def test_delta_rs_zombie_that_checked_before_the_table_existed_is_refused_on_s3(
        s3: str, bucket: str, monkeypatch: pytest.MonkeyPatch, stage: str) -> None:
    uri, options = f"s3://{bucket}/daily", delta_options(s3)

    def write(data: pa.Table, token: int, role: str = ROLE, run_key: str = DATE) -> Any:
        return delta_sink.write_deltalake_fenced(data, uri, run_key, token, role=role,
                                                 storage_options=options)

    def owner_and_other_role() -> None:
        write(rows("owner", 2), OWNER)
        write(rows("other-role", 2, OTHER_DATE), 3, role=OTHER_ROLE, run_key=OTHER_DATE)

    fired = hold_once(monkeypatch, delta_sink, stage, owner_and_other_role)
    with pytest.raises(StaleTokenError) as raised:
        write(rows("zombie", 3), ZOMBIE)

    assert fired == [stage]
    assert (raised.value.token, raised.value.committed) == (ZOMBIE, OWNER)
    table = DeltaTable(uri, storage_options=options)
    assert sorted((r["date"], r["writer"]) for r in table.to_pyarrow_table().to_pylist()) == [
        (DATE, "owner"), (DATE, "owner"), (OTHER_DATE, "other-role"), (OTHER_DATE, "other-role")]
    assert table.transaction_version(delta_sink.delta_app_id(ROLE, DATE)) == OWNER


def test_pyiceberg_zombie_held_before_its_commit_is_refused_on_s3(
        s3: str, bucket: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    catalog = SqlCatalog("lake", uri=f"sqlite:///{tmp_path}/catalog.db",
                         warehouse=f"s3://{bucket}/wh", **{
                             "s3.endpoint": s3, "s3.access-key-id": "test",
                             "s3.secret-access-key": "test", "s3.region": "us-east-1"})
    catalog.create_namespace("flights")
    catalog.create_table("flights.daily", schema=rows("x", 1).schema)

    def write(data: pa.Table, token: int, role: str = ROLE, run_key: str = DATE) -> Any:
        return iceberg_sink.write_pyiceberg_fenced(data, catalog, "flights.daily", run_key,
                                                   token, role=role)

    def owner_and_other_role() -> None:
        write(rows("owner", 2), OWNER)
        write(rows("other-role", 2, OTHER_DATE), 3, role=OTHER_ROLE, run_key=OTHER_DATE)

    fired = hold_once(monkeypatch, iceberg_sink, "write", owner_and_other_role)
    with pytest.raises(StaleTokenError) as raised:
        write(rows("zombie", 3), ZOMBIE)

    assert fired == ["write"]
    assert (raised.value.token, raised.value.committed) == (ZOMBIE, OWNER)
    data = catalog.load_table("flights.daily").scan().to_arrow().to_pylist()
    assert sorted((r["date"], r["writer"]) for r in data) == [
        (DATE, "owner"), (DATE, "owner"), (OTHER_DATE, "other-role"), (OTHER_DATE, "other-role")]
    keys = [o["Key"] for o in client(s3).list_objects_v2(Bucket=bucket)["Contents"]]
    assert any(key.endswith(".parquet") for key in keys)  # the data did go to S3
