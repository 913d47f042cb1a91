"""Each row of the decision table, through LeaderGateOperator, against the real Kafka ledger.

Deployment A ("us-east-1") runs the gate; deployment B ("eu-west-1") is another region acting
on the same run through the singleton layer. The gate runs in-process with a recording task
instance (the real task supervisor is exercised in test_regions.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlencode

import pendulum
import pytest
import structlog
from airflow.providers.standard.operators.bash import BashOperator
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Asset, AssetAlias
from airflow.sdk.exceptions import (
    AirflowFailException,
    AirflowRescheduleException,
    DownstreamTasksSkipped,
    TaskDeferred,
)
from airflow.sdk.execution_time.context import OutletEventAccessors

from neli_orchestrate.airflow.assets import EXTRA_KEY, proxy_alias_name
from neli_orchestrate.airflow.claims import DONE_ELSEWHERE_XCOM_KEY
from neli_orchestrate.airflow.hooks.neli import NeliHook
from neli_orchestrate.airflow.operators.gate import LeaderGateOperator
from neli_orchestrate.airflow.triggers.leader import NeliLeadershipTrigger
from neli_orchestrate.ledger.record import RunState

pytestmark = [pytest.mark.airflow, pytest.mark.kafka]

A, B = "us-east-1", "eu-west-1"
ROLE = "daily_flights"
DAG_ID = "gate_rows"
LOGICAL = pendulum.datetime(2013, 1, 5, tz="UTC")
RUN_KEY = f"{DAG_ID}/{LOGICAL.isoformat()}"


class RecordingTI:
    """The slice of a task instance the gate uses: XCom pushes and reschedule bookkeeping."""

    map_index = -1
    try_number = 1

    def __init__(self) -> None:
        self.xcom: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = value

    def get_first_reschedule_date(self, context: Any) -> None:
        return None


DAILY = Asset("daily_flights_table", uri="file:///tmp/neli/daily_flights")


def gate_for(conn_id: str, **kwargs: Any) -> LeaderGateOperator:
    kwargs.setdefault("poke_interval", 0.5)
    kwargs.setdefault("timeout", 60)
    with DAG(DAG_ID, schedule=None, start_date=LOGICAL):
        gate = LeaderGateOperator(task_id="claim_run", role=ROLE, neli_conn_id=conn_id, **kwargs)
        job = BashOperator(task_id="spark_job", bash_command="exit 1", outlets=[DAILY])
        gate >> job >> EmptyOperator(task_id="report", trigger_rule="none_failed")
        job >> EmptyOperator(task_id="cleanup", trigger_rule="all_done")
    return gate


def run_gate(
    gate: LeaderGateOperator,
    method: str = "execute",
    ti: RecordingTI | None = None,
    context: dict[str, Any] | None = None,
    **kwargs: Any,
) -> tuple[Any, RecordingTI]:
    ti = ti or RecordingTI()
    context = {
        "dag": gate.dag,
        "ti": ti,
        "task_instance": ti,
        "logical_date": LOGICAL,
        "ts": LOGICAL.isoformat(),
        "run_id": "manual__2013-01-05",
        **(context or {}),
    }
    gate.render_template_fields(context)
    return getattr(gate, method)(context, **kwargs), ti


def complete_elsewhere(other: Any, claim_now: Any, run_key: str = RUN_KEY) -> Any:
    """Deployment B runs the run to COMPLETED through the real ledger; returns the record."""
    reservation = claim_now(other, ROLE, run_key)
    other.execute(ROLE, run_key, reservation.token, lambda run: None)
    done = other.status(ROLE, run_key)
    assert (done.state, done.deployment) == (RunState.COMPLETED, B)
    return done


def proxy_events(outlet_events: OutletEventAccessors) -> list[dict[str, Any]]:
    """What the task runner would send as outlet events for the gate (alias events)."""
    return [
        {"alias": event.source_alias_name, "asset": event.dest_asset_key.name,
         "extra": event.extra}
        for accessor in outlet_events._dict.values()
        for event in accessor.asset_alias_events
    ]


@pytest.fixture
def conns(neli_env) -> dict[str, str]:
    return {A: neli_env(A), B: neli_env(B)}


@pytest.fixture
def other(conns):
    """Deployment B's singleton."""
    with NeliHook(conns[B]).get_singleton() as singleton:
        yield singleton


def ledger(conns) -> Any:
    with NeliHook(conns[A]).get_singleton() as singleton:
        return singleton.status(ROLE, RUN_KEY)


def messages(logs: list[dict[str, Any]]) -> str:
    out = []
    for entry in logs:
        args = entry.get("positional_args")
        out.append(entry["event"] % args if args else entry["event"])
    return "\n".join(out)


def test_no_record_the_gate_claims_the_run_and_pushes_the_token(conns) -> None:
    claim, ti = run_gate(gate_for(conns[A]))
    record = ledger(conns)
    assert claim == {"token": record.token, "run_key": RUN_KEY, "role": ROLE, "deployment": A}
    assert (record.state, record.deployment) == (RunState.CLAIMED, A)
    assert DONE_ELSEWHERE_XCOM_KEY not in ti.xcom


def test_completed_elsewhere_the_gate_skips_only_the_singleton_and_says_where(
    conns, other, claim_now
) -> None:
    done = complete_elsewhere(other, claim_now)

    ti = RecordingTI()
    with structlog.testing.capture_logs() as logs:
        with pytest.raises(DownstreamTasksSkipped) as skipped:
            run_gate(gate_for(conns[A]), ti=ti)
    # only the fenced child: report (none_failed) and cleanup (all_done) run per trigger rule
    assert sorted(skipped.value.tasks) == ["spark_job"]
    text = messages(logs)
    assert f"already completed by deployment '{B}' at " in text
    assert f"(token {done.token})" in text
    # the gate's XCom says what it found (the UI shows it), and pushes no claim
    found = ti.xcom[DONE_ELSEWHERE_XCOM_KEY]
    assert (found["state"], found["deployment"], found["token"]) == ("COMPLETED", B, done.token)
    assert "return_value" not in ti.xcom
    assert ledger(conns) == done  # skipping wrote nothing


def test_tasks_marked_as_part_of_the_singleton_are_skipped_with_it(
    conns, other, claim_now
) -> None:
    complete_elsewhere(other, claim_now)
    with pytest.raises(DownstreamTasksSkipped) as skipped:
        run_gate(gate_for(conns[A], singleton_tasks=["cleanup"]))
    assert sorted(skipped.value.tasks) == ["cleanup", "spark_job"]


def test_singleton_tasks_must_name_tasks_after_the_gate(conns) -> None:
    with pytest.raises(AirflowFailException, match=r"\[.nope.\] are not downstream"):
        run_gate(gate_for(conns[A], singleton_tasks=["nope"]))
    with pytest.raises(ValueError, match="not one string"):
        gate_for(conns[A], singleton_tasks="cleanup")


def test_completed_elsewhere_the_singletons_outlets_get_an_asset_event_by_proxy(
    conns, other, claim_now
) -> None:
    done = complete_elsewhere(other, claim_now)
    gate = gate_for(conns[A])
    alias = proxy_alias_name(DAG_ID, "claim_run")
    assert AssetAlias(alias) in gate.outlets
    outlet_events = OutletEventAccessors()
    with pytest.raises(DownstreamTasksSkipped):
        run_gate(gate, context={"outlet_events": outlet_events})
    (event,) = proxy_events(outlet_events)
    assert (event["alias"], event["asset"]) == (alias, DAILY.name)
    neli = event["extra"][EXTRA_KEY]
    assert neli["deployment"] == B and neli["token"] == done.token
    assert (neli["role"], neli["run_key"], neli["proxy"], neli["recorded_by"]) == (
        ROLE,
        RUN_KEY,
        True,
        A,
    )


def test_completed_elsewhere_the_gate_links_to_the_region_that_ran_it(
    neli_env, conns, other, claim_now
) -> None:
    done = complete_elsewhere(other, claim_now)
    conn = neli_env(A, conn_id="neli_with_urls",
                    region_urls={B: "http://airflow.eu-west-1.example:8080/"})
    ti = RecordingTI()
    with structlog.testing.capture_logs() as logs:
        with pytest.raises(DownstreamTasksSkipped):
            run_gate(gate_for(conn), ti=ti)
    # eu-west-1's NELI page redirects to its DAG run that ran the run key with the token
    query = urlencode({"role": ROLE, "run_key": RUN_KEY, "token": done.token, "dag_id": DAG_ID,
                       "task_id": "spark_job"})
    url = f"http://airflow.eu-west-1.example:8080/neli/ran?{query}"
    found = ti.xcom[DONE_ELSEWHERE_XCOM_KEY]
    assert (found["url"], found["skipped"]) == (url, ["spark_job"])
    assert f"Ran in deployment '{B}' with token {done.token}: {url}" in messages(logs)


def test_proxy_asset_events_off_declares_and_emits_nothing(conns, other, claim_now) -> None:
    complete_elsewhere(other, claim_now)
    gate = gate_for(conns[A], proxy_asset_events=False)
    assert not any(isinstance(o, AssetAlias) for o in gate.outlets)
    outlet_events = OutletEventAccessors()
    with pytest.raises(DownstreamTasksSkipped):
        run_gate(gate, context={"outlet_events": outlet_events})
    assert proxy_events(outlet_events) == []


def test_claiming_region_emits_no_event_by_proxy(conns) -> None:
    outlet_events = OutletEventAccessors()
    claim, _ = run_gate(gate_for(conns[A]), context={"outlet_events": outlet_events})
    assert claim["deployment"] == A
    assert proxy_events(outlet_events) == []


class AssetTriggeredRun:
    """The slice of a DAG run the gate reads for an asset-triggered run."""

    def __init__(self, extras: list[dict[str, Any]]) -> None:
        self.consumed_asset_events = [SimpleNamespace(extra=extra) for extra in extras]


def asset_triggered(extras: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "logical_date": None,
        "ts": None,
        "run_id": f"asset_triggered__{uuid.uuid4().hex}",  # differs per region
        "dag_run": AssetTriggeredRun(extras),
    }


def upstream(role: str, run_key: str, token: int, deployment: str, proxy: bool) -> dict:
    return {EXTRA_KEY: {"deployment": deployment, "role": role, "run_key": run_key,
                        "token": token, "proxy": proxy, "recorded_by": A if proxy else B}}


def test_asset_triggered_run_key_is_the_same_in_every_region(conns, other) -> None:
    # region A saw the event by proxy, region B the runner's own: same identity
    seen_by = {
        A: [upstream("daily/2013-01-05", "daily/2013-01-05T00:00:00+00:00", 12, B, True)],
        B: [upstream("daily/2013-01-05", "daily/2013-01-05T00:00:00+00:00", 12, B, False)],
    }
    keys = {}
    for region, conn_id in ((A, conns[A]), (B, conns[B])):
        gate = gate_for(conn_id)
        context = {"dag": gate.dag, "ti": RecordingTI(), **asset_triggered(seen_by[region])}
        gate.render_template_fields(context)
        keys[region] = gate.run_key  # rendered before the gate pokes (UI, NELI run link)
    expected = f"{DAG_ID}/after/daily/2013-01-05/daily/2013-01-05T00:00:00+00:00@12"
    assert keys == {A: expected, B: expected}

    # and the claim goes under that key
    claim, _ = run_gate(gate_for(conns[A]), context=asset_triggered(seen_by[A]))
    assert claim["run_key"] == expected


def test_a_batch_of_upstream_runs_takes_the_latest_ones_key() -> None:
    from neli_orchestrate.airflow.assets import run_key_after_assets

    d1 = upstream("daily/2013-01-01", "k1", 3, B, True)
    d2 = upstream("daily/2013-01-02", "k2", 4, B, True)
    events = [SimpleNamespace(extra=e) for e in (d2, d1, d1)]
    assert run_key_after_assets("down", events) == "down/after/daily/2013-01-02/k2@4"
    assert run_key_after_assets("down", [SimpleNamespace(extra={"other": 1})]) is None


def test_default_run_key_of_a_dated_run_is_rendered_with_the_templates(conns) -> None:
    gate = gate_for(conns[A])
    gate.render_template_fields({"dag": gate.dag, "logical_date": LOGICAL,
                                 "ts": LOGICAL.isoformat()})
    assert gate.run_key == RUN_KEY


def test_no_logical_date_and_no_singleton_identity_the_gate_refuses(conns) -> None:
    with pytest.raises(AirflowFailException, match="Set run_key= on the gate"):
        run_gate(gate_for(conns[A]), context=asset_triggered([{"source": "not a singleton"}]))
    with pytest.raises(AirflowFailException, match="not triggered by a singleton"):
        run_gate(gate_for(conns[A]), context=asset_triggered([]))
    # an explicit run key needs neither
    claim, _ = run_gate(gate_for(conns[A], run_key="manual/1"), context=asset_triggered([]))
    assert claim["run_key"] == "manual/1"


def test_live_claim_elsewhere_the_gate_waits_in_every_mode_and_never_skips(
    conns, other, claim_now
) -> None:
    reservation = claim_now(other, ROLE, RUN_KEY)
    assert reservation.should_run

    # poke: one attempt says "not yet"
    gate = gate_for(conns[A], timeout=600)
    ti = RecordingTI()
    context = {
        "dag": gate.dag,
        "ti": ti,
        "logical_date": LOGICAL,
        "ts": LOGICAL.isoformat(),
        "run_id": "r",
    }
    gate.render_template_fields(context)
    assert gate.poke(context) is False
    assert ti.xcom == {}

    # reschedule: the worker slot is given back
    with pytest.raises(AirflowRescheduleException):
        run_gate(gate_for(conns[A], mode="reschedule", timeout=600))

    # deferrable: the wait moves to the triggerer
    with pytest.raises(TaskDeferred) as deferred:
        run_gate(gate_for(conns[A], deferrable=True, timeout=600))
    trigger = deferred.value.trigger
    assert isinstance(trigger, NeliLeadershipTrigger)
    assert (trigger.role, trigger.run_key, trigger.neli_conn_id) == (ROLE, RUN_KEY, conns[A])
    assert deferred.value.method_name == "execute_complete"

    record = ledger(conns)
    assert (record.state, record.deployment, record.token) == (
        RunState.CLAIMED,
        B,
        reservation.token,
    )


def test_claim_past_its_handoff_deadline_the_waiting_gate_takes_over(
    conns, other, claim_now
) -> None:
    reservation = claim_now(other, ROLE, RUN_KEY)
    assert reservation.should_run, reservation
    claimed = ledger(conns)
    # poke mode: the gate keeps waiting while the claim is live, then takes it over
    claim, _ = run_gate(gate_for(conns[A]))
    record = ledger(conns)
    assert time.time() > claimed.handoff_deadline
    assert claim["token"] > reservation.token, (claim, reservation)
    assert (record.state, record.deployment, record.token) == (
        RunState.CLAIMED,
        A,
        claim["token"],
    ), record
    assert record.reason.startswith("TAKE_OVER"), record


DEAD_RUNNER = """
import sys, time
from airflow.sdk.execution_time.context import OutletEventAccessors

from neli_orchestrate.airflow.assets import EXTRA_KEY, proxy_alias_name
from neli_orchestrate.airflow.claims import DONE_ELSEWHERE_XCOM_KEY
from neli_orchestrate.airflow.hooks.neli import NeliHook
conn_id, role, run_key = sys.argv[1:4]
singleton = NeliHook(conn_id).get_singleton()
reservation = singleton.reserve(role, run_key)
while not reservation.should_run:  # a loaded machine may answer WAIT first
    time.sleep(0.2)
    reservation = singleton.reserve(role, run_key)
def work(run):
    print("RUNNING", run.token, flush=True)
    time.sleep(600)
singleton.execute(role, run_key, reservation.token, work)
"""


def test_running_by_a_dead_runner_the_gate_takes_over_with_a_larger_token(conns) -> None:
    runner = subprocess.Popen(
        [sys.executable, "-c", DEAD_RUNNER, conns[B], ROLE, RUN_KEY],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=os.environ.copy(),
    )
    try:
        # Airflow's logging also prints to stdout: read until the work runs (or the runner dies)
        lines = []
        while not (lines and lines[-1].startswith("RUNNING")):
            line = runner.stdout.readline()
            assert line, f"the runner died before running the work: {lines}"
            lines.append(line)
        running = ledger(conns)
        assert (running.state, running.deployment) == (RunState.RUNNING, B)
        # while B's runner is alive it leads the role: the gate waits, it does not skip
        alive_gate = gate_for(conns[A])
        ti = RecordingTI()
        context = {
            "dag": alive_gate.dag,
            "ti": ti,
            "logical_date": LOGICAL,
            "ts": LOGICAL.isoformat(),
            "run_id": "r",
        }
        alive_gate.render_template_fields(context)
        assert alive_gate.poke(context) is False
    finally:
        runner.send_signal(signal.SIGKILL)
        runner.wait()
    claim, _ = run_gate(gate_for(conns[A]))
    record = ledger(conns)
    assert claim["token"] > running.token
    assert (record.state, record.deployment, record.attempt) == (RunState.CLAIMED, A, 2)


def test_work_running_elsewhere_the_gate_waits_then_skips_once_it_completed(
    conns, other, claim_now
) -> None:
    reservation = claim_now(other, ROLE, RUN_KEY)
    started, release = threading.Event(), threading.Event()

    def work(run: Any) -> None:
        started.set()
        release.wait(60)

    runner = threading.Thread(
        target=other.execute, args=(ROLE, RUN_KEY, reservation.token, work), daemon=True
    )
    runner.start()
    assert started.wait(30)
    gate = gate_for(conns[A])
    context = {
        "dag": gate.dag,
        "ti": RecordingTI(),
        "logical_date": LOGICAL,
        "ts": LOGICAL.isoformat(),
        "run_id": "r",
    }
    gate.render_template_fields(context)
    assert gate.poke(context) is False  # B leads the role while its work runs
    release.set()
    runner.join(30)
    assert ledger(conns).state is RunState.COMPLETED
    with pytest.raises(DownstreamTasksSkipped):
        run_gate(gate_for(conns[A]))


def _fail(run: Any) -> None:
    raise RuntimeError("spark job exited with 1")


def test_failed_elsewhere_the_failing_deployment_retries_first_then_anyone(
    conns, other, claim_now
) -> None:
    reservation = claim_now(other, ROLE, RUN_KEY)
    with pytest.raises(RuntimeError):
        other.execute(ROLE, RUN_KEY, reservation.token, _fail)
    failed = ledger(conns)
    assert (failed.state, failed.deployment) == (RunState.FAILED, B)
    assert "spark job exited with 1" in failed.reason

    gate = gate_for(conns[A])
    context = {
        "dag": gate.dag,
        "ti": RecordingTI(),
        "logical_date": LOGICAL,
        "ts": LOGICAL.isoformat(),
        "run_id": "r",
    }
    gate.render_template_fields(context)
    assert gate.poke(context) is False  # B's retry window

    claim, _ = run_gate(gate_for(conns[A]))  # poke mode: waits out the window, takes over
    record = ledger(conns)
    assert claim["token"] > failed.token
    assert (record.state, record.deployment, record.attempt) == (RunState.CLAIMED, A, 2)


def test_failed_here_the_gate_retries_at_once_with_a_new_token(conns, claim_now) -> None:
    with NeliHook(conns[A]).get_singleton() as mine:
        reservation = claim_now(mine, ROLE, RUN_KEY)
        with pytest.raises(RuntimeError):
            mine.execute(ROLE, RUN_KEY, reservation.token, _fail)
    gate = gate_for(conns[A])
    context = {
        "dag": gate.dag,
        "ti": RecordingTI(),
        "logical_date": LOGICAL,
        "ts": LOGICAL.isoformat(),
        "run_id": "r",
    }
    gate.render_template_fields(context)
    result = gate.poke(context)
    assert result and result.xcom_value["token"] > reservation.token
    record = ledger(conns)
    assert (record.state, record.attempt) == (RunState.CLAIMED, 2)


def test_own_unstarted_claim_the_gate_supersedes_it_with_a_larger_token(conns, claim_now) -> None:
    with NeliHook(conns[A]).get_singleton() as mine:
        earlier = claim_now(mine, ROLE, RUN_KEY)  # e.g. a gate try whose executor never started
    claim, _ = run_gate(gate_for(conns[A]))
    record = ledger(conns)
    assert claim["token"] > earlier.token
    assert (record.state, record.deployment, record.token) == (RunState.CLAIMED, A, claim["token"])


def test_attempts_exhausted_the_gate_fails_for_good(neli_env, claim_now) -> None:
    conn = neli_env(A, max_attempts=1)
    with NeliHook(conn).get_singleton() as mine:
        reservation = claim_now(mine, ROLE, RUN_KEY)
        with pytest.raises(RuntimeError):
            mine.execute(ROLE, RUN_KEY, reservation.token, _fail)
    with pytest.raises(AirflowFailException, match="failed for good"):
        run_gate(gate_for(conn))


def test_deferred_gate_resumes_by_deciding_again(conns, other) -> None:
    # the trigger's event is only a hint: the resumed gate reserves for itself
    claim, _ = run_gate(
        gate_for(conns[A], deferrable=True), "execute_complete", event={"status": "leader"}
    )
    assert claim["deployment"] == A
    with pytest.raises(Exception, match="NELI trigger failed: boom"):
        run_gate(
            gate_for(conns[A], deferrable=True),
            "execute_complete",
            event={"status": "error", "message": "boom"},
        )
