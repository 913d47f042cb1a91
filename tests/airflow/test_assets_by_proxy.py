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

import contextlib
import json
import sqlite3
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from integration.regions.regions import AirflowRegion, RegionConfig, neli_connection
from neli_orchestrate.airflow.hooks.neli import NeliHook
from neli_orchestrate.decision import skipped_by_work
from neli_orchestrate.errors import WorkSkipped
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


def skip_itself(run: Any) -> None:
    """Work that finds nothing to do: COMPLETED, "skipped by the task" (e.g. exit code 99)."""
    raise WorkSkipped("exit code 99: nothing to do today")


def seed_completed_elsewhere(connection: dict[str, Any], claim_now: Any,
                             work: Any = lambda run: None) -> Any:
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
        with contextlib.suppress(WorkSkipped):  # recorded COMPLETED, then raised again
            other.execute(ROLE, RUN_KEY, reservation.token, work)
        done = other.status(ROLE, RUN_KEY)
    assert (done.state, done.deployment) == (RunState.COMPLETED, OTHER)
    return done


def region_with(tmp_path: Path, bootstrap: str, namespace: str, gate_args: str,
                producer: str | None = None, **extra: Any) -> AirflowRegion:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "proxy_producer.py").write_text(
        textwrap.dedent(producer or PRODUCER.format(gate_args=gate_args)))
    (dags / "proxy_consumer.py").write_text(textwrap.dedent(CONSUMER))
    settings = tmp_path / "local_settings"
    settings.mkdir()
    # The provider's cluster policy, as test_regions registers it for a checkout.
    (settings / "airflow_local_settings.py").write_text(
        "from neli_orchestrate.airflow.policy import dag_policy  # noqa: F401\n"
    )
    config = RegionConfig(
        HERE,
        connections={"neli_default": connection_for(bootstrap, HERE, namespace, **extra)},
        connection_source="environment",
        env={"PYTHONPATH": f"{settings}:{REPO}"},
    )
    region = AirflowRegion(tmp_path / "regions", dags, config)
    region.prepare()  # migrated database, both DAGs serialized (unpaused)
    return region


def connection_for(bootstrap: str, deployment: str, namespace: str, **extra: Any,
                   ) -> dict[str, Any]:
    return neli_connection(
        bootstrap,
        deployment,
        namespace=namespace,
        profile="fast",
        session_timeout=6,
        heartbeat_timeout=2,
        acquire_timeout=10,
        **extra,
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


@pytest.mark.timeout(600)
def test_a_run_whose_work_skipped_itself_elsewhere_is_a_skip_here_with_no_event_by_proxy(
    warm_broker: str, tmp_path: Path, claim_now: Any
) -> None:
    namespace = f"proxy{uuid.uuid4().hex[:8]}"
    done = seed_completed_elsewhere(connection_for(warm_broker, OTHER, namespace), claim_now,
                                    work=skip_itself)
    assert skipped_by_work(done), done
    region = region_with(tmp_path, warm_broker, namespace, gate_args="",
                         region_urls={OTHER: OTHER_UI})

    output = run_producer(region)

    assert states(region) == {
        "claim_run": "success",
        "job": "skipped",  # the singleton: its work skipped itself in the other region
        "cleanup": "skipped",
        "per_region": "success",  # none_failed: runs in every region
    }
    # The work produced nothing there, so nothing is emitted here: no asset event by proxy,
    # and the DAG scheduled on the asset is not queued (the region that ran it queues none).
    assert asset_events(region) == []
    assert consumer_queued(region) == 0
    assert f"already skipped by the task in deployment '{OTHER}'" in output, output[-5000:]
    assert "without asset events by proxy" in output, output[-5000:]
    # what the "Ran in region" extra link and the gate's log say
    recorded = xcom(region, "claim_run", "neli_done")
    assert (recorded["deployment"], recorded["token"], recorded["skipped_by_task"]) == (
        OTHER, done.token, True)
    assert recorded["reason"].startswith("skipped by the task")
    assert f"Skipped by the task in deployment '{OTHER}' with token {done.token}: " \
        f"{OTHER_UI}/neli/ran?" in output, output[-5000:]


# The take-over case: this region's gate claimed the date, its job's first try failed, and the
# other region took the run over and completed it before the retry. The job's retry waits (in
# pre_execute, before the fenced execution) until the other region has completed the run.
RETRY_PRODUCER = """
import time
from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG, Asset
from neli_orchestrate.airflow.operators.gate import LeaderGateOperator

WORK, TAKEN_OVER = Path({work!r}), Path({taken_over!r})


def after_the_take_over(context):
    if context["ti"].try_number < 2:
        return
    deadline = time.monotonic() + 240
    while not TAKEN_OVER.exists():
        assert time.monotonic() < deadline, "the other region never completed the run"
        time.sleep(0.2)


with DAG("proxy_producer", schedule="@daily", start_date=pendulum.datetime(2013, 1, 1),
         catchup=False) as dag:
    gate = LeaderGateOperator(task_id="claim_run", role="proxy_producer",
                              singleton_tasks=["cleanup"], poke_interval=1, timeout=120)
    job = BashOperator(task_id="job", outlets=[Asset("proxy_table")],
                       bash_command="echo {{{{ ti.try_number }}}} >> {work} && exit 1",
                       retries=1, retry_delay=timedelta(seconds=0),
                       pre_execute=after_the_take_over)
    gate >> job >> BashOperator(task_id="per_region", bash_command="echo every region",
                                trigger_rule="none_failed")
    job >> BashOperator(task_id="cleanup", bash_command="echo cleanup", trigger_rule="all_done")
"""

OTHER_UI = "http://airflow.eu-west-1.invalid:8080"


def take_over_when_failed_here(connection: dict[str, Any], claim_now: Any, flag: Path,
                               errors: list[BaseException],
                               work: Any = lambda run: None) -> None:
    """The other region: once this region's first try FAILED, take the run over, complete it,
    and let this region's retry go on (``flag``)."""
    import time

    from airflow.sdk import Connection

    conn = Connection(conn_id="other", conn_type="neli", host=connection["host"],
                      extra=json.dumps(connection["extra"]))
    try:
        with NeliHook("other", connection=conn).get_singleton() as other:
            deadline = time.monotonic() + 240
            while True:
                record = other.status(ROLE, RUN_KEY)
                if record is not None and record.state is RunState.FAILED:
                    break
                assert time.monotonic() < deadline, f"this region's try never failed: {record}"
                time.sleep(0.3)
            assert record.deployment == HERE, record
            reservation = claim_now(other, ROLE, RUN_KEY)  # after this region's retry window
            with contextlib.suppress(WorkSkipped):
                other.execute(ROLE, RUN_KEY, reservation.token, work)
        flag.write_text(str(reservation.token))
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)
        flag.write_text("failed")


def xcom(region: AirflowRegion, task_id: str, key: str) -> Any:
    rows = query(region, "SELECT value FROM xcom WHERE dag_id = 'proxy_producer' AND task_id = ?"
                 " AND key = ?", task_id, key)
    if not rows:
        return None
    value = json.loads(rows[0][0])
    return json.loads(value) if isinstance(value, str) else value


@pytest.mark.timeout(600)
def test_a_retry_that_finds_the_run_taken_over_and_completed_elsewhere_emits_by_proxy(
    warm_broker: str, tmp_path: Path, claim_now: Any
) -> None:
    import threading

    namespace = f"proxy{uuid.uuid4().hex[:8]}"
    work, flag = tmp_path / "work.log", tmp_path / "taken_over"
    producer = RETRY_PRODUCER.format(work=str(work), taken_over=str(flag))
    region = region_with(tmp_path, warm_broker, namespace, gate_args="", producer=producer,
                         handoff_timeout=3, region_urls={OTHER: OTHER_UI})
    errors: list[BaseException] = []
    other = threading.Thread(target=take_over_when_failed_here, daemon=True, args=(
        connection_for(warm_broker, OTHER, namespace, handoff_timeout=3), claim_now, flag,
        errors))
    other.start()

    output = run_producer(region)
    other.join(60)

    assert not errors, errors
    token = int(flag.read_text())
    assert work.read_text().split() == ["1"], output[-5000:]  # the retry ran no work
    assert states(region) == {
        "claim_run": "success",  # claimed here
        "job": "success",  # the retry: succeeded without running the work
        "cleanup": "skipped",  # part of the singleton, skipped by the retry (would run: all_done)
        "per_region": "success",  # none_failed: runs in every region
    }
    line = (f"was completed by deployment '{OTHER}' with token {token} after an earlier try "
            "here; this try did not run the work")
    assert line in output, output[-5000:]
    [(source, asset, extra)] = asset_events(region)
    assert (source, asset) == ("job", "proxy_table")
    assert extra["neli"] == {
        "deployment": OTHER,
        "role": ROLE,
        "run_key": RUN_KEY,
        "token": token,
        "proxy": True,
        "recorded_by": HERE,
        "completed_at": extra["neli"]["completed_at"],
    }
    assert consumer_queued(region) == 1  # the asset-scheduled DAG runs here too
    # what the "Ran in region" extra link of job and cleanup reads
    done = xcom(region, "job", "neli_done")
    assert (done["deployment"], done["token"], done["skipped"]) == (OTHER, token, ["cleanup"])
    assert done["url"].startswith(f"{OTHER_UI}/neli/ran?") and f"token={token}" in done["url"]


@pytest.mark.timeout(600)
def test_a_retry_that_finds_the_run_taken_over_and_skipped_by_the_task_is_a_skip_too(
    warm_broker: str, tmp_path: Path, claim_now: Any
) -> None:
    import threading

    namespace = f"proxy{uuid.uuid4().hex[:8]}"
    work, flag = tmp_path / "work.log", tmp_path / "taken_over"
    producer = RETRY_PRODUCER.format(work=str(work), taken_over=str(flag))
    region = region_with(tmp_path, warm_broker, namespace, gate_args="", producer=producer,
                         handoff_timeout=3, region_urls={OTHER: OTHER_UI})
    errors: list[BaseException] = []
    other = threading.Thread(target=take_over_when_failed_here, daemon=True, args=(
        connection_for(warm_broker, OTHER, namespace, handoff_timeout=3), claim_now, flag,
        errors, skip_itself))
    other.start()

    output = run_producer(region)
    other.join(60)

    assert not errors, errors
    token = int(flag.read_text())
    assert work.read_text().split() == ["1"], output[-5000:]  # the retry ran no work
    assert asset_events(region) == []  # no event by proxy of a run that produced nothing
    assert consumer_queued(region) == 0
    assert states(region)["job"] == "skipped", (states(region), output[-5000:])
    assert states(region)["per_region"] == "success"
    assert (f"was skipped by the task in deployment '{OTHER}' (token {token}) after an earlier "
            "try here") in output, output[-5000:]
    done = xcom(region, "job", "neli_done")
    assert (done["deployment"], done["token"], done["skipped_by_task"]) == (OTHER, token, True)
    assert done["url"].startswith(f"{OTHER_UI}/neli/ran?")


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
