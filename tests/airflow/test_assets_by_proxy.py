"""What a region sees of a singleton run another region completed, in a real Airflow 3.3.

One real deployment (its own AIRFLOW_HOME and SQLite database; ``airflow dags test`` runs the
DAG through the real task runner and execution API) and the real broker. The ledger is seeded
first, through the real broker, with the run COMPLETED by another deployment ("eu-west-1").
Then, in this region ("us-east-1"):

- the gate skips the singleton (its fenced child and the task marked as part of it), and the
  per-region task after it runs;
- the singleton's asset gets an event by proxy, whose extra names the deployment that ran it,
  role, run key and token, and the DAG scheduled on that asset is queued to run here.
"""

from __future__ import annotations

import json
import sqlite3
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from integration.regions.regions import AirflowRegion, RegionConfig, neli_connection
from neli_orchestrate.airflow.hooks.neli import NeliHook
from neli_orchestrate.ledger.record import RunState

pytestmark = [pytest.mark.airflow, pytest.mark.kafka]

REPO = Path(__file__).resolve().parents[2]
HERE, OTHER = "us-east-1", "eu-west-1"
ROLE = "proxy_producer"
RUN_KEY = "proxy_producer/2013-01-05T00:00:00+00:00"

PRODUCER = """
import pendulum
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG, Asset
from neli_orchestrate.airflow import LeaderGateOperator

with DAG("proxy_producer", schedule="@daily", start_date=pendulum.datetime(2013, 1, 1),
         catchup=False) as dag:
    gate = LeaderGateOperator(task_id="claim_run", role="proxy_producer",
                              singleton_tasks=["cleanup"]{gate_args}, poke_interval=1, timeout=120)
    job = BashOperator(task_id="job", bash_command="echo ran", outlets=[Asset("proxy_table")])
    gate >> job >> BashOperator(task_id="per_region", bash_command="echo every region",
                                trigger_rule="none_failed")
    job >> BashOperator(task_id="cleanup", bash_command="echo cleanup", trigger_rule="all_done")
"""

CONSUMER = """
import pendulum
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG, Asset

with DAG("proxy_consumer", schedule=[Asset("proxy_table")],
         start_date=pendulum.datetime(2013, 1, 1), catchup=False) as dag:
    BashOperator(task_id="consume", bash_command="echo consumed")
"""


def seed_completed_elsewhere(connection: dict[str, Any], claim_now: Any) -> Any:
    """The other region runs the date to COMPLETED through the real ledger."""
    from airflow.sdk import Connection

    conn = Connection(
        conn_id="other",
        conn_type="neli",
        host=connection["host"],
        extra=json.dumps(connection["extra"]),
    )
    with NeliHook("other", connection=conn).get_singleton() as other:
        reservation = claim_now(other, ROLE, RUN_KEY)
        other.execute(ROLE, RUN_KEY, reservation.token, lambda run: None)
        done = other.status(ROLE, RUN_KEY)
    assert (done.state, done.deployment) == (RunState.COMPLETED, OTHER)
    return done


def region_with(tmp_path: Path, bootstrap: str, namespace: str, gate_args: str) -> AirflowRegion:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "proxy_producer.py").write_text(textwrap.dedent(PRODUCER.format(gate_args=gate_args)))
    (dags / "proxy_consumer.py").write_text(textwrap.dedent(CONSUMER))
    settings = tmp_path / "local_settings"
    settings.mkdir()
    # The provider's cluster policy, as test_regions registers it for a checkout.
    (settings / "airflow_local_settings.py").write_text(
        "from neli_orchestrate.airflow.policy import dag_policy  # noqa: F401\n"
    )
    config = RegionConfig(
        HERE,
        connections={"neli_default": connection_for(bootstrap, HERE, namespace)},
        connection_source="environment",
        env={"PYTHONPATH": f"{settings}:{REPO}"},
    )
    region = AirflowRegion(tmp_path / "regions", dags, config)
    region.prepare()  # migrated database, both DAGs serialized (unpaused)
    return region


def connection_for(bootstrap: str, deployment: str, namespace: str) -> dict[str, Any]:
    return neli_connection(
        bootstrap,
        deployment,
        namespace=namespace,
        profile="fast",
        session_timeout=6,
        heartbeat_timeout=2,
        acquire_timeout=10,
    )


def query(region: AirflowRegion, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(region.database) as db:
        return list(db.execute(sql, args))


def run_producer(region: AirflowRegion) -> str:
    result = region.cli("dags", "test", "proxy_producer", "2013-01-05", timeout=300)
    assert result.returncode == 0, result.stdout[-5000:]
    return result.stdout


def states(region: AirflowRegion) -> dict[str, str]:
    return dict(
        query(
            region,
            "SELECT task_id, state FROM task_instance WHERE dag_id = 'proxy_producer'",
        )
    )


def asset_events(region: AirflowRegion) -> list[tuple[str, str, dict[str, Any]]]:
    rows = query(
        region,
        "SELECT e.source_task_id, a.name, e.extra FROM asset_event e "
        "JOIN asset a ON a.id = e.asset_id ORDER BY e.id",
    )
    return [(task, name, json.loads(extra or "{}")) for task, name, extra in rows]


def consumer_queued(region: AirflowRegion) -> int:
    return query(
        region,
        "SELECT COUNT(*) FROM asset_dag_run_queue WHERE target_dag_id = 'proxy_consumer'",
    )[0][0]


@pytest.mark.timeout(600)
def test_region_that_skips_gets_the_asset_event_by_proxy_and_runs_its_per_region_tasks(
    warm_broker: str, tmp_path: Path, claim_now: Any
) -> None:
    namespace = f"proxy{uuid.uuid4().hex[:8]}"
    done = seed_completed_elsewhere(connection_for(warm_broker, OTHER, namespace), claim_now)
    region = region_with(tmp_path, warm_broker, namespace, gate_args="")

    output = run_producer(region)

    assert states(region) == {
        "claim_run": "success",
        "job": "skipped",  # the singleton: done elsewhere
        "cleanup": "skipped",  # marked as part of the singleton (would run: all_done)
        "per_region": "success",  # none_failed: runs in every region
    }
    assert f"already completed by deployment '{OTHER}'" in output, output[-5000:]
    [(source, asset, extra)] = asset_events(region)
    assert (source, asset) == ("claim_run", "proxy_table")
    assert extra["neli"] == {
        "deployment": OTHER,
        "role": ROLE,
        "run_key": RUN_KEY,
        "token": done.token,
        "proxy": True,
        "recorded_by": HERE,
        "completed_at": extra["neli"]["completed_at"],
    }
    assert consumer_queued(region) == 1  # the asset-scheduled DAG runs here too


@pytest.mark.timeout(600)
def test_proxy_asset_events_off_the_region_records_no_event(
    warm_broker: str, tmp_path: Path, claim_now: Any
) -> None:
    namespace = f"proxy{uuid.uuid4().hex[:8]}"
    seed_completed_elsewhere(connection_for(warm_broker, OTHER, namespace), claim_now)
    region = region_with(tmp_path, warm_broker, namespace, gate_args=", proxy_asset_events=False")

    run_producer(region)

    assert states(region)["job"] == "skipped"
    assert asset_events(region) == []
    assert consumer_queued(region) == 0


# Two gates' first events by proxy through the same alias, in the same instant, as the API
# server registers them (AssetManager.register_asset_change in two sessions): both find the
# alias unlinked; a barrier holds each session at its first flush until both got there.
RACE = """
import json, sys, threading
from sqlalchemy import event, select
from sqlalchemy.orm import configure_mappers, joinedload
from airflow.assets.manager import asset_manager
from airflow.models.asset import AssetModel
from airflow.utils.session import create_session
from neli_orchestrate.airflow.plugins.alias_links import ensure_links

configure_mappers()  # AssetModel.aliases is a backref of AssetAliasModel
ALIAS, ASSET = "neli-proxy/proxy_producer/claim_run", "proxy_table"
fixed = sys.argv[1] == "fixed"
barrier = threading.Barrier(2, timeout=60)
errors, created = [], []

def emit(n):
    try:
        with create_session() as session:
            held = []
            @event.listens_for(session, "before_flush")
            def wait(s, *_):
                if not held and (s.new or s.dirty):
                    held.append(True)
                    barrier.wait()
            if fixed:
                # what ProxyAliasLinks does before Airflow's handler runs
                uri = session.scalar(select(AssetModel.uri).where(AssetModel.name == ASSET))
                created.append(ensure_links([(ALIAS, ASSET, uri)]))
            asset = session.scalar(select(AssetModel).where(AssetModel.name == ASSET)
                                   .options(joinedload(AssetModel.aliases)))
            asset_manager.register_asset_change(
                task_instance=None, asset=asset, extra={"n": n},
                source_alias_names=[ALIAS], session=session)
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")

threads = [threading.Thread(target=emit, args=(n,)) for n in (1, 2)]
for t in threads: t.start()
for t in threads: t.join(120)
with create_session() as session:
    events = session.scalar(select(AssetModel).where(AssetModel.name == ASSET)
                            .options(joinedload(AssetModel.aliases)))
    aliases = [a.name for a in events.aliases]
print(json.dumps({"errors": errors, "created": created, "aliases": aliases}))
"""


def race(region: AirflowRegion, mode: str) -> dict[str, Any]:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", RACE, mode], env=region.environ(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-5000:]
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


@pytest.mark.timeout(600)
def test_two_first_events_by_proxy_at_once_race_in_airflow_and_the_links_made_first_fix_it(
    tmp_path: Path,
) -> None:
    import shutil

    region = region_with(tmp_path, "127.0.0.1:9", "race", gate_args="")
    fresh = tmp_path / "fresh.db"
    shutil.copyfile(region.database, fresh)  # the DAGs serialized, alias and asset not linked
    broken = race(region, "race")
    # Airflow 3.3 alone: one of the two registrations fails on the alias-asset link
    assert len(broken["errors"]) == 1, broken
    assert "IntegrityError" in broken["errors"][0] and "asset_alias_asset" in broken["errors"][0]

    shutil.copyfile(fresh, region.database)
    fixed = race(region, "fixed")
    assert fixed["errors"] == [], fixed
    assert sorted(fixed["created"]) == [0, 1]  # one request linked them, the other found it
    assert fixed["aliases"] == ["neli-proxy/proxy_producer/claim_run"]
