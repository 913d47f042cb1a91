"""Full NELI (mode="full"): broker timestamps, the vector V, grace period, non-exclusive overlap."""

from __future__ import annotations

import pytest
from core_fakes import FakeClients, FakeCluster, kinds

from neli_orchestrate.core.clock import FakeClock
from neli_orchestrate.core.config import NeliConfig
from neli_orchestrate.core.events import REASON_LEASE_EXPIRED, LeaderEvent, LeaderRevoked
from neli_orchestrate.core.neli import Neli
from neli_orchestrate.errors import TopicMismatchError

SESSION = 1.0
T_EXCLUSIVE = 0.3
T_OVERLAP = 3.0
INTERVAL = 0.05


def make(cluster: FakeCluster, *, exclusive: bool = True, **overrides: object
         ) -> tuple[Neli, list[LeaderEvent]]:
    events: list[LeaderEvent] = []
    settings: dict[str, object] = dict(
        bootstrap_servers="fake:0", group_id="g", name="member", mode="full",
        exclusive=exclusive, session_timeout=SESSION,
        heartbeat_timeout=T_EXCLUSIVE if exclusive else T_OVERLAP,
        heartbeat_interval=INTERVAL, min_poll_interval=0.01, group_heartbeat_interval=0.05,
        clock_error=0.05, roles=tuple(range(cluster.partitions)),
    )
    settings.update(overrides)
    neli = Neli(NeliConfig(**settings), events.append,  # type: ignore[arg-type]
                clock=cluster.clock, kafka=FakeClients(cluster))
    return neli, events


def full_cluster(partitions: int = 1) -> FakeCluster:
    return FakeCluster(clock=FakeClock(), partitions=partitions, log_append_time=True,
                       topic_settings={"message.timestamp.type": "LogAppendTime"})


def pulse_for(seconds: float, *members: Neli) -> None:
    clock = None
    for m in members:
        clock = m._clock  # noqa: SLF001 - the shared fake clock
    assert clock is not None
    end = clock.monotonic() + seconds
    while clock.monotonic() < end:
        for m in members:
            m.pulse(0.01)


def test_every_member_broadcasts_to_every_partition_each_interval() -> None:
    cluster = full_cluster(partitions=3)
    neli, _ = make(cluster)              # a follower: nothing assigned
    pulse_for(10 * INTERVAL, neli)
    per_partition = [len(cluster.logs[p]) for p in range(3)]
    assert min(per_partition) >= 8 and len(set(per_partition)) == 1


def test_exclusive_new_assignee_waits_a_grace_period_of_t() -> None:
    cluster = full_cluster()
    neli, events = make(cluster)
    cluster.consumer.assign(0)
    assigned_at = cluster.clock.monotonic()
    while not neli.is_leader:
        neli.pulse(0.01)
        assert cluster.clock.monotonic() - assigned_at < 1.0
    assert events[0].timestamp - assigned_at >= T_EXCLUSIVE - 1e-9
    assert kinds(events) == ["LeaderAcquired"]


def test_leadership_lapses_t_after_the_last_broker_timestamp() -> None:
    cluster = full_cluster()
    neli, events = make(cluster)
    cluster.consumer.assign(0)
    pulse_for(2 * T_EXCLUSIVE, neli)
    assert neli.is_leader
    cluster.produce_blocked = True       # nobody's records reach the partition any more
    clock = cluster.clock
    last = cluster.logs[0][-1].timestamp_ms / 1000 - clock.time() + clock.monotonic()
    pulse_for(2 * T_EXCLUSIVE, neli)
    assert not neli.is_leader
    assert kinds(events) == ["LeaderAcquired", "LeaderFenced"]
    assert events[-1].timestamp == pytest.approx(last + T_EXCLUSIVE, abs=0.02)


def test_a_record_appended_long_ago_but_read_now_is_no_evidence() -> None:
    """The paper's stall case: buffered records are aged by the broker's clock, not receipt."""
    cluster = full_cluster()
    neli, events = make(cluster)
    cluster.produce_blocked = True
    cluster.consumer.assign(0)
    pulse_for(2 * T_EXCLUSIVE, neli)
    stale = int((cluster.clock.time() - 2 * T_EXCLUSIVE) * 1000)
    for _ in range(20):
        cluster.append(0, None, b"old", timestamp_ms=stale)
        neli.pulse(0.01)
    assert not neli.is_leader and events == []


def test_a_broker_clock_ahead_of_ours_cannot_stretch_the_lease() -> None:
    cluster = full_cluster()
    neli, events = make(cluster)
    cluster.produce_blocked = True
    cluster.consumer.assign(0)
    pulse_for(2 * T_EXCLUSIVE, neli)
    future = int((cluster.clock.time() + 60) * 1000)
    cluster.append(0, None, b"from the future", timestamp_ms=future)
    read_at = cluster.clock.monotonic()
    neli.pulse(2 * INTERVAL)           # read it, then prove membership with a commit
    assert neli.is_leader
    deadline = neli.leadership_deadline()
    assert deadline is not None and deadline <= read_at + T_EXCLUSIVE + 0.011


def test_records_without_broker_timestamps_are_ignored() -> None:
    cluster = full_cluster()
    cluster.log_append_time = False      # producer (CreateTime) timestamps
    neli, events = make(cluster)
    cluster.consumer.assign(0)
    pulse_for(3 * T_EXCLUSIVE, neli)
    assert not neli.is_leader
    assert neli.stats["records_without_broker_time"] > 0


def test_exclusive_revoke_ends_leadership_at_once() -> None:
    cluster = full_cluster()
    neli, events = make(cluster)
    cluster.consumer.assign(0)
    pulse_for(2 * T_EXCLUSIVE, neli)
    cluster.consumer.revoke(0)
    neli.pulse(0.01)
    assert not neli.is_leader
    assert kinds(events) == ["LeaderAcquired", "LeaderRevoked"]


def test_exclusive_handover_between_two_members_never_overlaps() -> None:
    cluster = full_cluster()
    a, a_events = make(cluster)
    b, b_events = make(cluster)
    a_consumer, b_consumer = cluster.consumers
    a_consumer.assign(0)
    pulse_for(2 * T_EXCLUSIVE, a, b)
    samples = []
    a_consumer.revoke(0)
    b_consumer.assign(0)
    end = cluster.clock.monotonic() + 3 * T_EXCLUSIVE
    while cluster.clock.monotonic() < end:
        a.pulse(0.01)
        b.pulse(0.01)
        samples.append((a.is_leader, b.is_leader))
    assert (True, True) not in samples
    assert samples[-1] == (False, True)
    assert b_events[0].timestamp >= a_events[-1].timestamp + T_EXCLUSIVE


def test_non_exclusive_leader_keeps_leading_after_revoke_until_t_lapses() -> None:
    cluster = full_cluster()
    a, a_events = make(cluster, exclusive=False)
    b, b_events = make(cluster, exclusive=False)
    a_consumer, b_consumer = cluster.consumers
    a_consumer.assign(0)
    pulse_for(0.2, a, b)
    assert a.is_leader and not b.is_leader      # no grace period in non-exclusive mode
    a_consumer.revoke(0)
    b_consumer.assign(0)
    samples = []
    end = cluster.clock.monotonic() + 2 * T_OVERLAP
    while cluster.clock.monotonic() < end:
        a.pulse(0.01)
        b.pulse(0.01)
        samples.append((a.is_leader, b.is_leader))
    assert (False, False) not in samples        # never zero leaders
    assert (True, True) in samples              # overlap is allowed, and happens
    assert samples[-1] == (False, True)
    assert isinstance(a_events[-1], LeaderRevoked)
    assert a_events[-1].reason == REASON_LEASE_EXPIRED


def test_full_mode_refuses_a_topic_with_producer_timestamps() -> None:
    cluster = full_cluster()
    cluster.topic_settings["message.timestamp.type"] = "CreateTime"
    with pytest.raises(TopicMismatchError, match="LogAppendTime"):
        make(cluster)


def test_full_mode_creates_its_topic_with_broker_timestamps() -> None:
    cluster = FakeCluster(clock=FakeClock(), topic_exists=False)
    make(cluster, partitions=2, roles=(0, 1))
    (topic, partitions, settings), = cluster.created
    assert partitions == 2 and settings["message.timestamp.type"] == "LogAppendTime"


def test_non_exclusive_leader_that_closes_stops_at_once_through_the_barrier() -> None:
    cluster = full_cluster()
    neli, events = make(cluster, exclusive=False)
    cluster.consumer.assign(0)
    pulse_for(0.2, neli)
    assert neli.is_leader
    neli.close()
    assert kinds(events) == ["LeaderAcquired", "LeaderRevoked"]
    assert events[-1].reason == "partition-revoked"
