"""The ride-through rule of docs/internals/protocol.md (8a), on the pure state and a fake clock.

A leader whose heartbeats and offset commits stall (a broker crash freezes the heartbeat
partition's high watermark and the offsets topic's writes) keeps leading until its newest
accepted commit A + R; for a classic group R = session - clock error - stop budget, because the
coordinator reschedules the member's session when it accepts the commit: A + session is the
earliest instant it could remove the member, and the work needs the stop budget to stop if the
ride ends in a fence. Never longer, and not at all once a commit is rejected for a reason that
is not a stall's.
"""

from __future__ import annotations

from typing import Any

import pytest

from neli_orchestrate.core.config import NeliConfig
from neli_orchestrate.core.events import (
    REASON_HEARTBEAT_TIMEOUT,
    REASON_MEMBERSHIP_UNCONFIRMED,
    LeaderAcquired,
    LeaderFenced,
)
from neli_orchestrate.core.fast import FastNeliState
from neli_orchestrate.core.kafka import Record

SESSION = 10.0
GROUP_HB = 1.0
CLOCK_ERROR = 0.5
LEASE = SESSION / 3                       # the default profile's heartbeat_timeout
STOP = (SESSION - LEASE) / 2   # the work's stop budget (neli-orchestrate run's grace)
RIDE = SESSION - CLOCK_ERROR - STOP   # 6.17 s: classic groups (KIP-848: see the config test)
WRITE_TIMEOUT = 5.0            # the broker's offsets.commit.timeout.ms
INTERVAL = 0.5


class Member:
    """A Fast NELI state driven by hand: the test is the broker, the coordinator and the clock."""

    def __init__(self, ride_through: float = RIDE) -> None:
        self.state = FastNeliState(member="m#1", roles=(0,), partitions=1, lease=LEASE,
                                   heartbeat_interval=INTERVAL, revoke_timeout=240.0,
                                   ride_through=ride_through)
        self.offset = 0
        self.unread: list[Record] = []      # written, not yet below the high watermark
        self.events: list[object] = []

    def evaluate(self, now: float) -> None:
        self.events += self.state.evaluate(now, now)

    def beat(self, now: float) -> None:
        """Send a heartbeat and a commit (one pulse round); nothing is answered yet."""
        self.evaluate(now)
        beat = self.state.heartbeat_for(0, now, now)
        key, value = beat.encode()
        self.unread.append(Record(partition=0, offset=self.offset, key=key, value=value,
                                  timestamp_ms=None, log_append_time=False))
        self.offset += 1
        self.state.commit_issued({0: self.offset}, now)

    def deliver(self, now: float, commit_error: str | None = None) -> None:
        """The high watermark moves: heartbeats are read back, commits answered."""
        self.evaluate(now)
        for record in self.unread:
            self.state.record(record, now, now)
        self.unread.clear()
        while self.state._commits:
            offsets, _ = self.state._commits[0]
            self.state.commit_done(offsets, commit_error)
        self.evaluate(now)

    def lead(self, now: float = 0.0) -> None:
        self.state.assign([0], now)
        self.beat(now)
        self.deliver(now + 0.01)
        assert self.state.leads(0, now + 0.01)
        assert [type(e) for e in self.events] == [LeaderAcquired]


def test_ride_through_is_derived_from_the_group_protocol_and_the_session() -> None:
    def ride(**settings: Any) -> float:
        return NeliConfig(bootstrap_servers="x:1", group_id="g", **settings).resolved.ride_through

    assert ride(group_protocol="classic", session_timeout=SESSION) == pytest.approx(RIDE)
    assert ride(group_protocol="classic", session_timeout=18.0) == pytest.approx(
        18.0 - CLOCK_ERROR - (18.0 - 6.0) / 2)
    # KIP-848: a commit does not reschedule the session; a group heartbeat's answer can be
    # held back for the coordinator's write timeout: 10 - 1 - 5 - 0.5 - 3.33 < the lease
    assert ride(group_protocol="consumer", session_timeout=SESSION) == 0.0
    assert ride(group_protocol="consumer", session_timeout=45.0) == pytest.approx(
        45.0 - GROUP_HB - WRITE_TIMEOUT - CLOCK_ERROR - (45.0 - 15.0) / 2)
    # the default profile: Kafka's own 45 s session, which rides through on both protocols
    assert ride(group_protocol="classic") == pytest.approx(45.0 - CLOCK_ERROR - (45.0 - 15.0) / 2)
    assert ride(group_protocol="consumer") == ride(group_protocol="consumer", session_timeout=45)
    assert ride() == ride(group_protocol="consumer")     # "auto" until the broker chose
    assert ride(mode="full") == 0.0


def test_stall_then_resume_keeps_leadership() -> None:
    """A broker crash: 9.3 s without read-back or commit answer fences nobody... as long as
    the newest proof is recent enough; here the stall starts right after a proof."""
    m = Member()
    m.lead(0.0)
    t = 0.0
    while t < 4.0:                      # a healthy leader: everything answered at once
        t += INTERVAL
        m.beat(t)
        m.deliver(t + 0.01)
    proven = m.state.membership_proven_at
    assert proven == pytest.approx(t)
    stall_end = proven + RIDE - 0.2     # the longest stall this session can ride through
    while t + INTERVAL < stall_end:     # heartbeats and commits pile up, unanswered
        t += INTERVAL
        m.beat(t)
        assert m.state.leads(0, t), f"fenced {t - proven:.1f} s into the stall"
    assert m.state.leads(0, stall_end - 0.01)
    m.deliver(stall_end)                # the dead follower leaves the in-sync set
    assert m.state.leads(0, stall_end)
    assert m.state.membership_proven_at == pytest.approx(t)   # the newest stalled commit
    assert [type(e) for e in m.events] == [LeaderAcquired]
    assert m.state.lease_expiry(0, stall_end) == pytest.approx(t + RIDE)


def test_member_cut_off_still_fences_before_anyone_could_be_assigned() -> None:
    """Cut off (or frozen) right after a proof: the lease ends at M + R, which is before the
    coordinator can remove the member (M - group heartbeat + session) by the clock error."""
    m = Member()
    m.lead(0.0)
    m.beat(0.5)
    m.deliver(0.51)
    proven = m.state.membership_proven_at
    assert proven is not None
    t = 0.5
    while m.state.leads(0, t):          # heartbeats and commits go nowhere
        t += 0.01
    removal_earliest = proven + SESSION     # the accepted commit rescheduled the session
    assert t == pytest.approx(proven + RIDE, abs=0.011)
    assert t <= removal_earliest - CLOCK_ERROR - STOP + 0.011   # time left to stop the work
    m.evaluate(t)
    fenced = m.events[-1]
    assert isinstance(fenced, LeaderFenced)
    assert fenced.timestamp == pytest.approx(proven + RIDE)
    assert fenced.reason in (REASON_HEARTBEAT_TIMEOUT, REASON_MEMBERSHIP_UNCONFIRMED)


@pytest.mark.parametrize("stall", [0.0, 1.0, 3.0, 8.0, 8.5, 9.0, 30.0, 600.0])
def test_extension_never_exceeds_the_bound(stall: float) -> None:
    """Whatever arrives during a stall (heartbeats read back, stall errors), leadership never
    outlasts the newest proof of membership + R."""
    m = Member()
    m.lead(0.0)
    t = 0.0
    while t < stall:
        t += INTERVAL
        m.beat(t)
        # heartbeats come back (the partition is healthy), commits time out at the broker
        m.deliver(t + 0.01, commit_error="REQUEST_TIMED_OUT")
        proven = m.state.membership_proven_at
        assert proven is not None
        expiry = m.state.lease_expiry(0, t + 0.01)
        assert expiry is None or expiry <= proven + RIDE + 1e-9
        assert not m.state.leads(0, proven + RIDE)
    assert m.state.leads(0, t + 0.01) == (t + 0.01 < RIDE)


@pytest.mark.parametrize("error", ["UNKNOWN_MEMBER_ID", "FENCED_MEMBER_EPOCH",
                                   "GROUP_AUTHORIZATION_FAILED"])
def test_a_rejection_that_is_no_stall_ends_the_ride_through(error: str) -> None:
    m = Member()
    m.lead(0.0)
    m.beat(0.5)
    m.deliver(0.51)
    proven = m.state.membership_proven_at
    assert proven is not None
    m.beat(1.0)
    m.deliver(1.01, commit_error=error)   # the coordinator no longer knows this member
    assert m.state.leads(0, proven + LEASE - 0.01)
    assert not m.state.leads(0, proven + LEASE)
    m.evaluate(proven + LEASE)
    assert isinstance(m.events[-1], LeaderFenced)
    assert m.events[-1].reason == REASON_MEMBERSHIP_UNCONFIRMED


def test_the_ride_through_never_starts_leadership() -> None:
    """A member that was fenced (or never led) needs fresh evidence younger than the lease."""
    m = Member()
    m.lead(0.0)
    m.evaluate(RIDE + 0.1)                # everything stalled past the bound: fenced
    assert isinstance(m.events[-1], LeaderFenced)
    # an old heartbeat read back and an old commit accepted now do not make it lead again
    m.beat(RIDE - LEASE - 0.1)
    m.deliver(RIDE + 0.2)
    assert not m.state.leads(0, RIDE + 0.2)
    assert isinstance(m.events[-1], LeaderFenced)


def test_without_the_ride_through_a_stall_fences_at_the_heartbeat_timeout() -> None:
    """The behaviour before issue 31 (ride_through=0): the stall of a broker crash fences."""
    m = Member(ride_through=0.0)
    m.lead(0.0)
    m.beat(0.5)
    m.deliver(0.51)
    assert not m.state.leads(0, 0.5 + LEASE)
    m.evaluate(0.5 + LEASE)
    assert isinstance(m.events[-1], LeaderFenced)
