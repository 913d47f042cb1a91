"""The three leadership events a member's barrier receives: acquired, revoked, fenced."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from neli_orchestrate.core.roles import Role

__all__ = [
    "Barrier",
    "LeaderAcquired",
    "LeaderEvent",
    "LeaderFenced",
    "LeaderRevoked",
    "REASON_BARRIER_OVERRAN",
    "REASON_CLOSED",
    "REASON_FATAL",
    "REASON_HEARTBEAT_TIMEOUT",
    "REASON_LEASE_EXPIRED",
    "REASON_MAX_POLL",
    "REASON_MEMBERSHIP_UNCONFIRMED",
    "REASON_PARTITION_LOST",
    "REASON_REVOKED",
]

# Why an event happened (``event.reason``); stable strings, safe to match on.
REASON_ACQUIRED = "assigned-and-heartbeat-seen"
REASON_REVOKED = "partition-revoked"
REASON_CLOSED = "member-closed"
REASON_LEASE_EXPIRED = "lease-expired-after-revoke"
REASON_HEARTBEAT_TIMEOUT = "heartbeat-timeout"
REASON_MEMBERSHIP_UNCONFIRMED = "membership-unconfirmed"
REASON_PARTITION_LOST = "partition-lost"
REASON_MAX_POLL = "max-poll-interval-exceeded"
REASON_BARRIER_OVERRAN = "revoke-barrier-overran"
REASON_FATAL = "fatal-kafka-error"


@dataclass(frozen=True, kw_only=True)
class LeaderEvent:
    """A change in this member's leadership of one role.

    ``timestamp`` is the member's monotonic clock (``time.monotonic()`` unless a clock was
    injected) at the moment the change took effect; on Linux it is comparable between
    processes of one host. ``wall_time`` is the wall clock when the event was raised, for logs.
    """

    role: Role
    partition: int
    member: str
    timestamp: float
    wall_time: float
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class LeaderAcquired(LeaderEvent):
    """This member now leads ``role``: it owns the partition and saw its own heartbeat there.

    Raised again after a :class:`LeaderFenced` when own heartbeats resume while the partition
    is still assigned. Runs on the polling thread: return quickly, because no heartbeat is sent
    or read while the barrier runs.
    """


@dataclass(frozen=True, kw_only=True)
class LeaderRevoked(LeaderEvent):
    """Routine hand-over of ``role``: finish in-flight work, then return from the barrier.

    While the barrier blocks, Kafka keeps the partition from the successor (the revoke
    barrier), but only until ``deadline`` (monotonic): past it the member raises
    :class:`LeaderFenced` (reason ``revoke-barrier-overran``) and releases the partition.
    ``is_leader`` is already false while the barrier runs.
    """

    deadline: float


@dataclass(frozen=True, kw_only=True)
class LeaderFenced(LeaderEvent):
    """Stop work for ``role`` now: leadership ended without a hand-over.

    ``reason`` says why: own heartbeat missing past ``heartbeat_timeout``, group membership not
    confirmed in time, partition lost (session or max-poll expiry), the revoke barrier overran
    its deadline, or a fatal client error. Blocking here does not delay the successor.
    ``timestamp`` is when leadership ended (for a timeout, when the lease expired, which may be
    before the event was raised).
    """


Barrier = Callable[[LeaderEvent], None]
"""A callback that receives every :class:`LeaderEvent` of a member, in order."""
