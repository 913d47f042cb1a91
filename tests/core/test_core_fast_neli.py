"""Fast NELI state machine, driven by a fake clock and a fake Kafka seam (no broker).

The test plays the group coordinator: it assigns, revokes and loses partitions, decides
whether offset commits are accepted and whether heartbeats reach the partition.
"""

from __future__ import annotations

import threading

import pytest
from core_fakes import FakeClients, FakeCluster, kinds

from neli_orchestrate.core.clock import FakeClock
from neli_orchestrate.core.config import NeliConfig
from neli_orchestrate.core.events import (
    REASON_BARRIER_OVERRAN,
    REASON_HEARTBEAT_TIMEOUT,
    REASON_MAX_POLL,
    REASON_MEMBERSHIP_UNCONFIRMED,
    REASON_PARTITION_LOST,
    LeaderAcquired,
    LeaderEvent,
    LeaderFenced,
    LeaderRevoked,
)
from neli_orchestrate.core.heartbeat import Heartbeat
from neli_orchestrate.core.neli import Neli
from neli_orchestrate.errors import KafkaUnavailableError, NeliError

SESSION = 1.0
HB_TIMEOUT = 0.3
HB_INTERVAL = 0.05
GROUP_HB = 0.05
CLOCK_ERROR = 0.05
#: a leader's lease after its newest accepted commit while its evidence stalls undisproved
#: (protocol.md, 8a; the fake broker's configuration is unreadable, so groups are classic)
RIDE = SESSION - CLOCK_ERROR - (SESSION - HB_TIMEOUT) / 2


class Recorder:
    """A barrier that records events and what is_leader said while each one ran."""

    def __init__(self) -> None:
        self.events: list[LeaderEvent] = []
        self.leader_during: list[bool] = []
        self.neli: Neli | None = None

    def __call__(self, event: LeaderEvent) -> None:
        self.events.append(event)
        if self.neli is not None:
            self.leader_during.append(self.neli.is_leader)


def make(cluster: FakeCluster | None = None, *, clock: FakeClock | None = None,
         barrier: object = None, **overrides: object) -> tuple[Neli, FakeCluster, Recorder]:
    clock = clock or FakeClock()
    cluster = cluster or FakeCluster(clock=clock)
    recorder = Recorder()
    settings: dict[str, object] = dict(
        bootstrap_servers="fake:0", group_id="g", name="member", session_timeout=SESSION,
        heartbeat_timeout=HB_TIMEOUT, heartbeat_interval=HB_INTERVAL, min_poll_interval=0.01,
        group_heartbeat_interval=GROUP_HB, clock_error=CLOCK_ERROR, max_poll_interval=30.0,
    )
    settings.update(overrides)
    neli = Neli(NeliConfig(**settings), barrier or recorder,  # type: ignore[arg-type]
                clock=clock, kafka=FakeClients(cluster))
    recorder.neli = neli
    return neli, cluster, recorder


def lead(neli: Neli, cluster: FakeCluster, partition: int = 0) -> None:
    cluster.consumer.assign(partition)
    assert neli.pulse(0.2), "member should lead once assigned and its heartbeat is read back"


# -- acquisition ---------------------------------------------------------------------------------

def test_member_leads_only_once_assigned_and_its_own_heartbeat_is_read_back() -> None:
    neli, cluster, rec = make()
    assert neli.pulse(0.2) is False
    assert rec.events == []

    cluster.consumer.assign(0)
    assert neli.pulse(0.2) is True
    assert kinds(rec.events) == ["LeaderAcquired"]
    acquired = rec.events[0]
    assert acquired.role == 0 and acquired.partition == 0
    assert acquired.member == neli.member_id
    # reading starts exactly at the member's first heartbeat: nothing older is read
    first = cluster.logs[0][0]
    assert cluster.consumer.trace == ["assign:0@0"]
    assert first.key == neli.member_id.encode()


def test_reading_starts_at_own_first_heartbeat_so_older_records_are_never_read() -> None:
    clock = FakeClock()
    cluster = FakeCluster(clock=clock)
    for seq in range(5):
        cluster.append_foreign_heartbeat(0, "previous-leader#1", seq)
    neli, cluster, rec = make(cluster, clock=clock)
    lead(neli, cluster)
    assert cluster.consumer.trace == ["assign:0@5"]
    assert neli.stats["foreign_records"] == 0


def test_pulse_returns_as_soon_as_leadership_arrives() -> None:
    clock = FakeClock()
    neli, cluster, rec = make(clock=clock)
    cluster.consumer.assign(0)
    start = clock.monotonic()
    assert neli.pulse(5.0)
    assert clock.monotonic() - start < 0.5


def test_own_heartbeat_without_accepted_commit_does_not_lead() -> None:
    neli, cluster, rec = make()
    cluster.commit_error = "UNKNOWN_MEMBER_ID"
    cluster.consumer.assign(0)
    assert neli.pulse(0.5) is False
    assert neli.stats["own_heartbeats"] > 0
    assert rec.events == []

    cluster.commit_error = None   # the coordinator confirms membership again
    assert neli.pulse(0.5) is True
    assert kinds(rec.events) == ["LeaderAcquired"]


def test_foreign_heartbeats_never_count_even_with_the_same_member_name() -> None:
    neli, cluster, rec = make()
    cluster.produce_blocked = True       # our own heartbeats never reach the partition
    cluster.consumer.assign(0)
    twin = neli.member_id.split("#")[0] + "#deadbeef"   # same configured name, other process
    for seq in range(1, 50):
        cluster.append_foreign_heartbeat(0, twin, seq)
        cluster.append_foreign_heartbeat(0, "someone-else", seq)
        cluster.append(0, None, b"not a heartbeat")
        neli.pulse(0.02)
    assert neli.is_leader is False
    assert rec.events == []
    assert neli.stats["foreign_records"] >= 100


def test_replayed_own_heartbeat_from_before_the_assignment_does_not_count() -> None:
    neli, cluster, rec = make()
    cluster.produce_blocked = True
    cluster.consumer.assign(0)
    neli.pulse(0.02)
    # A record that carries our member id but a sequence number we never sent on this
    # assignment (e.g. written before a previous revoke) is no proof of anything.
    beat = Heartbeat(member=neli.member_id, seq=999, sent_at=0.0, sent_wall=0.0)
    cluster.append(0, *beat.encode())
    neli.pulse(0.1)
    assert neli.is_leader is False


# -- leases and fences ---------------------------------------------------------------------------

def test_is_leader_turns_false_at_read_time_when_nobody_pulses() -> None:
    clock = FakeClock()
    neli, cluster, rec = make(clock=clock)
    lead(neli, cluster)
    deadline = neli.leadership_deadline()
    assert deadline is not None and deadline - clock.monotonic() <= RIDE + 1e-9

    clock.advance_to(deadline)          # the polling thread is stuck: no pulse at all
    assert neli.is_leader is False       # ...yet the lease is evaluated when read
    assert neli.leads(0) is False
    assert neli.leadership_deadline() is None
    assert kinds(rec.events) == ["LeaderAcquired"]

    neli.pulse(0)   # the fence is reported first (its own heartbeats may then renew the lease)
    assert kinds(rec.events)[:2] == ["LeaderAcquired", "LeaderFenced"]
    fenced = rec.events[1]
    assert fenced.timestamp == pytest.approx(deadline)   # when leadership really ended
    assert fenced.reason in (REASON_HEARTBEAT_TIMEOUT, REASON_MEMBERSHIP_UNCONFIRMED)


def test_leadership_is_kept_while_pulsing() -> None:
    clock = FakeClock()
    neli, cluster, rec = make(clock=clock)
    lead(neli, cluster)
    start = clock.monotonic()
    while clock.monotonic() - start < 10 * HB_TIMEOUT:
        assert neli.pulse(0.05)
    assert kinds(rec.events) == ["LeaderAcquired"]
    assert neli.stats["own_heartbeats"] > 20


def test_fenced_when_own_heartbeats_stop_then_leader_again_when_they_resume() -> None:
    clock = FakeClock()
    neli, cluster, rec = make(clock=clock)
    lead(neli, cluster)

    cluster.produce_blocked = True
    start = clock.monotonic()
    while neli.is_leader:
        neli.pulse(0.05)
        # the leader rides through (its commits still prove membership) up to the bound
        assert clock.monotonic() - start < RIDE + 2 * HB_INTERVAL
    assert kinds(rec.events) == ["LeaderAcquired", "LeaderFenced"]
    assert rec.events[1].reason == REASON_HEARTBEAT_TIMEOUT
    assert rec.events[1].timestamp - start <= RIDE + HB_INTERVAL

    cluster.produce_blocked = False      # connectivity back, partition still assigned
    assert neli.pulse(0.5)
    assert kinds(rec.events) == ["LeaderAcquired", "LeaderFenced", "LeaderAcquired"]


@pytest.mark.parametrize("error", ["UNKNOWN_MEMBER_ID", "FENCED_MEMBER_EPOCH"])
def test_commits_rejected_for_an_unknown_member_fence_as_membership_unconfirmed(
        error: str) -> None:
    clock = FakeClock()
    neli, cluster, rec = make(clock=clock)
    lead(neli, cluster)
    cluster.commit_error = error
    start = clock.monotonic()
    while neli.is_leader:
        neli.pulse(0.05)
        assert clock.monotonic() - start < 2 * HB_TIMEOUT
    assert isinstance(rec.events[-1], LeaderFenced)
    assert rec.events[-1].reason == REASON_MEMBERSHIP_UNCONFIRMED


@pytest.mark.parametrize("error", ["_TRANSPORT", "REQUEST_TIMED_OUT", "NOT_COORDINATOR"])
def test_stall_errors_ride_through_until_the_bound_then_fence(error: str) -> None:
    """A coordinator that cannot answer (a broker crash) neither proves nor disproves
    membership: the leader keeps its lease up to the newest proof + RIDE, never longer."""
    clock = FakeClock()
    neli, cluster, rec = make(clock=clock)
    lead(neli, cluster)
    proven = neli._state.membership_proven_at
    assert proven is not None
    cluster.commit_error = error
    while neli.is_leader:
        neli.pulse(0.05)
        assert clock.monotonic() < proven + RIDE + 2 * HB_INTERVAL
    assert clock.monotonic() >= proven + RIDE - 2 * HB_INTERVAL
    assert kinds(rec.events) == ["LeaderAcquired", "LeaderFenced"]
    assert rec.events[-1].reason == REASON_MEMBERSHIP_UNCONFIRMED
    assert rec.events[-1].timestamp <= proven + RIDE


def test_transient_commit_rejection_does_not_fence_a_healthy_leader() -> None:
    clock = FakeClock()
    neli, cluster, rec = make(clock=clock)
    lead(neli, cluster)
    cluster.commit_error = "_TIMED_OUT"
    neli.pulse(HB_TIMEOUT / 3)
    cluster.commit_error = None
    for _ in range(20):
        assert neli.pulse(0.05)
    assert kinds(rec.events) == ["LeaderAcquired"]


@pytest.mark.parametrize("error", ["ILLEGAL_GENERATION", "REBALANCE_IN_PROGRESS",
                                   "STALE_MEMBER_EPOCH"])
def test_rebalance_rejections_still_prove_membership(error: str) -> None:
    """The coordinator checks the member id before the generation: still a member."""
    clock = FakeClock()
    neli, cluster, rec = make(clock=clock)
    lead(neli, cluster)
    cluster.commit_error = error     # a contender keeps the group rebalancing
    start = clock.monotonic()
    while clock.monotonic() - start < 5 * HB_TIMEOUT:
        assert neli.pulse(0.05)
    assert kinds(rec.events) == ["LeaderAcquired"]
    assert neli.stats["commits_member_known"] > 0


def test_stall_past_the_session_cannot_be_mistaken_for_leadership_on_resume() -> None:
    """A paused leader (SIGSTOP, GC) reports not-leader before anything else on resume."""
    clock = FakeClock()
    neli, cluster, rec = make(clock=clock)
    lead(neli, cluster)
    # Heartbeats written just before the pause sit unread in the client's buffer.
    neli.pulse(0.01)
    clock.advance(3 * SESSION)               # paused; the group gave the partition away
    cluster.commit_error = "UNKNOWN_MEMBER_ID"  # the coordinator no longer knows us
    assert neli.is_leader is False           # right away, before any poll
    neli.pulse(0.2)                          # buffered and fresh own heartbeats are read...
    assert neli.is_leader is False           # ...but membership is not confirmed
    assert kinds(rec.events) == ["LeaderAcquired", "LeaderFenced"]
    cluster.consumer.lose(0)                 # librdkafka learns it was removed
    neli.pulse(0.05)
    assert kinds(rec.events) == ["LeaderAcquired", "LeaderFenced"]
    assert neli.is_leader is False


def test_short_stall_is_reported_as_fence_then_acquire_not_silently_healed() -> None:
    clock = FakeClock()
    neli, cluster, rec = make(clock=clock)
    lead(neli, cluster)
    clock.advance(RIDE + CLOCK_ERROR / 2)    # below the session timeout: still a member
    neli.pulse(0.2)
    assert neli.is_leader
    assert kinds(rec.events) == ["LeaderAcquired", "LeaderFenced", "LeaderAcquired"]


def test_lost_partition_fences_at_once() -> None:
    neli, cluster, rec = make()
    lead(neli, cluster)
    cluster.consumer.lose(0)
    neli.pulse(0.01)
    assert neli.is_leader is False
    assert kinds(rec.events) == ["LeaderAcquired", "LeaderFenced"]
    assert rec.events[1].reason == REASON_PARTITION_LOST


def test_max_poll_expiry_fences_every_role() -> None:
    neli, cluster, rec = make()
    lead(neli, cluster)
    cluster.consumer.fault("_MAX_POLL_EXCEEDED")
    neli.pulse(0.01)
    assert neli.is_leader is False
    assert rec.events[-1].reason == REASON_MAX_POLL


def test_fatal_client_error_fences_and_raises() -> None:
    neli, cluster, rec = make()
    lead(neli, cluster)
    cluster.consumer.fault("_FENCED", fatal=True)
    with pytest.raises(KafkaUnavailableError, match="_FENCED"):
        neli.pulse(0.01)
    assert neli.is_leader is False
    assert isinstance(rec.events[-1], LeaderFenced)
    neli.close()


def test_transient_consumer_error_changes_nothing() -> None:
    neli, cluster, rec = make()
    lead(neli, cluster)
    cluster.consumer.fault("_TRANSPORT")
    assert neli.pulse(0.01)
    assert kinds(rec.events) == ["LeaderAcquired"]


# -- revoke barrier ------------------------------------------------------------------------------

def test_revoke_barrier_runs_before_the_partition_is_released() -> None:
    clock = FakeClock()
    trace: list[str] = []
    cluster = FakeCluster(clock=clock)
    seen: list[tuple[str, bool]] = []
    holder: dict[str, Neli] = {}

    def barrier(event: LeaderEvent) -> None:
        neli = holder["neli"]
        seen.append((type(event).__name__, neli.is_leader))
        if isinstance(event, LeaderRevoked):
            trace.extend(cluster.consumer.trace)
            trace.append("barrier-returns")

    neli, cluster, _ = make(cluster, clock=clock, barrier=barrier)
    holder["neli"] = neli
    lead(neli, cluster)
    cluster.consumer.revoke(0)
    neli.pulse(0.01)
    assert trace[-1] == "barrier-returns" and "unassign:0" not in trace
    assert cluster.consumer.trace[-1] == "unassign:0"
    assert seen == [("LeaderAcquired", True), ("LeaderRevoked", False)]


def test_revoked_event_carries_a_deadline_below_the_rebalance_timeout() -> None:
    clock = FakeClock()
    neli, cluster, rec = make(clock=clock, max_poll_interval=10.0, revoke_timeout=7.0)
    lead(neli, cluster)
    cluster.consumer.revoke(0)
    neli.pulse(0.01)
    revoked = rec.events[-1]
    assert isinstance(revoked, LeaderRevoked)
    assert revoked.deadline == pytest.approx(revoked.timestamp + 7.0)
    assert revoked.deadline < revoked.timestamp + 10.0


def test_revoke_barrier_that_overruns_is_fenced_before_the_member_would_be_removed() -> None:
    clock = FakeClock(wait_grace=0.05)
    release = threading.Event()
    events: list[tuple[str, str]] = []

    def barrier(event: LeaderEvent) -> None:
        events.append((type(event).__name__, event.reason))
        if isinstance(event, LeaderRevoked):
            release.wait(10)   # in-flight work that does not finish in time

    neli, cluster, _ = make(clock=clock, barrier=barrier, max_poll_interval=10.0,
                            revoke_timeout=7.0)
    lead(neli, cluster)
    cluster.consumer.revoke(0)
    start = clock.monotonic()
    neli.pulse(0.01)
    release.set()
    assert [name for name, _ in events] == ["LeaderAcquired", "LeaderRevoked", "LeaderFenced"]
    assert events[-1][1] == REASON_BARRIER_OVERRAN
    assert cluster.consumer.trace[-1] == "unassign:0"
    assert clock.monotonic() - start < 10.0   # released before max_poll_interval


def test_barrier_that_raises_does_not_break_the_protocol() -> None:
    def barrier(event: LeaderEvent) -> None:
        raise RuntimeError("bug in user code")

    neli, cluster, _ = make(barrier=barrier)
    lead(neli, cluster)
    cluster.consumer.revoke(0)
    neli.pulse(0.01)
    assert neli.is_leader is False
    cluster.consumer.assign(0)
    assert neli.pulse(0.2)


# -- close ---------------------------------------------------------------------------------------

def test_close_runs_the_revoke_barrier_then_leaves_the_group() -> None:
    neli, cluster, rec = make()
    lead(neli, cluster)
    neli.close()
    assert kinds(rec.events) == ["LeaderAcquired", "LeaderRevoked"]
    assert cluster.consumer.trace[-2:] == ["unassign:0", "left-group"]
    assert cluster.producer.closed
    assert neli.closed and neli.is_leader is False
    assert neli.pulse(0.1) is False
    neli.close()  # idempotent


def test_close_and_pulse_are_refused_inside_the_barrier() -> None:
    errors: list[BaseException] = []
    holder: dict[str, Neli] = {}

    def barrier(event: LeaderEvent) -> None:
        for call in (holder["neli"].close, lambda: holder["neli"].pulse(0)):
            try:
                call()
            except NeliError as exc:
                errors.append(exc)

    neli, cluster, _ = make(barrier=barrier)
    holder["neli"] = neli
    lead(neli, cluster)
    assert len(errors) == 2 and "barrier" in str(errors[0])
    assert not neli.closed
    neli.close()


def test_context_manager_closes() -> None:
    neli, cluster, rec = make()
    with neli:
        lead(neli, cluster)
    assert neli.closed and cluster.consumer.closed


def test_close_from_another_thread_while_a_pulser_runs() -> None:
    clock = FakeClock()
    neli, cluster, rec = make(clock=clock)
    ran = threading.Event()
    pulser = neli.background(task=ran.set)
    cluster.consumer.assign(0)
    assert ran.wait(10), "the task should run once the member leads"
    assert neli.is_leader                        # readable from this (another) thread
    neli.close()
    assert pulser.join(10)
    assert pulser.error is None
    assert kinds(rec.events) == ["LeaderAcquired", "LeaderRevoked"]


def test_task_failure_stops_the_pulser_and_closes_the_member() -> None:
    neli, cluster, rec = make()

    def task() -> None:
        raise ValueError("task failed")

    pulser = neli.background(task)
    cluster.consumer.assign(0)
    assert pulser.join(10)
    assert isinstance(pulser.error, ValueError)
    assert neli.closed
    assert isinstance(rec.events[-1], LeaderRevoked)


def test_second_background_pulser_is_refused() -> None:
    neli, cluster, rec = make()
    pulser = neli.background()
    with pytest.raises(NeliError, match="already"):
        neli.background()
    neli.close()
    assert pulser.join(10)


# -- pulse mechanics, roles ----------------------------------------------------------------------

def test_pulse_zero_polls_at_most_once_per_min_poll_interval() -> None:
    clock = FakeClock()
    neli, cluster, rec = make(clock=clock, min_poll_interval=0.05)
    neli.pulse(0)
    polls = cluster.consumer.polls
    for _ in range(10):
        neli.pulse(0)
    assert cluster.consumer.polls == polls
    clock.advance(0.06)
    neli.pulse(0)
    assert cluster.consumer.polls > polls


def test_pulse_rejects_a_negative_timeout() -> None:
    neli, cluster, rec = make()
    with pytest.raises(ValueError):
        neli.pulse(-1)


def test_heartbeats_carry_member_sequence_and_send_time() -> None:
    from neli_orchestrate.core.heartbeat import decode_heartbeat

    clock = FakeClock()
    neli, cluster, rec = make(clock=clock)
    lead(neli, cluster)
    for _ in range(5):
        neli.pulse(HB_INTERVAL)
    beats = [decode_heartbeat(r.key, r.value) for r in cluster.logs[0]]
    assert all(b is not None and b.member == neli.member_id for b in beats)
    seqs = [b.seq for b in beats if b is not None]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) and len(seqs) >= 3
    assert all(b is not None and b.sent_wall > 1e9 for b in beats)


def test_member_leads_each_role_through_its_own_partition() -> None:
    clock = FakeClock()
    cluster = FakeCluster(clock=clock, partitions=3)
    neli, cluster, rec = make(cluster, clock=clock, roles=(0, 1, 2, "billing"))
    billing = neli.partition_for("billing")
    cluster.consumer.assign(1)
    neli.pulse(0.2)
    assert [neli.leads(r) for r in (0, 1, 2)] == [False, True, False]
    assert neli.leads("billing") is (billing == 1)
    acquired = [e.role for e in rec.events if isinstance(e, LeaderAcquired)]
    assert 1 in acquired and all(neli.partition_for(r) == 1 for r in acquired)
    with pytest.raises(NeliError, match="not one this member"):
        neli.leads(7)


def test_assignment_beyond_the_start_up_partition_count_is_fatal() -> None:
    clock = FakeClock()
    cluster = FakeCluster(clock=clock, partitions=1)
    neli, cluster, rec = make(cluster, clock=clock)
    cluster.logs[1] = []
    cluster.consumer.assign(1)
    with pytest.raises(KafkaUnavailableError, match="grew"):
        neli.pulse(0.1)


def test_neli_satisfies_the_shared_protocol_of_neli_and_mock() -> None:
    from neli_orchestrate.core.neli import NeliLike

    neli, cluster, rec = make()
    assert isinstance(neli, NeliLike)
    neli.close()


def test_a_leader_sends_one_heartbeat_per_interval_not_per_poll() -> None:
    clock = FakeClock()
    neli, cluster, rec = make(clock=clock)
    lead(neli, cluster)
    sent = len(cluster.logs[0])
    start = clock.monotonic()
    while clock.monotonic() - start < 20 * HB_INTERVAL:
        neli.pulse(0.005)
    assert 18 <= len(cluster.logs[0]) - sent <= 22


def test_leadership_deadline_moves_forward_while_heartbeats_come_back() -> None:
    clock = FakeClock()
    neli, cluster, rec = make(clock=clock)
    lead(neli, cluster)
    first = neli.leadership_deadline()
    neli.pulse(3 * HB_INTERVAL)
    second = neli.leadership_deadline()
    assert first is not None and second is not None and second > first
    assert second <= clock.monotonic() + RIDE
