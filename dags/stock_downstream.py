"""stock_downstream: a LeaderGateOperator upstream of a stock operator, as users write it.

    gate >> job

``job`` is a plain BashOperator (a SparkSubmitOperator or a ``@task`` function works the same
way). Being directly downstream of the gate, it runs fenced: it re-verifies the gate's claim,
records RUNNING, runs under the watchdog with the fencing token in ``$NELI_TOKEN``, and records
COMPLETED (or FAILED). Every region runs this file; each date runs once.
"""

from __future__ import annotations

import pendulum
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG

from neli_orchestrate.airflow import LeaderGateOperator

with DAG(
    dag_id="stock_downstream",
    schedule=None,
    start_date=pendulum.datetime(2013, 1, 1, tz="UTC"),
    catchup=False,
    tags=["neli", "example"],
) as dag:
    gate = LeaderGateOperator(task_id="gate", role="stock_downstream", run_key="stock/{{ ds }}")
    job = BashOperator(
        task_id="job", bash_command='echo "stock job ran with fencing token $NELI_TOKEN"'
    )
    gate >> job
