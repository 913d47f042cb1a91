"""conn_probe: a task reads a connection (conf ``conn_id``) and writes what it saw to conf ``out``.

Proves that a connection created in a region's metadata database (REST API or ``airflow
connections add``, extra encrypted with the region's Fernet key) is readable by its tasks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pendulum
from airflow.sdk import DAG, BaseHook, task

with DAG(
    dag_id="conn_probe",
    schedule=None,
    start_date=pendulum.datetime(2013, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=8,
    tags=["neli", "test"],
):

    @task(retries=0)
    def read_connection(dag_run=None) -> None:
        conf = dag_run.conf
        conn = BaseHook.get_connection(conf["conn_id"])
        seen = {
            "conn_id": conf["conn_id"],
            "conn_type": conn.conn_type,
            "host": conn.host,
            "extra": conn.extra_dejson,
        }
        Path(conf["out"]).write_text(json.dumps(seen))

    read_connection()
