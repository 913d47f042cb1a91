"""Test DAG: a stock spark-submit behind the gate that runs until it is fenced (test_regions.py).

The job writes ``<fence_started>/<token>.started`` once its Spark tasks run, then keeps them
busy for ten minutes. Retries are allowed, so a FAILED task with one try proves the fence
failed it without retry.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG

from neli_orchestrate.airflow import LeaderGateOperator
from neli_orchestrate.spark.conf import local_spark_conf, spark_submit_env

with DAG(
    dag_id="neli_fence_test",
    schedule=None,
    start_date=pendulum.datetime(2013, 1, 1, tz="UTC"),
    catchup=False,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=1)},
) as dag:
    claim_run = LeaderGateOperator(
        task_id="claim_run",
        role="fence_test",
        poke_interval=2,
        acquire_timeout=10,
        run_acquire_timeout=120,
    )
    slow_job = SparkSubmitOperator(
        task_id="slow_job",
        conn_id="spark_default",
        application=str(Path(__file__).resolve().parent / "jobs" / "slow_job.py"),
        conf=local_spark_conf(),
        env_vars=spark_submit_env(),
        application_args=["--started", "{{ var.value.fence_started }}", "--seconds", "600"],
    )
    claim_run >> slow_job
