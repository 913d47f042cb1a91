"""The metrics a Singleton reports through its hook: one event per thing that happened.

Scripted members and the in-memory ledger (as in test_singleton_unit), so the assertions are
on exact event sequences: which role, which deployment, which outcome, how many.
"""

from __future__ import annotations

import threading
import time

import pytest
from test_singleton_unit import ROLE, Coordinator, make

from neli_orchestrate import AcquireTimeoutError, FencedError, Outcome, Singleton
from neli_orchestrate.metrics import Metric, MetricEvent
from neli_orchestrate.testing.memory_ledger import MemoryLedger


class Recorder:
    def __init__(self) -> None:
        self.events: list[MetricEvent] = []
        self.lock = threading.Lock()

    def __call__(self, event: MetricEvent) -> None:
        with self.lock:
            self.events.append(event)

    def names(self) -> list[tuple[str, str | None]]:
        return [(e.name.value, e.outcome) for e in self.events if not e.is_timing]

    def timings(self) -> list[MetricEvent]:
        return [e for e in self.events if e.is_timing]


@pytest.fixture
def world() -> tuple[Coordinator, MemoryLedger]:
    return Coordinator(), MemoryLedger()


def singleton(deployment: str, world, metrics, wall_clock=time.time,  # type: ignore[no-untyped-def]
              **overrides) -> Singleton:
    """Like test_singleton_unit.make, with ``metrics`` passed to the constructor."""
    coordinator, ledger = world
    config = make(deployment, coordinator, ledger, **overrides).config
    return Singleton(config, ledger=ledger, neli_factory=coordinator, wall_clock=wall_clock,
                     metrics=metrics)


def test_a_claim_reports_leadership_time_to_lead_and_one_claim(world) -> None:
    metrics = Recorder()
    with singleton("us-east-1", world, metrics).claim(ROLE, "d1") as run:
        assert run.should_run
    assert metrics.names() == [("leader_acquired", None), ("claim", "RUN")]
    [lead] = metrics.timings()
    assert lead.name is Metric.TIME_TO_LEAD and lead.role == ROLE and lead.value >= 0
    assert {e.deployment for e in metrics.events} == {"us-east-1"}
    assert metrics.events[-1].tags == {"role": ROLE, "deployment": "us-east-1",
                                       "outcome": "RUN"}


def test_a_completed_run_reports_a_skip_and_a_live_claim_elsewhere_a_wait(world) -> None:
    with singleton("us-east-1", world, Recorder()).claim(ROLE, "done") as run:
        assert run.should_run
    metrics = Recorder()
    with singleton("eu-west-1", world, metrics).claim(ROLE, "done") as run:
        assert not run.should_run
    singleton("us-east-1", world, Recorder()).reserve(ROLE, "live")
    assert singleton("eu-west-1", world, metrics).reserve(ROLE, "live").outcome is Outcome.WAIT
    assert [n for n in metrics.names() if n[0] != "leader_acquired"] == [
        ("skip", "SKIP_DONE"), ("wait", "WAIT")]


def test_a_takeover_reports_a_claim_and_a_takeover(world) -> None:
    singleton("us-east-1", world, Recorder()).reserve(ROLE, "d1")
    metrics = Recorder()
    later = lambda: time.time() + 3600  # noqa: E731 - past the claim's handoff deadline
    newer = singleton("eu-west-1", world, metrics, wall_clock=later).reserve(ROLE, "d1")
    assert newer.outcome is Outcome.TAKE_OVER
    assert [n for n in metrics.names() if n[0] != "leader_acquired"] == [
        ("claim", "TAKE_OVER"), ("takeover", "TAKE_OVER")]


def test_an_executor_under_the_gates_claim_is_no_new_claim_but_a_retry_that_decides_again_is(
    world,
) -> None:
    gate = Recorder()
    reservation = singleton("us-east-1", world, gate).reserve(ROLE, "d1")
    executor = Recorder()
    with pytest.raises(RuntimeError):
        singleton("us-east-1", world, executor).execute(
            ROLE, "d1", reservation.token, lambda run: (_ for _ in ()).throw(RuntimeError("x")))
    singleton("us-east-1", world, executor).execute(ROLE, "d1", reservation.token,
                                                    lambda run: None)
    assert [n for n in gate.names() if n[0] == "claim"] == [("claim", "RUN")]
    # try 1 runs under the gate's claim (no claim event); try 2 retries under a new claim
    assert [n for n in executor.names() if n[0] == "claim"] == [("claim", "RETRY")]


def test_a_fence_reports_the_fence_and_the_lost_leadership_once(world) -> None:
    coordinator, _ = world
    metrics = Recorder()
    fenced = threading.Event()
    with pytest.raises(FencedError):
        with singleton("us-east-1", world, metrics).claim(ROLE, "d1") as run:
            run.on_fence(lambda reason: fenced.set())
            coordinator.created[-1].fence()
            assert fenced.wait(10), "the watchdog did not deliver the fence"
            run.check()
    names = [n for n, _ in metrics.names()]
    assert names.count("fence") == 1 and names.count("leader_lost") == 1
    fence = next(e for e in metrics.events if e.name is Metric.FENCE)
    assert (fence.role, fence.run_key, fence.deployment) == (ROLE, "d1", "us-east-1")


def test_not_leading_reports_a_wait_and_no_leadership(world) -> None:
    coordinator, _ = world
    coordinator.hold.add("acme." + ROLE)
    metrics = Recorder()
    with pytest.raises(AcquireTimeoutError):
        singleton("eu-west-1", world, metrics, acquire_timeout=0.2).execute(
            ROLE, "d1", 7, lambda run: None)
    with singleton("eu-west-1", world, metrics, acquire_timeout=0.2).claim(ROLE, "d1") as run:
        assert run.outcome is Outcome.WAIT
    assert metrics.names() == [("wait", "WAIT")]
    assert not metrics.timings()


def test_a_failing_hook_changes_nothing(world, caplog: pytest.LogCaptureFixture) -> None:
    def broken(event: MetricEvent) -> None:
        raise ValueError("metrics backend down")

    _, ledger = world
    ran = []
    with singleton("us-east-1", world, broken).claim(ROLE, "d1") as run:
        ran.append(run.token)
    assert ran and ledger.latest(ROLE, "d1").state.value == "COMPLETED"
    assert "the metrics hook failed" in caplog.text
