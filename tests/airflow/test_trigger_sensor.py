"""NeliLeadershipTrigger and NeliLeaderSensor against the real Kafka broker."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import TaskDeferred

from neli_orchestrate.airflow.hooks.neli import NeliHook
from neli_orchestrate.airflow.sensors.leader import NeliLeaderSensor
from neli_orchestrate.airflow.triggers.leader import NeliLeadershipTrigger

pytestmark = [pytest.mark.airflow, pytest.mark.kafka]

A, B = "us-east-1", "eu-west-1"
ROLE = "reports"
RUN_KEY = "reports/2013-02-01"


class ThreadRecordingTrigger(NeliLeadershipTrigger):
    """Records which thread ran each blocking check."""

    threads: list[threading.Thread]

    def check(self, hook: Any) -> dict[str, Any] | None:
        self.threads.append(threading.current_thread())
        return super().check(hook)


async def first_event(trigger: NeliLeadershipTrigger, timeout: float = 60) -> dict[str, Any]:
    trigger.threads = []
    loop_thread = threading.current_thread()
    events = trigger.run()
    try:
        event = await asyncio.wait_for(anext(events), timeout)
    finally:
        await events.aclose()
    # every blocking Kafka call ran off the event loop's thread
    assert trigger.threads and all(t is not loop_thread for t in trigger.threads)
    return event.payload


@pytest.fixture
def conns(neli_env) -> dict[str, str]:
    return {A: neli_env(A), B: neli_env(B)}


def test_trigger_serializes_to_the_arguments_that_rebuild_it() -> None:
    trigger = NeliLeadershipTrigger(
        role=ROLE,
        run_key=RUN_KEY,
        neli_conn_id="n",
        deployment="d",
        acquire_timeout=2,
        poll_interval=7,
        first_check=0,
        wait_started_at=1234.5,
    )
    path, kwargs = trigger.serialize()
    assert path == "neli_orchestrate.airflow.triggers.leader.NeliLeadershipTrigger"
    assert NeliLeadershipTrigger(**kwargs).serialize() == (path, kwargs)
    assert kwargs == {
        "role": ROLE,
        "run_key": RUN_KEY,
        "neli_conn_id": "n",
        "deployment": "d",
        "acquire_timeout": 2,
        "poll_interval": 7.0,
        "first_check": 0.0,
        "wait_started_at": 1234.5,
    }
    # by default the first check waits out Airflow's defer/resume race (apache/airflow#72716)
    assert NeliLeadershipTrigger(role=ROLE, poll_interval=5).first_check == 15.0
    assert NeliLeadershipTrigger(role=ROLE, poll_interval=60).first_check == 60.0


def test_trigger_keeps_waiting_while_a_claim_elsewhere_is_live(conns, claim_now) -> None:
    with NeliHook(conns[B]).get_singleton() as other:
        claim_now(other, ROLE, RUN_KEY)
        deadline = other.status(ROLE, RUN_KEY).handoff_deadline
    trigger = ThreadRecordingTrigger(
        role=ROLE, run_key=RUN_KEY, neli_conn_id=conns[A], poll_interval=0.5, first_check=0
    )
    payload = asyncio.run(first_event(trigger))
    assert payload["status"] == "leader"
    assert time.time() > deadline  # it did not fire while B's claim was live
    assert payload["checks"] > 1


def test_trigger_fires_at_once_for_the_claim_of_a_deployment_kafka_shows_gone(
    neli_env, namespace, warm_broker, claim_now
) -> None:
    # B claimed and is gone (its liveness member expired): the trigger must not wait out B's
    # handoff window (300 s) but let the gate resume, which takes the claim over (issue 20).
    from neli_orchestrate.liveness import (
        AnnouncerConfig,
        Liveness,
        LivenessAnnouncer,
        LivenessReader,
    )

    conns = {A: neli_env(A), B: neli_env(B, handoff_timeout=300)}
    with NeliHook(conns[B]).get_singleton() as other:
        claim_now(other, ROLE, RUN_KEY)  # (creates the namespace's leader topic)
        deadline = other.status(ROLE, RUN_KEY).handoff_deadline
    announcer = LivenessAnnouncer(AnnouncerConfig(
        bootstrap_servers=warm_broker, namespace=namespace, deployment=B, timeout=1.0,
        poll_interval=0.1)).start()
    try:
        assert announcer.wait_joined(30)
    finally:
        announcer.close()  # B is gone: its member expires after 1 s
    from confluent_kafka.admin import AdminClient

    reader = LivenessReader(AdminClient({"bootstrap.servers": warm_broker}), namespace)
    end = time.monotonic() + 30
    while not reader.read(B).gone:
        assert time.monotonic() < end, "B's liveness member never expired"
        time.sleep(0.2)
    trigger = ThreadRecordingTrigger(
        role=ROLE, run_key=RUN_KEY, neli_conn_id=conns[A], poll_interval=0.5, first_check=0
    )
    payload = asyncio.run(first_event(trigger, timeout=60))
    assert payload["status"] == "leader"
    assert time.time() < deadline  # within B's handoff window: liveness, not the window
    assert reader.read(B).state is Liveness.GONE


def test_trigger_fires_done_when_the_run_completed(conns, claim_now) -> None:
    with NeliHook(conns[B]).get_singleton() as other:
        reservation = claim_now(other, ROLE, RUN_KEY)
        other.execute(ROLE, RUN_KEY, reservation.token, lambda run: None)
    trigger = ThreadRecordingTrigger(
        role=ROLE, run_key=RUN_KEY, neli_conn_id=conns[A], first_check=0
    )
    payload = asyncio.run(first_event(trigger))
    assert payload["status"] == "done"
    assert (payload["record"]["state"], payload["record"]["deployment"]) == ("COMPLETED", B)


def test_trigger_reports_a_broken_connection_as_an_error_event(neli_env) -> None:
    conn_id = neli_env(A, acquire_timeout="soon")
    trigger = NeliLeadershipTrigger(role=ROLE, neli_conn_id=conn_id, first_check=0)

    async def first() -> dict[str, Any]:
        events = trigger.run()
        try:
            return (await asyncio.wait_for(anext(events), 30)).payload
        finally:
            await events.aclose()

    payload = asyncio.run(first())
    assert payload["status"] == "error"
    assert "acquire_timeout" in payload["message"]


def sensor_for(conn_id: str, **kwargs: Any) -> NeliLeaderSensor:
    with DAG("leader_sensor", schedule=None, start_date=pendulum.datetime(2013, 1, 1)):
        return NeliLeaderSensor(
            task_id="leading", role=ROLE, neli_conn_id=conn_id, poke_interval=1, **kwargs
        )


def test_sensor_waits_while_another_deployment_leads_the_role(conns, claim_now) -> None:
    started, release = threading.Event(), threading.Event()

    def work(run: Any) -> None:
        started.set()
        release.wait(60)

    with NeliHook(conns[B]).get_singleton() as other:
        reservation = claim_now(other, ROLE, RUN_KEY)
        runner = threading.Thread(
            target=other.execute, args=(ROLE, RUN_KEY, reservation.token, work), daemon=True
        )
        runner.start()
        try:
            assert started.wait(30)
            assert sensor_for(conns[A], acquire_timeout=2).poke({}) is False
            # deferrable: waits in the triggerer for deployment-level leadership (no run key)
            with pytest.raises(TaskDeferred) as deferred:
                sensor_for(conns[A], acquire_timeout=2, deferrable=True).execute({})
            assert isinstance(deferred.value.trigger, NeliLeadershipTrigger)
            assert deferred.value.trigger.run_key is None
        finally:
            release.set()
            runner.join(30)
    result = sensor_for(conns[A], acquire_timeout=10).poke({})
    assert result and result.xcom_value == {"role": ROLE, "deployment": A}
