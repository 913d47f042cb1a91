"""NELI against a real Kafka broker, every member a separate process.

Assertions are about what happened (who led when, in which order); the only timing is the
generous deadline of each wait. Latencies are measured by integration/bench/handover.py.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from core_harness import (
    Member,
    assert_no_overlap,
    leader_among,
    samples_after,
    uncovered,
    wait_for,
)

pytestmark = pytest.mark.kafka

PROTOCOLS = ["classic", "consumer"]
SESSION = 2.0


@pytest.fixture
def spawn(tmp_path: Path, kafka_broker: str) -> Iterator[Any]:
    members: list[Member] = []
    group = f"core.{uuid.uuid4().hex[:10]}"

    def start(name: str, **settings: Any) -> Member:
        # the fast profile, with a session long enough for two busy CI cores
        base = {"bootstrap_servers": kafka_broker, "group_id": group, "profile": "fast",
                "session_timeout": SESSION}
        member = Member(tmp_path, name, **{**base, **settings})
        members.append(member)
        return member

    yield start
    for m in members:
        m.terminate()


def wait_ready_and_pulsing(members: list[Member], samples: int = 5) -> None:
    """Every member has joined and pulsed for a while, so the group has settled."""
    def settled() -> bool:
        ready = [m.lines("ready") for m in members]
        if not all(ready):
            return False
        since = max(r[0]["ts"] for r in ready)
        return all(len(samples_after(m, since)) >= samples for m in members)

    wait_for("every member to join and pulse", settled, members)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_one_leader_among_three_then_close_then_kill(
        spawn: Any, protocol: str, record_property: Any) -> None:
    members = [spawn(f"m{i}", group_protocol=protocol) for i in range(3)]
    first = wait_for("a first leader", lambda: leader_among(members), members)
    wait_ready_and_pulsing(members)
    # joins must not move leadership (cooperative / KIP-848 assignment is incremental)
    assert wait_for("the leader", lambda: leader_among(members), members) is first
    assert [m.name for m in members if m.events("LeaderAcquired")] == [first.name]

    # graceful close: another member leads, after the first one was revoked
    closed_at = time.monotonic()
    first.close()
    others = [m for m in members if m is not first]
    second = wait_for("a leader after the graceful close",
                      lambda: leader_among(others), members)
    assert first.wait_exit() == 0
    revoked = first.events("LeaderRevoked")[-1]
    acquired = second.events("LeaderAcquired")[-1]
    assert revoked["ts"] <= acquired["ts"]
    record_property("handover_after_close_s", acquired["ts"] - closed_at)

    # kill -9: the last member leads once the group notices
    third = next(m for m in others if m is not second)
    killed_at = second.kill()
    wait_for("a leader after kill -9", lambda: leader_among([third]), members)
    gap = third.events("LeaderAcquired")[-1]["ts"] - killed_at
    record_property("failover_after_kill_s", gap)
    print(f"{protocol}: failover {gap:.3f} s after kill -9")

    assert_no_overlap(members)
    assert [m.name for m in members if m.leading()] == [third.name]
    third.close()
    assert third.wait_exit() == 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_paused_leader_reports_fenced_before_it_could_be_told_it_leads(
        spawn: Any, protocol: str) -> None:
    a, b = spawn("a", group_protocol=protocol), spawn("b", group_protocol=protocol)
    leader = wait_for("a first leader", lambda: leader_among([a, b]), [a, b])
    follower = b if leader is a else a
    wait_ready_and_pulsing([a, b])

    stopped_at = leader.stop()   # SIGSTOP: frozen past the session timeout
    wait_for("the follower to take over", lambda: follower.leading(), [follower])
    successor_since = follower.events("LeaderAcquired")[-1]["ts"]
    resumed_at = leader.cont()

    # The resumed member must run for a while and report what it believes.
    wait_for("the resumed member to pulse again",
             lambda: len(samples_after(leader, resumed_at)) >= 10, [a, b])
    after_stop = [e for e in leader.events() if e["seen"] > stopped_at]
    assert after_stop, "the resumed member reported nothing about its leadership"
    assert after_stop[0]["type"] == "LeaderFenced", after_stop
    assert after_stop[0]["ts"] <= successor_since, "its lease must end before the successor"
    assert not any(e["type"] == "LeaderAcquired" for e in after_stop), after_stop
    assert not any(s["leads"]["0"] for s in samples_after(leader, resumed_at))
    # Classic groups: the resumed member rejoins, and the rebalance it starts can hold the
    # successor's commits (its lease renewals) back for a moment under load (seen once in CI):
    # the successor leads again once the rebalance is over, and never overlaps the old leader.
    wait_for("the successor to lead after the resumed member rejoined",
             lambda: follower.leading(), [follower])
    assert_no_overlap([a, b])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_revoke_barrier_holds_the_successor_until_it_returns(
        spawn: Any, protocol: str) -> None:
    a = spawn("a", group_protocol=protocol, barrier_hold=1.5)
    wait_for("a to lead", lambda: a.leading(), [a])
    b = spawn("b", group_protocol=protocol)
    wait_ready_and_pulsing([a, b])
    assert a.leading() and not b.leading()

    a.close()
    wait_for("b to lead", lambda: b.leading(), [a, b])
    barrier_end = a.lines("barrier_end")[-1]["ts"]
    barrier_start = a.lines("barrier_start")[-1]["ts"]
    acquired = b.events("LeaderAcquired")[-1]["ts"]
    assert barrier_start < barrier_end <= acquired
    assert_no_overlap([a, b])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_full_neli_exclusive_never_overlaps_when_a_join_moves_a_role(
        spawn: Any, protocol: str) -> None:
    settings = dict(group_protocol=protocol, mode="full", roles=[0, 1], partitions=2)
    a = spawn("a", **settings)
    wait_for("a to lead both roles", lambda: a.leading("0") and a.leading("1"), [a])
    b = spawn("b", **settings)
    wait_for("b to take over one role",
             lambda: b.leading("0") or b.leading("1"), [a, b])
    moved = "0" if b.leading("0") else "1"
    kept = "1" if moved == "0" else "0"
    assert not a.leading(moved)
    # the outgoing leader was told (routinely, or by its own lease) before b led the role
    ended = [e for e in a.events("LeaderRevoked", "LeaderFenced") if str(e["role"]) == moved]
    assert ended and ended[0]["ts"] <= b.events("LeaderAcquired")[0]["ts"]
    wait_for("a to keep leading the other role", lambda: a.leading(kept), [a, b])

    a.close()
    wait_for("b to lead both roles", lambda: b.leading("0") and b.leading("1"), [a, b])
    for role in ("0", "1"):
        assert_no_overlap([a, b], role)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_full_neli_non_exclusive_never_leaves_a_role_without_a_leader(
        spawn: Any, protocol: str) -> None:
    # T above the session timeout (the overlap), but not the default 3x: keeps the test short
    settings = dict(group_protocol=protocol, mode="full", exclusive=False, roles=[0, 1],
                    partitions=2, heartbeat_timeout=SESSION + 1.0)
    a = spawn("a", **settings)
    wait_for("a to lead both roles", lambda: a.leading("0") and a.leading("1"), [a])
    since = time.monotonic()
    b = spawn("b", **settings)
    wait_for("b to take over one role", lambda: b.leading("0") or b.leading("1"), [a, b])
    moved = "0" if b.leading("0") else "1"
    # the outgoing leader's lease lapses T after its last record: only then is it over
    wait_for("a's lingering lease on the moved role to lapse",
             lambda: not a.leading(moved), [a, b])
    until = time.monotonic()
    for role in ("0", "1"):
        intervals = a.intervals(role) + b.intervals(role)
        assert uncovered(intervals, since, until) == [], f"role {role} had no leader"
    overlap = [i for i in a.intervals(moved) if i.end is not None
               and any(j.start < i.end for j in b.intervals(moved))]
    assert overlap, "non-exclusive hand-over overlaps the two leaders"
