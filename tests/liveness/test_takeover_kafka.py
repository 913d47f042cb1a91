"""The decision table with deployment liveness, against the real broker.

A gone deployment's claim is taken over at once with a larger token; a live one's is still
respected for ``handoff_timeout``; and a deployment wrongly declared dead (its liveness
heartbeats delayed) is harmless: its late executor finds the newer claim and never runs.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka.admin import NewTopic

from neli_orchestrate import NeliConfig, Singleton, SingletonConfig
from neli_orchestrate.decision import Outcome
from neli_orchestrate.errors import AcquireTimeoutError, SkippedRun
from neli_orchestrate.ledger.record import RunState
from neli_orchestrate.liveness import (
    AnnouncerConfig,
    DeploymentLiveness,
    Liveness,
    LivenessAnnouncer,
    LivenessReader,
)

pytestmark = pytest.mark.kafka

US, EU = "us-east-1", "eu-west-1"
ROLE = "daily_flights"
HANDOFF = 300.0  # the default: a take-over inside it can only come from the liveness rule


@pytest.fixture
def namespace(kafka_admin) -> str:
    ns = "lt" + uuid.uuid4().hex[:8]
    kafka_admin.create_topics([NewTopic(f"{ns}.neli", 1, 1)])[f"{ns}.neli"].result(30)
    return ns


def region(bootstrap: str, namespace: str, deployment: str, *,
           liveness: Callable[[str], DeploymentLiveness] | None = None) -> Singleton:
    neli = NeliConfig(bootstrap_servers=bootstrap, session_timeout=12.0, heartbeat_timeout=5.0)
    return Singleton(SingletonConfig(neli=neli, namespace=namespace, deployment=deployment,
                                     acquire_timeout=60.0, handoff_timeout=HANDOFF),
                     liveness=liveness)


def reserve_deciding(singleton: Singleton, run_key: str, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    """Reserve until the answer comes from the decision table (not from a busy group or a
    lease lost on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while True:
        answer = singleton.reserve(ROLE, run_key)
        if answer.should_run or "busy" not in answer.reason and "lost leadership" not in \
                answer.reason and "not acquired" not in answer.reason:
            return answer
        assert time.monotonic() < deadline, f"no decision for {run_key!r}: {answer}"
        time.sleep(0.2)


def test_a_gone_deployments_claim_is_taken_over_at_once_a_live_ones_respected(
    kafka_broker, kafka_admin, namespace
) -> None:
    eu_alive = LivenessAnnouncer(AnnouncerConfig(
        bootstrap_servers=kafka_broker, namespace=namespace, deployment=EU, timeout=1.0,
        poll_interval=0.1, component="scheduler")).start()
    try:
        assert eu_alive.wait_joined(30)
        with region(kafka_broker, namespace, EU) as eu:
            first = reserve_deciding(eu, "2013-01-05")
        assert first.should_run and first.token is not None
        with region(kafka_broker, namespace, US) as us:
            respected = reserve_deciding(us, "2013-01-05")
            assert respected.outcome is Outcome.WAIT, respected  # alive: its claim holds
            claim = us.status(ROLE, "2013-01-05")
            assert claim is not None and claim.token == first.token
            assert respected.wait_until is not None
            assert respected.wait_until >= claim.handoff_deadline  # type: ignore[operator]
    finally:
        eu_alive.close()  # EU's scheduler dies (no LeaveGroup: it expires like a crash)
    reader = LivenessReader(kafka_admin, namespace)
    deadline = time.monotonic() + 30
    while not reader.read(EU).gone:
        assert time.monotonic() < deadline, "EU never seen gone"
        time.sleep(0.05)
    with region(kafka_broker, namespace, US) as us:
        took = reserve_deciding(us, "2013-01-05")
        assert took.outcome is Outcome.TAKE_OVER and took.should_run, took
        assert took.token is not None and took.token > first.token
        assert "GONE" in took.reason
        record = us.status(ROLE, "2013-01-05")
        assert record is not None and (record.state, record.deployment, record.token) == (
            RunState.CLAIMED, US, took.token)
        assert time.time() < claim.handoff_deadline  # type: ignore[operator]


def test_a_wrongly_declared_dead_deployments_late_executor_is_refused_and_never_runs(
    kafka_broker, namespace
) -> None:
    # EU is alive, but US reads it as GONE: its liveness heartbeats were delayed past the
    # timeout (a paused scheduler, a slow network). The verdict is wrong; tokens and the
    # fenced ledger must make it harmless.
    def wrongly_dead(deployment: str) -> DeploymentLiveness:
        return DeploymentLiveness(deployment, Liveness.GONE, timeout=1.0,
                                  detail="heartbeats delayed (wrong verdict)")

    ran: list[tuple[str, int]] = []
    with region(kafka_broker, namespace, EU) as eu, \
            region(kafka_broker, namespace, US, liveness=wrongly_dead) as us:
        gate = reserve_deciding(eu, "2013-01-06")
        assert gate.should_run and gate.token is not None
        took = reserve_deciding(us, "2013-01-06")
        assert took.outcome is Outcome.TAKE_OVER and took.token is not None
        assert took.token > gate.token

        # EU's executor starts late with its gate's token: it sees the newer claim, decides
        # again (US's claim is live for EU: respected) and fails the try without running.
        with pytest.raises(AcquireTimeoutError, match=str(took.token)):
            eu.execute(ROLE, "2013-01-06", gate.token,
                       lambda run: ran.append((EU, run.token)))
        assert ran == []
        latest = eu.status(ROLE, "2013-01-06")
        assert latest is not None and (latest.deployment, latest.token) == (US, took.token)

        us.execute(ROLE, "2013-01-06", took.token, lambda run: ran.append((US, run.token)))
        with pytest.raises(SkippedRun):  # a still later EU try: done, not run
            eu.execute(ROLE, "2013-01-06", gate.token,
                       lambda run: ran.append((EU, run.token)))
    assert ran == [(US, took.token)]  # exactly once, under the newer token
