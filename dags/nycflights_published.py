"""nycflights_published: scheduled on the daily table; runs in every region, exports once.

Deploy this file in every region beside ``nycflights_daily.py``. Whenever a date of
``nycflights_daily`` completes, the asset ``nycflights_daily_performance`` gets an event in
every region: from the Spark task in the region that ran it, and from that region's gate by
proxy in the others. Each event's ``extra["neli"]`` names the deployment, role, run key and
token of the run. So in every region:

- ``where_it_ran`` (a per-region task) logs which deployment computed the data, with its token;
- ``claim_export`` (a gate with the default run key) derives the run key from that identity,
  ``nycflights_published/after/<role>/<run key>@<token>``, the same in every region, so
  ``export`` (the singleton) runs in one region only, although each region's run id differs.
"""

from __future__ import annotations

import logging
from typing import Any

import pendulum
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG, Asset, task

from neli_orchestrate.airflow import LeaderGateOperator

NYCFLIGHTS_DAILY = Asset("nycflights_daily_performance")  # declared by nycflights_daily

with DAG(
    dag_id="nycflights_published",
    description="Follows each published date of nycflights_daily in every region",
    schedule=[NYCFLIGHTS_DAILY],
    start_date=pendulum.datetime(2013, 1, 1, tz="UTC"),
    catchup=False,
    tags=["neli", "example", "assets"],
) as dag:

    @task
    def where_it_ran(triggering_asset_events: Any = None) -> list[dict]:
        """Per region: say which deployment computed the data this run follows."""
        runs = [
            event.extra.get("neli", {})
            for events in (triggering_asset_events or {}).values()
            for event in events
        ]
        for run in runs:
            logging.getLogger("airflow.task").info(
                "nycflights_daily run %s (role %s) was computed by deployment %s with token %s%s",
                run.get("run_key"),
                run.get("role"),
                run.get("deployment"),
                run.get("token"),
                " (event by proxy)" if run.get("proxy") else "",
            )
        return runs

    claim_export = LeaderGateOperator(
        task_id="claim_export",
        role="nycflights_published",
        # default run key: derived from the triggering singleton run, equal in every region
        poke_interval=5,
        acquire_timeout=10,
        timeout=3600,
    )
    export = BashOperator(
        task_id="export",
        bash_command='echo "export after $NELI_RUN_KEY with fencing token $NELI_TOKEN"',
    )
    where_it_ran()
    claim_export >> export
