"""The singleton state machine with scripted members (MockNeli) and the in-memory ledger.

No Kafka here: a tiny fake group coordinator hands a role to one member at a time, the way
partition assignment does, and MemoryLedger fences writers like Kafka transactions.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest

from neli_orchestrate import (
    AcquireTimeoutError,
    FencedError,
    NeliConfig,
    Outcome,
    Singleton,
    SingletonConfig,
    SkippedRun,
)
from neli_orchestrate.claim import Claim
from neli_orchestrate.core.events import LeaderRevoked
from neli_orchestrate.core.mock import MockNeli
from neli_orchestrate.errors import ConfigError
from neli_orchestrate.ledger.record import RunState
from neli_orchestrate.singleton.run import Run
from neli_orchestrate.testing.memory_ledger import MemoryLedger

ROLE = "daily_flights"


class Coordinator:
    """Assigns each role's group to its oldest open member; the next one on close."""

    def __init__(self) -> None:
        self.groups: dict[str, list[Member]] = defaultdict(list)
        self.lock = threading.Lock()
        self.created: list[Member] = []
        self.hold: set[str] = set()  # groups whose leadership is held by an outsider
        self.member_class: type[Member] = Member

    def __call__(self, config: NeliConfig, barrier=None):  # type: ignore[no-untyped-def]
        member = self.member_class(self, config.resolved.group_id, config, barrier,
                                   member_id=f"m{len(self.created)}")
        with self.lock:
            self.created.append(member)
            self.groups[member.group].append(member)
            self._assign(member.group)
        return member

    def _assign(self, group: str) -> None:
        members = self.groups[group]
        if members and group not in self.hold and not any(m.is_leader for m in members):
            members[0].acquire()

    def closed(self, member: Member) -> None:
        with self.lock:
            self.groups[member.group].remove(member)
            self._assign(member.group)

    def release(self, group: str) -> None:
        with self.lock:
            self.hold.discard(group)
            self._assign(group)


class Member(MockNeli):
    def __init__(self, coordinator: Coordinator, group: str, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.coordinator = coordinator
        self.group = group
        self._idle = threading.Event()

    def pulse(self, timeout: float = 0.0) -> bool:
        leading = super().pulse(timeout)
        if leading and timeout:
            self._idle.wait(timeout)  # a real pulse blocks in poll; don't spin
        return leading

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        self._idle.set()
        self.coordinator.closed(self)


def make(deployment: str, coordinator: Coordinator, ledger: MemoryLedger,
         wall_clock=time.time, **overrides: object) -> Singleton:
    settings: dict[str, object] = {"handoff_timeout": 60.0, "acquire_timeout": 0.5}
    settings.update(overrides)
    config = SingletonConfig(
        neli=NeliConfig(bootstrap_servers="unused:9092"), namespace="acme",
        deployment=deployment, **settings,  # type: ignore[arg-type]
    )
    return Singleton(config, ledger=ledger, neli_factory=coordinator, wall_clock=wall_clock)


def fence_now(member: Member) -> None:
    """Fence ``member`` and wait until its watchdog has seen it (a slow write meanwhile)."""
    member.fence()
    deadline = time.monotonic() + 10
    while member.is_leader:
        assert time.monotonic() < deadline, "the watchdog never pulsed the fence in"
        time.sleep(0.01)


@pytest.fixture
def world() -> tuple[Coordinator, MemoryLedger]:
    return Coordinator(), MemoryLedger()


def test_first_claim_runs_once_and_records_completed(world) -> None:
    coordinator, ledger = world
    singleton = make("us-east-1", coordinator, ledger)
    ran = []
    with singleton.claim(ROLE, "2013-01-05") as run:
        assert run.outcome is Outcome.RUN and run.should_run
        assert isinstance(run.token, int)
        ran.append(run.token)
    assert ledger.history(ROLE, "2013-01-05") == [RunState.RUNNING, RunState.COMPLETED]
    assert ledger.latest(ROLE, "2013-01-05").token == ran[0]
    assert coordinator.groups["acme." + ROLE] == [], "the member left the group after the run"


def test_a_completed_run_is_skipped_by_every_later_deployment(world) -> None:
    coordinator, ledger = world
    assert make("us-east-1", coordinator, ledger).run(ROLE, "d1", lambda run: "built") == "built"
    calls = []
    for region in ("eu-west-1", "us-east-1"):
        with make(region, coordinator, ledger).claim(ROLE, "d1") as run:
            assert run.outcome is Outcome.SKIP_DONE and not run.should_run
            assert run.record is not None and run.record.deployment == "us-east-1"
            calls.append(region)
    assert ledger.history(ROLE, "d1") == [RunState.RUNNING, RunState.COMPLETED]
    assert calls == ["eu-west-1", "us-east-1"]


def test_failed_work_records_failed_and_the_same_deployment_retries_with_a_larger_token(world):
    coordinator, ledger = world
    singleton = make("us-east-1", coordinator, ledger)
    with pytest.raises(RuntimeError, match="spark died"):
        with singleton.claim(ROLE, "d1") as run:
            first = run.token
            raise RuntimeError("spark died")
    failed = ledger.latest(ROLE, "d1")
    assert failed.state is RunState.FAILED and "spark died" in failed.reason
    with make("eu-west-1", coordinator, ledger).claim(ROLE, "d1") as other:
        assert other.outcome is Outcome.WAIT  # the failing deployment retries first
    with singleton.claim(ROLE, "d1") as retry:
        assert retry.outcome is Outcome.RETRY and retry.token > first
    assert ledger.latest(ROLE, "d1").state is RunState.COMPLETED


@pytest.mark.parametrize(
    ("retry_in", "deadline", "other_waits"),
    [
        ("unsaid", None, True),  # the handoff window from the failure (at + handoff_timeout)
        (10.0, 70.0, True),      # this deployment's retry in 10 s, plus handoff_timeout 60 s
        (None, 0.0, False),      # no retry will come (last try, SIGTERM): take over at once
    ],
)
def test_a_failed_try_keeps_the_run_for_its_own_retry_only_as_long_as_it_says(
        world, retry_in, deadline, other_waits) -> None:
    coordinator, ledger = world
    now = [1_000_000.0]
    clock = lambda: now[0]  # noqa: E731
    with pytest.raises(RuntimeError, match="spark died"):
        with make("us-east-1", coordinator, ledger, wall_clock=clock).claim(ROLE, "d1") as run:
            if retry_in != "unsaid":
                run.expect_retry(retry_in)
            raise RuntimeError("spark died")
    failed = ledger.latest(ROLE, "d1")
    assert failed.state is RunState.FAILED
    expected = None if deadline is None else failed.at + deadline
    assert failed.handoff_deadline == expected
    now[0] += 5.0  # past max_clock_error (1 s), well within the windows said
    with make("eu-west-1", coordinator, ledger, wall_clock=clock).claim(ROLE, "d1") as other:
        assert (other.outcome is Outcome.WAIT) is other_waits, other.reason
        if not other_waits:
            assert other.outcome is Outcome.TAKE_OVER and other.token > failed.token
    with pytest.raises(ValueError, match="seconds must be None or a finite number"):
        run.expect_retry(-1.0)


def test_fence_mid_work_calls_callbacks_raises_fenced_and_records_nothing_more(world) -> None:
    coordinator, ledger = world
    singleton = make("us-east-1", coordinator, ledger)
    fenced = threading.Event()
    with pytest.raises(FencedError) as info:
        with singleton.claim(ROLE, "d1") as run:
            run.on_fence(lambda reason: fenced.set())
            coordinator.created[-1].fence()
            assert fenced.wait(10), "the watchdog did not deliver the fence"
            run.check()
    assert info.value.role == ROLE and info.value.token == run.token
    assert ledger.history(ROLE, "d1") == [RunState.RUNNING]


def test_revoke_barrier_holds_the_successor_until_completed_is_recorded(world) -> None:
    coordinator, ledger = world
    singleton = make("us-east-1", coordinator, ledger)
    order: list[str] = []
    with singleton.claim(ROLE, "d1") as run:
        member = coordinator.created[-1]
        member.revoke()
        deadline = threading.Event()
        # the barrier is now blocked on the watchdog thread, waiting for this block to end
        while not any(isinstance(e, LeaderRevoked) for e in member.events):
            assert not deadline.wait(0.01)
        assert not run.fenced
        order.append("work done")
    order.append("block left")
    assert ledger.history(ROLE, "d1") == [RunState.RUNNING, RunState.COMPLETED]
    assert not member.barrier_errors
    assert order == ["work done", "block left"]


def test_a_newer_leader_fences_the_old_ledger_writer(world) -> None:
    """S2: after a newer begin(), the paused leader's COMPLETED write fails as FencedError."""
    coordinator, ledger = world
    singleton = make("us-east-1", coordinator, ledger)
    with pytest.raises(FencedError):
        with singleton.claim(ROLE, "d1"):
            ledger.begin(ROLE)  # what a successor's init_transactions() does
    assert ledger.history(ROLE, "d1") == [RunState.RUNNING]


def test_not_leading_within_acquire_timeout_waits_and_never_skips(world) -> None:
    coordinator, ledger = world
    coordinator.hold.add("acme." + ROLE)
    with make("eu-west-1", coordinator, ledger, acquire_timeout=0.2).claim(ROLE, "d1") as run:
        assert run.outcome is Outcome.WAIT and run.token is None
    assert ledger.history(ROLE, "d1") == []


def test_reserve_then_execute_in_another_process_completes(world) -> None:
    coordinator, ledger = world
    gate = make("us-east-1", coordinator, ledger)
    reservation = gate.reserve(ROLE, "d1")
    assert reservation.outcome is Outcome.RUN and reservation.should_run
    assert ledger.latest(ROLE, "d1").state is RunState.CLAIMED

    other = make("eu-west-1", coordinator, ledger).reserve(ROLE, "d1")
    assert other.outcome is Outcome.WAIT and other.token is None  # live claim elsewhere

    executor = make("us-east-1", coordinator, ledger)
    seen = []
    value = executor.execute(ROLE, "d1", reservation.token, lambda run: seen.append(run.token))
    assert value is None and seen == [reservation.token]
    assert ledger.history(ROLE, "d1") == [RunState.CLAIMED, RunState.RUNNING,
                                          RunState.COMPLETED]
    with pytest.raises(SkippedRun):
        executor.execute(ROLE, "d1", reservation.token, lambda run: seen.append("again"))
    assert make("eu-west-1", coordinator, ledger).reserve(ROLE, "d1").outcome is Outcome.SKIP_DONE
    assert seen == [reservation.token]


def test_execute_while_another_deployment_holds_a_live_claim_fails_the_try_cleanly(world):
    coordinator, ledger = world
    old = make("us-east-1", coordinator, ledger).reserve(ROLE, "d1")
    # the claim is not started within its handoff window; another deployment takes over
    later = lambda: time.time() + 3600  # noqa: E731
    newer = make("eu-west-1", coordinator, ledger, wall_clock=later).reserve(ROLE, "d1")
    assert newer.outcome is Outcome.TAKE_OVER and newer.token > old.token
    # its claim is live (its deadline is an hour ahead of our clock): this try does not run
    with pytest.raises(AcquireTimeoutError, match="eu-west-1.*asked again") as held:
        make("us-east-1", coordinator, ledger).execute(ROLE, "d1", old.token, lambda run: None)
    # when asking again may help: the claim's handoff deadline (+ max clock error)
    assert held.value.wait_until == pytest.approx(
        ledger.latest(ROLE, "d1").handoff_deadline + 1.0)
    assert ledger.history(ROLE, "d1") == [RunState.CLAIMED, RunState.CLAIMED]
    # once that claim lapsed unstarted, the same try (same gate token) takes it over
    ran = []
    much_later = lambda: time.time() + 7300  # noqa: E731
    make("us-east-1", coordinator, ledger, wall_clock=much_later).execute(
        ROLE, "d1", old.token, lambda run: ran.append(run.token))
    assert len(ran) == 1 and ran[0] > newer.token
    assert ledger.latest(ROLE, "d1").state is RunState.COMPLETED


def test_every_retry_with_the_gates_token_decides_again_until_completed(world) -> None:
    """Issue 9 item 1: Airflow retries pass the gate's original token to every try."""
    coordinator, ledger = world
    token = make("us-east-1", coordinator, ledger).reserve(ROLE, "d1").token
    tokens: list[int] = []

    def failing(run) -> None:  # type: ignore[no-untyped-def]
        tokens.append(run.token)
        raise RuntimeError("spark job failed")

    for _ in range(2):
        with pytest.raises(RuntimeError):
            make("us-east-1", coordinator, ledger).execute(ROLE, "d1", token, failing)
    make("us-east-1", coordinator, ledger).execute(ROLE, "d1", token,
                                                   lambda run: tokens.append(run.token))
    assert tokens[0] == token and tokens == sorted(set(tokens)), "each try a larger token"
    assert ledger.history(ROLE, "d1") == [
        RunState.CLAIMED, RunState.RUNNING, RunState.FAILED, RunState.RUNNING, RunState.FAILED,
        RunState.RUNNING, RunState.COMPLETED]
    with pytest.raises(SkippedRun):
        make("us-east-1", coordinator, ledger).execute(ROLE, "d1", token, failing)


def test_a_retry_at_max_attempts_fails_for_good_and_names_the_reset(world) -> None:
    coordinator, ledger = world
    token = make("us-east-1", coordinator, ledger, max_attempts=2).reserve(ROLE, "d1").token

    def failing(run) -> None:  # type: ignore[no-untyped-def]
        raise RuntimeError("spark job failed")

    for _ in range(2):
        with pytest.raises(RuntimeError):
            make("us-east-1", coordinator, ledger, max_attempts=2).execute(ROLE, "d1", token,
                                                                         failing)
    with pytest.raises(FencedError, match="GIVE_UP.*reset"):
        make("us-east-1", coordinator, ledger, max_attempts=2).execute(ROLE, "d1", token,
                                                                     failing)


def test_a_fence_during_the_running_write_stops_the_work_from_starting(world) -> None:
    """Issue 9 item 3: a fence between the claim check and the work is not dropped."""
    coordinator, ledger = world
    token = make("us-east-1", coordinator, ledger).reserve(ROLE, "d1").token
    executor = make("us-east-1", coordinator, ledger)
    real_write = ledger.begin

    def begin_that_fences_on_running(role):  # type: ignore[no-untyped-def]
        writer = real_write(role)
        write = writer.write

        def slow_write(record):  # type: ignore[no-untyped-def]
            write(record)
            if record.state is RunState.RUNNING:
                fence_now(coordinator.created[-1])  # lands while RUNNING is being written
        writer.write = slow_write
        return writer

    ledger.begin = begin_that_fences_on_running
    started, fences = [], []
    with pytest.raises(FencedError, match="fenced"):
        executor.execute(ROLE, "d1", token, lambda run: started.append(run.token),
                         on_fence=fences.append)
    ledger.begin = real_write
    assert started == [], "no work starts under a fenced run"
    assert fences, "the fence callback ran"
    assert ledger.history(ROLE, "d1") == [RunState.CLAIMED, RunState.RUNNING]
    # the fence failed the try, not the run: the next try (same gate token) finishes it
    make("us-east-1", coordinator, ledger).execute(ROLE, "d1", token,
                                                   lambda run: started.append(run.token))
    assert len(started) == 1 and started[0] > token
    assert ledger.latest(ROLE, "d1").state is RunState.COMPLETED


def test_claim_refuses_to_start_work_after_a_fence_during_the_claim(world) -> None:
    coordinator, ledger = world
    singleton = make("us-east-1", coordinator, ledger)
    real_write = ledger.begin

    def begin(role):  # type: ignore[no-untyped-def]
        writer = real_write(role)
        write = writer.write

        def fencing_write(record):  # type: ignore[no-untyped-def]
            write(record)
            fence_now(coordinator.created[-1])
        writer.write = fencing_write
        return writer

    ledger.begin = begin
    entered = []
    with pytest.raises(FencedError):
        with singleton.claim(ROLE, "d1") as run:
            entered.append(run)
    assert entered == []


def test_a_fenced_member_is_closed_at_once_while_the_work_still_runs(world) -> None:
    """Issue 9 item 4: the successor need not wait for uncancellable work to end."""
    coordinator, ledger = world
    singleton = make("us-east-1", coordinator, ledger)
    release = threading.Event()
    with pytest.raises(FencedError):
        with singleton.claim(ROLE, "d1") as run:
            member = coordinator.created[-1]
            member.fence()
            deadline = time.monotonic() + 10
            while not member.closed:  # closed by the watchdog, the work still running
                assert time.monotonic() < deadline, "the fenced member was left open"
                release.wait(0.01)
            successor = make("eu-west-1", coordinator, ledger)
            assert successor.leads(ROLE, 5), "the successor leads while the work runs on"
            run.check()


def test_reset_lets_a_completed_run_key_run_again_with_a_larger_token(world) -> None:
    coordinator, ledger = world
    first = make("us-east-1", coordinator, ledger).run(ROLE, "d1", lambda run: run.token)
    with pytest.raises(ValueError, match="reason"):
        make("us-east-1", coordinator, ledger).reset(ROLE, "d1", " ")
    record = make("us-east-1", coordinator, ledger).reset(ROLE, "d1", "alice: bad input data")
    assert record.state is RunState.RESET and record.token > first
    assert record.reason == "alice: bad input data" and record.deployment == "us-east-1"
    with make("eu-west-1", coordinator, ledger).claim(ROLE, "d1") as run:
        assert run.outcome is Outcome.RUN and run.token > record.token
        assert run.record == record
    assert ledger.history(ROLE, "d1") == [RunState.RUNNING, RunState.COMPLETED, RunState.RESET,
                                          RunState.RUNNING, RunState.COMPLETED]
    assert ledger.latest(ROLE, "d1").attempt == 1


def test_reset_refuses_a_run_in_progress_or_never_run(world) -> None:
    coordinator, ledger = world
    make("us-east-1", coordinator, ledger).reserve(ROLE, "d1")
    with pytest.raises(ValueError, match="in progress"):
        make("us-east-1", coordinator, ledger).reset(ROLE, "d1", "bob")
    with pytest.raises(ValueError, match="nothing to reset"):
        make("us-east-1", coordinator, ledger).reset(ROLE, "d2", "bob")
    assert ledger.history(ROLE, "d1") == [RunState.CLAIMED]


def test_execute_after_a_crashed_execution_takes_a_new_larger_token(world) -> None:
    coordinator, ledger = world
    reservation = make("us-east-1", coordinator, ledger).reserve(ROLE, "d1")
    # an executor recorded RUNNING, then its process died: simulate by writing RUNNING directly
    writer = ledger.begin(ROLE)
    claimed = writer.replay().latest("d1")
    writer.write(claimed.advance(RunState.RUNNING, at=claimed.at + 1))
    tokens = []
    make("us-east-1", coordinator, ledger).execute(ROLE, "d1", reservation.token,
                                                   lambda run: tokens.append(run.token))
    assert tokens and tokens[0] > reservation.token
    assert ledger.latest(ROLE, "d1").state is RunState.COMPLETED


def test_execute_without_leadership_raises_acquire_timeout(world) -> None:
    coordinator, ledger = world
    reservation = make("us-east-1", coordinator, ledger).reserve(ROLE, "d1")
    coordinator.hold.add("acme." + ROLE)
    with pytest.raises(AcquireTimeoutError, match="CLAIMED by deployment 'us-east-1'"):
        make("us-east-1", coordinator, ledger, acquire_timeout=0.2).execute(
            ROLE, "d1", reservation.token, lambda run: None)


def test_role_groups_are_namespaced_and_share_the_leader_topic() -> None:
    config = SingletonConfig(neli=NeliConfig(bootstrap_servers="k:9092"), namespace="acme",
                             deployment="us-east-1")
    a, b = config.role_neli("billing"), config.role_neli("daily_flights")
    assert (a.resolved.group_id, b.resolved.group_id) == ("acme.billing", "acme.daily_flights")
    assert a.resolved.topic == b.resolved.topic == "acme.neli"


def test_expire_tombstones_only_finished_run_keys_past_retention(world) -> None:
    coordinator, ledger = world
    singleton = make("us-east-1", coordinator, ledger)
    singleton.run(ROLE, "old", lambda run: None)
    claimed = singleton.reserve(ROLE, "claimed")
    assert singleton.expire(ROLE, retention=3600) == []
    later = make("us-east-1", coordinator, ledger, wall_clock=lambda: time.time() + 7200)
    assert later.expire(ROLE, retention=3600) == ["old"]
    assert ledger.latest(ROLE, "old") is None
    assert ledger.latest(ROLE, "claimed").state is RunState.CLAIMED
    with later.claim(ROLE, "after") as run:
        assert run.token > claimed.token, "tokens keep increasing after expiry"


APP = "standalone application driver-20130105000000-0001 on spark://10.0.0.5:6066"


def test_an_application_a_dead_try_named_is_handed_to_the_next_claim_until_it_is_stopped(world):
    coordinator, ledger = world
    reservation = make("us-east-1", coordinator, ledger).reserve(ROLE, "d1")
    # the executor named its cluster-mode driver, then its process died
    writer = ledger.begin(ROLE)
    claimed = writer.replay().latest("d1")
    running = claimed.advance(RunState.RUNNING, at=claimed.at + 1)
    writer.write(running)
    writer.write(running.advance(RunState.RUNNING, at=claimed.at + 2, application=APP))
    seen = []

    def work(run):  # what the fenced Spark task does before it submits its own driver
        seen.append(run.unstopped)
        run.record_stopped(APP)
        seen.append(run.unstopped)
        run.record_application("standalone application driver-2 on spark://10.0.0.5:6066")

    make("us-east-1", coordinator, ledger).execute(ROLE, "d1", reservation.token, work)
    assert seen == [(APP,), ()]
    latest = ledger.latest(ROLE, "d1")
    assert latest.state is RunState.COMPLETED and latest.token > reservation.token
    assert latest.unstopped == () and "driver-2" in latest.application
    with pytest.raises(ValueError, match="not among this run's unstopped"):
        with make("us-east-1", coordinator, ledger).claim(ROLE, "d2") as run:
            run.record_stopped(APP)


def test_an_application_not_confirmed_stopped_stays_with_the_run_key(world) -> None:
    from neli_orchestrate.errors import WorkNotStopped

    coordinator, ledger = world
    east = make("us-east-1", coordinator, ledger, max_attempts=5)
    with pytest.raises(WorkNotStopped), east.claim(ROLE, "d1") as run:
        run.record_application(APP)
        raise WorkNotStopped("timed out; kill not confirmed", application=APP)
    assert ledger.latest(ROLE, "d1").unstopped == (APP,)
    # the retry inherits it; failing again for another reason keeps it, and so does success
    with pytest.raises(RuntimeError), east.claim(ROLE, "d1") as run:
        assert run.should_run and run.unstopped == (APP,)
        raise RuntimeError("the cluster manager did not answer")
    assert ledger.latest(ROLE, "d1").unstopped == (APP,)
    # a try that cannot stop its own application either: both stay
    own = "standalone application driver-3 on spark://10.0.0.5:6066"
    with pytest.raises(WorkNotStopped), east.claim(ROLE, "d1") as run:
        run.record_application(own)
        raise WorkNotStopped("timed out again", application=own)
    assert ledger.latest(ROLE, "d1").unstopped == (APP, own)
    # the next try stops its own but not the other; a held run's updates end with it
    with east.claim(ROLE, "d1") as run:
        run.record_stopped(own)
        held = run
    completed = ledger.latest(ROLE, "d1")
    assert completed.state is RunState.COMPLETED and completed.unstopped == (APP,)  # shown
    with pytest.raises(RuntimeError, match="already ended"):
        held.record_application(APP)


def test_execute_takes_the_gates_claim_whole_and_the_loose_form_is_the_same(world) -> None:
    coordinator, ledger = world
    gate = make("us-east-1", coordinator, ledger)
    whole, loose = gate.reserve(ROLE, "d1"), gate.reserve(ROLE, "d2")
    assert whole.claim is not None and loose.token is not None
    executor = make("us-east-1", coordinator, ledger)
    seen: list[tuple[str, int | None, str | None]] = []

    def work(run: Run) -> str:
        seen.append((run.run_key, run.token, run.deployment))
        return run.run_key

    assert executor.execute(whole.claim, work) == "d1"
    assert executor.execute(ROLE, "d2", loose.token, work) == "d2"
    assert seen == [("d1", whole.token, "us-east-1"), ("d2", loose.token, "us-east-1")]
    for run_key, token in (("d1", whole.token), ("d2", loose.token)):
        assert ledger.history(ROLE, run_key) == [RunState.CLAIMED, RunState.RUNNING,
                                                 RunState.COMPLETED]
        assert ledger.latest(ROLE, run_key).token == token
    with pytest.raises(ConfigError, match="names no role"):
        executor.execute(Claim(token=1, run_key="d3"), work)
