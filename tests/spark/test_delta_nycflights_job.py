"""The example job with ``--sink delta`` under spark-submit, with the real Delta jars on --jars:
it writes the date's partition in a commit carrying its token. (One submit, ~1-2 min on a busy
machine: a stale token's refusal is covered in-process by test_delta_sink.py, and the job's
exit status 3 for ``StaleTokenError`` by test_nycflights_spark_submit.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from deltalake import DeltaTable
from test_nycflights_spark_submit import expected_performance, spark_submit_binary

from neli_orchestrate.spark import neli_spark_conf
from neli_orchestrate.spark.conf import local_spark_conf, spark_submit_env
from neli_orchestrate.spark.delta import delta_app_id
from neli_orchestrate.testing.table_jars import ensure_table_format_jars, spark_jars

JOB = Path(__file__).resolve().parents[2] / "dags" / "jobs" / "nycflights_daily.py"
DATE = "2013-02-08"
ROLE = "daily_flights"


def submit(table: Path, cache: Path, token: int) -> subprocess.CompletedProcess:
    conf = local_spark_conf() | neli_spark_conf(token, DATE, role=ROLE, deployment="us-east-1")
    conf["spark.databricks.delta.snapshotPartitions"] = "2"
    command = [str(spark_submit_binary()), "--master", "local[2]",
               "--jars", spark_jars(ensure_table_format_jars(), iceberg=False)]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    command += [str(JOB), "--date", DATE, "--output", str(table), "--cache-dir", str(cache),
                "--sink", "delta"]
    env = os.environ | spark_submit_env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300,
                          check=False)


def snapshot(table: Path) -> tuple[int, list[dict]]:
    delta = DeltaTable(str(table))
    rows = sorted(delta.to_pyarrow_table().to_pylist(), key=lambda r: (r["carrier"], r["origin"]))
    return delta.version(), rows


def test_job_writes_the_dates_delta_partition_under_its_token(tmp_path: Path) -> None:
    table, cache = tmp_path / "daily_performance", tmp_path / "cache"
    first = submit(table, cache, token=7)
    assert first.returncode == 0, first.stderr[-5000:]

    version, rows = snapshot(table)
    expected = expected_performance(DATE)
    assert {(r["carrier"], r["origin"]): r["flights"] for r in rows} == {
        key: values["flights"] for key, values in expected.items()
    }
    assert {str(r["date"]) for r in rows} == {DATE}
    assert DeltaTable(str(table)).transaction_version(delta_app_id(ROLE, DATE)) == 7
    commit_info = DeltaTable(str(table)).history(1)[0]
    assert json.loads(commit_info["userMetadata"])["neli.token"] == 7
    assert version == 0
