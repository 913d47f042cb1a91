"""Release hints: a departing leader's nudge to its followers, which must never grant anything.

Two members share one fake cluster; the test plays the group coordinator. A hint makes a
follower ask the coordinator early (``rejoin``); only an assignment plus the member's own
heartbeat read back plus an accepted commit make it lead. The last test breaks the rule on
purpose (a member that trusts hints) and shows that the exclusivity check catches it.
"""

from __future__ import annotations

import pytest
from core_fakes import FakeClients, FakeCluster, FakeConsumer

from neli_orchestrate.core.clock import FakeClock
from neli_orchestrate.core.config import NeliConfig
from neli_orchestrate.core.events import LeaderEvent
from neli_orchestrate.core.heartbeat import Heartbeat, ReleaseHint, decode_heartbeat, decode_hint
from neli_orchestrate.core.hints import _NUDGE_RETRIES, _NUDGE_RETRY
from neli_orchestrate.core.neli import Neli

SETTINGS: dict[str, object] = dict(
    bootstrap_servers="fake:0", group_id="g", session_timeout=1.0, heartbeat_timeout=0.3,
    heartbeat_interval=0.05, min_poll_interval=0.01, group_heartbeat_interval=0.05,
    clock_error=0.05, max_poll_interval=30.0, group_protocol="consumer",
)


def member(cluster: FakeCluster, name: str, cls: type[Neli] = Neli,
           **overrides: object) -> tuple[Neli, list[LeaderEvent]]:
    events: list[LeaderEvent] = []
    neli = cls(NeliConfig(**{**SETTINGS, "name": name, **overrides}),  # type: ignore[arg-type]
               events.append, clock=cluster.clock, kafka=FakeClients(cluster))
    return neli, events


def hints_in(cluster: FakeCluster, partition: int = 0) -> list[ReleaseHint]:
    found = [decode_hint(r.value) for r in cluster.logs[partition]]
    return [h for h in found if h is not None]


def pair(cls: type[Neli] = Neli) -> tuple[FakeCluster, Neli, Neli]:
    """Leader A (assigned partition 0, leading) and follower B (assigned nothing)."""
    cluster = FakeCluster(clock=FakeClock())
    a, _ = member(cluster, "A")
    consumer_a = cluster.consumer
    b, _ = member(cluster, "B", cls)
    consumer_a.assign(0)
    assert a.pulse(0.2) and not b.pulse(0.05)
    return cluster, a, b


def consumer_of(cluster: FakeCluster, index: int):  # type: ignore[no-untyped-def]
    return cluster.consumers[index]


# -- the departing leader ------------------------------------------------------------------------

def test_closing_leader_writes_a_release_hint_only_after_its_revoke_barrier() -> None:
    cluster = FakeCluster(clock=FakeClock())
    barrier_done: list[str] = []

    def barrier(event: LeaderEvent) -> None:
        barrier_done.append(type(event).__name__)

    a = Neli(NeliConfig(**{**SETTINGS, "name": "A"}), barrier,  # type: ignore[arg-type]
             clock=cluster.clock, kafka=FakeClients(cluster))
    cluster.consumer.assign(0)
    assert a.pulse(0.2)
    producer = cluster.producer
    seen_when_sent: list[list[str]] = []
    send = producer.send

    def spy(partition: int, key: bytes, value: bytes, on_delivery=None) -> None:  # type: ignore[no-untyped-def]
        if decode_hint(value) is not None:
            seen_when_sent.append(list(barrier_done))
        send(partition, key, value, on_delivery)

    producer.send = spy  # type: ignore[method-assign]
    a.close()
    assert seen_when_sent == [["LeaderAcquired", "LeaderRevoked"]], \
        "one hint, written once the barrier had finished with the revocation"
    assert [h.member for h in hints_in(cluster)] == [a.member_id]


def test_a_member_that_held_nothing_writes_no_hint() -> None:
    cluster = FakeCluster(clock=FakeClock())
    a, _ = member(cluster, "A")
    a.pulse(0.05)
    a.close()
    assert hints_in(cluster) == []


def test_hints_can_be_switched_off() -> None:
    cluster = FakeCluster(clock=FakeClock())
    a, _ = member(cluster, "A", release_hints=False)
    cluster.consumer.assign(0)
    assert a.pulse(0.2)
    a.close()
    assert hints_in(cluster) == [] and cluster.watchers == []


def test_a_hint_is_not_a_heartbeat() -> None:
    key, value = ReleaseHint(member="A#1", sent_wall=1.0).encode()
    assert decode_heartbeat(key, value) is None
    assert decode_hint(value) == ReleaseHint(member="A#1", sent_wall=1.0)


# -- the follower --------------------------------------------------------------------------------

def test_follower_watches_exactly_the_role_partitions_it_does_not_own() -> None:
    cluster = FakeCluster(clock=FakeClock(), partitions=2)
    b, _ = member(cluster, "B", roles=(0, 1))
    watcher = cluster.watchers[-1]
    assert watcher.history == [], "nothing is read before the first pulse"
    b.pulse(0.01)
    assert watcher.history[-1] == [0, 1]
    cluster.consumer.assign(1)
    b.pulse(0.2)
    assert watcher.history[-1] == [0]
    cluster.consumer.revoke(1)
    b.pulse(0.05)
    assert watcher.history[-1] == [0, 1]


def test_follower_nudges_on_a_hint_and_leads_only_once_assigned() -> None:
    cluster, a, b = pair()
    consumer_b = consumer_of(cluster, 1)
    a.close()
    assert not b.pulse(0.05)
    assert consumer_b.rejoins == 1, "the hint made the follower ask for its assignment"
    assert not b.is_leader, "a hint is not an assignment"
    consumer_b.assign(0)
    assert b.pulse(0.2), "assigned and own heartbeat read back: now it leads"


def test_follower_retries_its_nudge_a_few_times_if_no_assignment_follows() -> None:
    cluster, a, b = pair()
    consumer_b = consumer_of(cluster, 1)
    b.pulse(0.05)
    a.close()
    b.pulse(0.001)
    assert consumer_b.rejoins == 1
    for _ in range(20):
        b.pulse(_NUDGE_RETRY / 5)
    b.pulse(2.0)
    assert consumer_b.rejoins == 1 + len(_NUDGE_RETRIES) and not b.is_leader


def test_classic_groups_get_no_hint_watcher_and_no_nudge() -> None:
    # Hurrying a classic group means changing its subscription, which aborts librdkafka when a
    # join is in flight; classic members neither watch for hints nor nudge.
    cluster = FakeCluster(clock=FakeClock())
    a, _ = member(cluster, "A", group_protocol="classic")
    consumer_a = cluster.consumer
    b, _ = member(cluster, "B", group_protocol="classic")
    consumer_b = cluster.consumer
    consumer_a.assign(0)
    assert a.pulse(0.2)
    b.pulse(0.05)
    a.close()
    for _ in range(20):
        b.pulse(_NUDGE_RETRY / 5)
    assert consumer_b.rejoins == 0 and not b.is_leader


def test_a_member_ignores_its_own_hint() -> None:
    cluster = FakeCluster(clock=FakeClock())
    b, _ = member(cluster, "B")
    key, value = ReleaseHint(member=b.member_id, sent_wall=0.0).encode()
    b.pulse(0.01)
    cluster.append(0, key, value)
    b.pulse(0.05)
    assert cluster.consumer.rejoins == 0


# -- exclusivity: a hint grants nothing -----------------------------------------------------------

def forged_hints_grant_nothing(cls: type[Neli]) -> None:
    """While A leads, forged hints (any sender, A's own id included) reach follower B.

    B may nudge, but must never lead while A still owns the partition, and A keeps leading.
    """
    cluster, a, b = pair(cls)
    for sender in ("mallory", a.member_id, b.member_id + "x"):
        key, value = ReleaseHint(member=sender, sent_wall=0.0).encode()
        cluster.append(0, key, value)
        for _ in range(20):  # 1 s of fake time, both members pulsing in turn
            a.pulse(0.025)
            b.pulse(0.025)
            assert not (a.is_leader and b.is_leader), f"two leaders after a hint from {sender}"
            assert not b.is_leader, f"follower leads on a hint from {sender} alone"
        assert a.is_leader, "a forged hint must not disturb the leader"
    assert consumer_of(cluster, 1).rejoins >= 1, "the follower did read the hints"


def test_forged_or_early_hints_never_make_a_follower_lead() -> None:
    forged_hints_grant_nothing(Neli)


def test_a_hint_on_an_owned_partition_is_no_evidence() -> None:
    cluster = FakeCluster(clock=FakeClock())
    a, events = member(cluster, "A")
    cluster.produce_blocked = True           # A's own heartbeats never arrive
    cluster.consumer.assign(0)
    a.pulse(0.05)
    key, value = ReleaseHint(member=a.member_id, sent_wall=0.0).encode()
    cluster.append(0, key, value)
    for _ in range(10):
        assert not a.pulse(0.05)
    assert events == []


class TrustingHints(Neli):
    """Deliberately broken: treats a release hint as the leader's word that it may take over."""

    def _on_hint(self, partition, hint, now):  # type: ignore[no-untyped-def]
        super()._on_hint(partition, hint, now)
        self._state.assign([partition], now)        # "the partition is mine now"
        beat = self._state.heartbeat_for(partition, now, self._clock.time())
        self._state.counters["own_heartbeats"] += 1
        self._state.partition(partition).evidence = beat.sent_at  # type: ignore[union-attr]
        self._state.commit_issued({partition: 0}, now)
        self._state.commit_done({partition: 0}, None)


def test_the_exclusivity_check_catches_a_member_that_trusts_hints() -> None:
    with pytest.raises(AssertionError, match="two leaders|leads on a hint"):
        forged_hints_grant_nothing(TrustingHints)


# -- a leader that goes quiet without a hint (crash, stall) ----------------------------------------

def test_classic_follower_does_not_rejoin_when_the_leader_goes_quiet() -> None:
    # A quiet leader may be running a long revoke barrier inside close(); a classic rejoin
    # would start a rebalance that takes the partition away before the barrier returns.
    cluster, a, b = pair()
    consumer_b = consumer_of(cluster, 1)
    for _ in range(10):
        a.pulse(0.02)
        b.pulse(0.02)
    for _ in range(40):
        b.pulse(0.05)
    assert consumer_b.rejoins == 0 and not b.is_leader


def slow_pair_whose_leader_goes_quiet() -> tuple[FakeCluster, Neli, FakeConsumer]:
    """KIP-848, 3 s session, 1 s group heartbeat: A leads, B follows, then A stops pulsing."""
    cluster = FakeCluster(clock=FakeClock())
    slow = dict(group_protocol="consumer", session_timeout=3.0, heartbeat_timeout=1.0,
                group_heartbeat_interval=1.0, heartbeat_interval=0.25, clock_error=0.5)
    a, _ = member(cluster, "A", **slow)
    consumer_a = cluster.consumer
    b, _ = member(cluster, "B", **slow)
    consumer_b = cluster.consumer
    consumer_a.assign(0)
    assert a.pulse(0.3)
    for _ in range(8):
        a.pulse(0.1)
        b.pulse(0.1)
    return cluster, b, consumer_b


def test_kip_848_follower_heartbeats_around_the_quiet_leaders_session_deadline() -> None:
    cluster, b, consumer_b = slow_pair_whose_leader_goes_quiet()
    silent_from = cluster.clock.monotonic()
    rejoins_at: list[float] = []
    while cluster.clock.monotonic() < silent_from + 5.0:
        before = consumer_b.rejoins
        b.pulse(0.01)
        if consumer_b.rejoins > before:
            rejoins_at.append(cluster.clock.monotonic() - silent_from)
    assert len(rejoins_at) > 10, "a burst of heartbeats around the deadline"
    assert min(rejoins_at) > 3.0 - 1.0 - 0.3, "none long before the session can have ended"
    assert max(rejoins_at) < 3.0 + 1.0, "and none long after"
    assert not b.is_leader


# -- many groups on one partition (a Singleton's roles share partition 0) -------------------------

def test_a_hint_of_another_group_on_the_shared_partition_is_not_news() -> None:
    cluster, a, b = pair()
    consumer_b = consumer_of(cluster, 1)
    key, value = ReleaseHint(member="other#1", sent_wall=1.0, group="another-role").encode()
    cluster.append(0, key, value)
    b.pulse(0.05)
    assert consumer_b.rejoins == 0, "another role's leader left, not ours"
    key, value = ReleaseHint(member="old#1", sent_wall=1.0).encode()
    cluster.append(0, key, value)
    b.pulse(0.05)
    assert consumer_b.rejoins == 1, "a hint without a group (an older writer) still counts"
    a.close()
    b.pulse(0.05)
    assert consumer_b.rejoins >= 2, "our own leader's hint does"


def test_other_groups_heartbeats_do_not_hide_our_quiet_leader() -> None:
    """The follower's silence watch must count only its own group's records: with another
    role's leader heartbeating on the same partition, ours still goes quiet."""
    cluster, b, consumer_b = slow_pair_whose_leader_goes_quiet()
    silent_from = cluster.clock.monotonic()
    seq = 0
    rejoins_at: list[float] = []
    while cluster.clock.monotonic() < silent_from + 5.0:
        seq += 1
        key, value = Heartbeat(member="other#1", seq=seq, sent_at=0.0, sent_wall=0.0,
                               group="another-role").encode()
        cluster.append(0, key, value)
        before = consumer_b.rejoins
        b.pulse(0.05)
        if consumer_b.rejoins > before:
            rejoins_at.append(cluster.clock.monotonic() - silent_from)
    assert len(rejoins_at) > 10, "a burst of heartbeats around our leader's deadline"
    assert min(rejoins_at) > 3.0 - 1.0 - 0.3


def test_heartbeats_and_hints_name_their_group() -> None:
    cluster, a, b = pair()
    beats = [decode_heartbeat(r.key, r.value) for r in cluster.logs[0]]
    assert {h.group for h in beats if h is not None} == {"g"}
    a.close()
    assert [h.group for h in hints_in(cluster)] == ["g"]
