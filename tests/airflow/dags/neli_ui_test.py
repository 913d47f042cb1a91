"""Test DAG of tests/airflow/test_ui.py: a gate and the stock task it fences (extra links)."""

from __future__ import annotations

import pendulum
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG

from neli_orchestrate.airflow import LeaderGateOperator

with DAG(
    dag_id="neli_ui_test",
    schedule=None,
    start_date=pendulum.datetime(2013, 1, 1, tz="UTC"),
    catchup=False,
) as dag:
    gate = LeaderGateOperator(task_id="gate", role="ui_daily", poke_interval=1,
                              acquire_timeout=20)
    job = BashOperator(task_id="job", bash_command="echo token $NELI_TOKEN")
    gate >> job
