"""Leadership bookkeeping shared by Fast and Full NELI: pure state, no I/O, time passed in.

A member leads role r at instant t when all of these hold (exclusive mode):

- the partition p = partition_for(r) is assigned to it (the group coordinator's arbitration);
- its *lease* on p has not expired: t < min(E_p, M) + heartbeat_timeout, where E_p is the
  newest liveness evidence read back from p (Fast NELI: the send time of the member's own
  newest heartbeat read back from p; Full NELI: the broker timestamp of the newest record on
  p, translated to the local monotonic clock) and M is the issue time of the newest offset
  commit the group coordinator accepted (proof that the member still belonged to the group's
  current generation at M);
- Full NELI, exclusive only: the grace period since the assignment has passed.

Non-exclusive Full NELI leads while t < E_p + T, assigned or not (the overlap the paper allows).

Ride-through (Fast NELI, ``ride_through`` = R > 0, :attr:`ResolvedConfig.ride_through`): a
member that already leads keeps leading while t < min(E_p, A) + R, where A is the issue time
of the newest offset commit accepted *without error*, unless a younger commit was rejected with
an error that is not a stall's (:data:`STALL_ERRORS`). R is chosen so that the coordinator
cannot have removed the member before A + R + clock_error (classic groups: an accepted commit
reschedules the session; KIP-848: the group heartbeats bound it), so no other member can be
assigned the partition before the extended lease ends: the extension rests on A alone, never
on the heartbeat partition. It lets a leader ride through a broker's crash, while the heartbeat
partition's high watermark and the offsets topic's writes stall (docs/internals/protocol.md,
section 8a). It never starts leadership: acquiring still needs evidence younger than
heartbeat_timeout.

Every query is answered from the clock reading the caller passes in, so ``is_leader`` can
never be stale: a stalled polling thread cannot keep it true. Events are the edges of
``leads`` as seen by :meth:`LeadershipState.evaluate`; inputs call it first, so every lapse is
reported before evidence that arrives later can renew the lease.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from neli_orchestrate.core.events import (
    REASON_ACQUIRED,
    REASON_CLOSED,
    REASON_HEARTBEAT_TIMEOUT,
    REASON_LEASE_EXPIRED,
    REASON_MEMBERSHIP_UNCONFIRMED,
    REASON_PARTITION_LOST,
    REASON_REVOKED,
    LeaderAcquired,
    LeaderEvent,
    LeaderFenced,
    LeaderRevoked,
)
from neli_orchestrate.core.heartbeat import Heartbeat
from neli_orchestrate.core.kafka import Record
from neli_orchestrate.core.roles import Role, partition_for
from neli_orchestrate.errors import KafkaUnavailableError

__all__ = ["LeadershipState", "PartitionState", "STALL_ERRORS"]

_MAX_PENDING_COMMITS = 256

#: Commit rejections that still prove membership at the moment the coordinator processed them.
#: The group coordinator validates the member id first (UNKNOWN_MEMBER_ID / FENCED_* once the
#: member was removed) and only then the generation or member epoch and the group state, so
#: ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS (classic) and STALE_MEMBER_EPOCH (KIP-848) mean
#: "still a member; the group is rebalancing". With cooperative-sticky and KIP-848 a partition
#: moves only after its owner revoked it, so a rebalance caused by a contender joining must not
#: cost the leader its lease (observed: a contender joining every ~1.6 s fenced a leader with a
#: 2 s heartbeat timeout twice in 15 s when these counted as failures).
MEMBER_KNOWN_ERRORS = frozenset({"ILLEGAL_GENERATION", "REBALANCE_IN_PROGRESS",
                                 "STALE_MEMBER_EPOCH"})

#: Commit outcomes that a broker's crash produces while the member's session still holds: the
#: coordinator's write waits for the offsets topic's high watermark and times out
#: (REQUEST_TIMED_OUT after offsets.commit.timeout.ms, NOT_ENOUGH_REPLICAS*), the coordinator
#: moves with its partition's leadership (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
#: COORDINATOR_LOAD_IN_PROGRESS), or the client gave up on the dead broker (_TRANSPORT,
#: _TIMED_OUT, _WAIT_COORD). They say nothing about membership either way, so they neither
#: renew the lease nor end a ride-through. Any other rejection (UNKNOWN_MEMBER_ID, FENCED_*,
#: an authorization error, ...) ends it: the lease falls back to heartbeat_timeout.
STALL_ERRORS = frozenset({
    "REQUEST_TIMED_OUT", "NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    "NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS",
    "NETWORK_EXCEPTION", "_TRANSPORT", "_TIMED_OUT", "_WAIT_COORD", "_MSG_TIMED_OUT",
})


@dataclass
class PartitionState:
    """What a member knows about one partition of the leader topic."""

    assigned: bool = False
    assigned_at: float = 0.0
    evidence: float | None = None
    """Monotonic time of the newest liveness evidence read back from the partition."""
    position: int | None = None
    """Offset after the newest record read (what an offset commit would store)."""
    revoked: bool = False
    """True after a routine revoke (vs a loss); decides the event when a lingering lease ends."""
    next_heartbeat: float = 0.0
    pending: dict[int, float] = field(default_factory=dict)
    """Fast NELI: sequence number -> send time of own heartbeats not yet read back."""


class LeadershipState:
    """The leadership of one member over its roles; subclasses define evidence and heartbeats.

    Thread-safety: inputs come from the polling thread; :meth:`leads` and
    :meth:`lease_expiry` may be called from any thread.
    """

    mode = "abstract"

    def __init__(
        self,
        *,
        member: str,
        roles: Sequence[Role],
        partitions: int,
        lease: float,
        heartbeat_interval: float,
        revoke_timeout: float,
        exclusive: bool = True,
        grace: float = 0.0,
        group: str | None = None,
        ride_through: float = 0.0,
    ) -> None:
        self.member = member
        self.member_key = member.encode("utf-8")  # records are keyed by member id
        self.group = group
        self.roles = tuple(roles)
        self.partitions = partitions
        self.lease = lease
        self.heartbeat_interval = heartbeat_interval
        self.revoke_timeout = revoke_timeout
        self.exclusive = exclusive
        self.grace = grace
        if ride_through and not exclusive:
            raise ValueError("ride_through applies to exclusive leadership only")
        self.ride_through = ride_through if ride_through > lease else 0.0
        """Lease after the newest accepted commit while a leader rides through a stall (0: off)."""
        self.role_partition: dict[Role, int] = {r: partition_for(r, partitions) for r in roles}
        self.partition_roles: dict[int, list[Role]] = {}
        for role, p in self.role_partition.items():
            self.partition_roles.setdefault(p, []).append(role)
        self._parts: dict[int, PartitionState] = {}
        self._membership: float | None = None
        self._accepted: float | None = None
        """Issue time of the newest commit accepted without error (the ride-through's base)."""
        self._disproved_at: float | None = None
        """Issue time of the newest commit rejected with a non-stall error (no ride-through
        until a younger commit proves membership again)."""
        self._commits: deque[tuple[dict[int, int], float]] = deque()
        self._announced: dict[Role, bool] = dict.fromkeys(self.roles, False)
        self._seq = 0
        self._lock = threading.RLock()
        self.counters: dict[str, int] = {
            "own_heartbeats": 0, "foreign_records": 0, "commits_accepted": 0,
            "commits_failed": 0, "commits_member_known": 0, "heartbeats_sent": 0,
        }

    # -- queries (any thread) ---------------------------------------------------------------

    def leads(self, role: Role, now: float) -> bool:
        """True if this member leads ``role`` at monotonic instant ``now``."""
        with self._lock:
            return self._leads(role, now)

    def lease_expiry(self, role: Role, now: float) -> float | None:
        """The instant the current lease on ``role`` ends, or None if it is not led at ``now``."""
        with self._lock:
            if not self._leads(role, now):
                return None
            p = self.role_partition[role]
            return self._expiry(self._parts[p], p)

    @property
    def membership_proven_at(self) -> float | None:
        """Issue time of the newest offset commit the group coordinator accepted."""
        with self._lock:
            return self._membership

    def assigned_partitions(self) -> list[int]:
        with self._lock:
            return sorted(p for p, st in self._parts.items() if st.assigned)

    def partition(self, p: int) -> PartitionState | None:
        with self._lock:
            return self._parts.get(p)

    def _leads(self, role: Role, now: float) -> bool:
        st = self._parts.get(self.role_partition[role])
        if st is None:
            return False
        expiry = self._expiry(st, self.role_partition[role])
        if expiry is None or now >= expiry:
            return False
        if self.exclusive:
            if not st.assigned or now < st.assigned_at + self.grace:
                return False
        return True

    def _expiry(self, st: PartitionState, p: int) -> float | None:
        if st.evidence is None:
            return None
        if not self.exclusive:
            return st.evidence + self.lease
        if self._membership is None:
            return None
        expiry = min(st.evidence, self._membership) + self.lease
        if self._rides(st, p):
            assert self._accepted is not None
            expiry = max(expiry, min(st.evidence, self._accepted) + self.ride_through)
        return expiry

    def _rides(self, st: PartitionState, p: int) -> bool:
        """The ride-through applies: on, a partition already led, no disproof, a base A."""
        return bool(self.ride_through and st.assigned and self._accepted is not None
                    and not self._disproved()
                    and any(self._announced[r] for r in self.partition_roles.get(p, ())))

    def _disproved(self) -> bool:
        """A commit younger than the newest proof was rejected for a reason that is no stall's."""
        return self._disproved_at is not None and (
            self._membership is None or self._disproved_at >= self._membership)

    # -- edges ------------------------------------------------------------------------------

    def evaluate(self, now: float, wall: float) -> list[LeaderEvent]:
        """Return the events for every change of ``leads`` since the previous evaluation."""
        events: list[LeaderEvent] = []
        with self._lock:
            for role in self.roles:
                current = self._leads(role, now)
                if current == self._announced[role]:
                    continue
                p = self.role_partition[role]
                st = self._parts.get(p)
                # the lease that just ended (a ride-through's, while still announced)
                expiry = self._expiry(st, p) if st is not None else None
                self._announced[role] = current
                if current:
                    events.append(LeaderAcquired(
                        role=role, partition=p, member=self.member, timestamp=now,
                        wall_time=wall, reason=REASON_ACQUIRED))
                    continue
                ended = min(now, expiry) if expiry is not None else now
                if st is not None and not st.assigned and st.revoked:
                    events.append(LeaderRevoked(
                        role=role, partition=p, member=self.member, timestamp=ended,
                        wall_time=wall, reason=REASON_LEASE_EXPIRED, deadline=now))
                    continue
                if st is None or not st.assigned:
                    reason = REASON_PARTITION_LOST
                elif self.exclusive and (self._membership is None or self._disproved() or (
                        st.evidence is not None
                        and self._membership < st.evidence - self.heartbeat_interval)):
                    # commits lagged behind heartbeats by more than a round: they are the cause
                    reason = REASON_MEMBERSHIP_UNCONFIRMED
                else:
                    reason = REASON_HEARTBEAT_TIMEOUT
                events.append(LeaderFenced(
                    role=role, partition=p, member=self.member, timestamp=ended,
                    wall_time=wall, reason=reason))
        return events

    def next_wakeup(self, now: float) -> float | None:
        """The next instant after ``now`` at which something changes without any input."""
        with self._lock:
            times: list[float] = []
            for role in self.roles:
                st = self._parts.get(self.role_partition[role])
                if st is None:
                    continue
                expiry = self._expiry(st, self.role_partition[role])
                if expiry is not None:
                    times.append(expiry)
                if st.assigned and self.grace:
                    times.append(st.assigned_at + self.grace)
            times.extend(self._heartbeat_times())
            future = [t for t in times if t > now]
            return min(future) if future else None

    # -- rebalance inputs ---------------------------------------------------------------------

    def assign(self, partitions: Iterable[int], now: float) -> None:
        """Partitions were assigned to this member (incrementally)."""
        parts = list(partitions)
        for p in parts:
            if p >= self.partitions:
                raise KafkaUnavailableError(
                    f"partition {p} of the leader topic was assigned, but the topic had "
                    f"{self.partitions} partition(s) at start-up: it grew while members run, "
                    f"which changes the role -> partition mapping; restart every member"
                )
        with self._lock:
            for p in parts:
                old = self._parts.get(p)
                st = PartitionState(assigned=True, assigned_at=now, next_heartbeat=now)
                if not self.exclusive and old is not None:
                    st.evidence = old.evidence  # a lingering lease survives a reassignment
                self._parts[p] = st

    def revoke(self, partitions: Iterable[int], now: float, wall: float,
               closing: bool = False) -> list[LeaderRevoked]:
        """Partitions are being revoked routinely; return the events for the revoke barrier.

        Non-exclusive leadership lingers after a rebalance revoke until its lease lapses,
        but not when the member itself is closing (``closing``): then it ends here, with the
        barrier, as in exclusive mode.
        """
        events: list[LeaderRevoked] = []
        lingers = not self.exclusive and not closing
        with self._lock:
            for p in partitions:
                st = self._parts.get(p)
                if st is None or not st.assigned:
                    continue
                st.assigned = False
                st.revoked = True
                st.pending.clear()
                st.position = None
                if lingers:
                    continue  # leadership lingers until the lease lapses (overlap allowed)
                st.evidence = None
                for role in self.partition_roles.get(p, []):
                    if self._announced[role]:
                        self._announced[role] = False
                        events.append(LeaderRevoked(
                            role=role, partition=p, member=self.member, timestamp=now,
                            wall_time=wall, reason=REASON_REVOKED,
                            deadline=now + self.revoke_timeout))
        return events

    def lose(self, partitions: Iterable[int], now: float, wall: float,
             reason: str = REASON_PARTITION_LOST) -> list[LeaderFenced]:
        """Partitions were lost without a revoke (another member may own them already)."""
        events: list[LeaderFenced] = []
        with self._lock:
            for p in partitions:
                st = self._parts.get(p)
                if st is None or not st.assigned:
                    continue
                st.assigned = False
                st.revoked = False
                st.pending.clear()
                st.position = None
                if not self.exclusive:
                    continue
                st.evidence = None
                for role in self.partition_roles.get(p, []):
                    if self._announced[role]:
                        self._announced[role] = False
                        events.append(LeaderFenced(
                            role=role, partition=p, member=self.member, timestamp=now,
                            wall_time=wall, reason=reason))
        return events

    def lose_all(self, now: float, wall: float, reason: str) -> list[LeaderFenced]:
        """Every assigned partition is lost (max-poll expiry, fatal error)."""
        return self.lose(self.assigned_partitions(), now, wall, reason)

    def close(self, now: float, wall: float, reason: str = REASON_CLOSED) -> list[LeaderEvent]:
        """The member is closed: end every leadership still announced."""
        events: list[LeaderEvent] = []
        with self._lock:
            for role in self.roles:
                if self._announced[role]:
                    self._announced[role] = False
                    events.append(LeaderFenced(
                        role=role, partition=self.role_partition[role], member=self.member,
                        timestamp=now, wall_time=wall, reason=reason))
            self._parts.clear()
            self._membership = None
            self._accepted = None
            self._disproved_at = None
        return events

    # -- membership proofs (offset commits) ----------------------------------------------------

    def commit_offsets(self) -> dict[int, int]:
        """Offsets to commit now: one per assigned partition whose position is known."""
        with self._lock:
            return {p: st.position for p, st in self._parts.items()
                    if st.assigned and st.position is not None}

    def set_position(self, partition: int, offset: int) -> None:
        with self._lock:
            st = self._parts.get(partition)
            if st is not None and st.assigned:
                st.position = offset

    def commit_issued(self, offsets: Mapping[int, int], issued_at: float) -> None:
        """An asynchronous commit of ``offsets`` was sent at ``issued_at``."""
        with self._lock:
            self._commits.append((dict(offsets), issued_at))
            while len(self._commits) > _MAX_PENDING_COMMITS:
                self._commits.popleft()

    def commit_done(self, offsets: Mapping[int, int], error: str | None) -> bool:
        """A commit finished; if accepted, membership is proven as of its issue time.

        Returns True if the membership proof moved forward. A rejection in
        :data:`MEMBER_KNOWN_ERRORS` still proves membership; any other rejection proves
        nothing and revokes nothing: the lease simply is not renewed.
        """
        with self._lock:
            wanted = dict(offsets)
            issued_at: float | None = None
            while self._commits:
                candidate, at = self._commits.popleft()
                if candidate == wanted:
                    issued_at = at
                    break
            if issued_at is None:
                return False
            if error is not None and error not in MEMBER_KNOWN_ERRORS:
                self.counters["commits_failed"] += 1
                if error not in STALL_ERRORS and (
                        self._disproved_at is None or issued_at > self._disproved_at):
                    self._disproved_at = issued_at
                return False
            self.counters["commits_accepted" if error is None else "commits_member_known"] += 1
            if error is None and (self._accepted is None or issued_at > self._accepted):
                self._accepted = issued_at
            if self._membership is None or issued_at > self._membership:
                self._membership = issued_at
                return True
            return False

    # -- records and heartbeats (mode specific) ----------------------------------------------

    def record(self, record: Record, now: float, wall: float) -> None:
        """A record was read from the leader topic."""
        raise NotImplementedError

    def due_heartbeats(self, now: float, wall: float) -> list[tuple[int, Heartbeat]]:
        """Heartbeats to send now, as (partition, heartbeat); schedules the next ones."""
        raise NotImplementedError

    def _heartbeat_times(self) -> list[float]:
        raise NotImplementedError

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def announced(self, role: Role) -> bool:
        with self._lock:
            return self._announced[role]
