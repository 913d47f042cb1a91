"""Simulated Kafka broker: group coordinator, transaction coordinator and partition logs.

Modelled after what the protocol relies on in Kafka (docs/internals/protocol.md), nothing more:

- **Consumer groups** (one per role, one partition): a member stays in the group while its
  session heartbeats arrive within ``session_timeout``; the partition is sticky
  (cooperative-sticky: a join never revokes it) and moves only when its owner leaves, expires,
  or a forced rebalance asks it to. A forced move is a cooperative revoke: the owner gets
  "revoke" in a heartbeat response, runs its barrier and acknowledges; the successor is
  assigned only after the acknowledgement or after ``rebalance_timeout``, when the owner is
  kicked out. A member learns its assignment from its next heartbeat response.
- **Transactions**: ``init_transactions(transactional.id)`` bumps the id's epoch and aborts
  its open transaction; a write with an older epoch is refused (fenced). A transaction left
  open (writer died half-way) holds the partition's last stable offset until it is aborted by
  the next ``init_transactions`` or by ``transaction_timeout`` (which also bumps the epoch).
- **Logs** with offsets, commit/abort markers, high watermark and last stable offset, and
  compaction: after every commit, committed records superseded by a later committed record of
  the same key are removed (offsets stay; readers skip the hole), as the log cleaner does.
  Tombstones are never removed here (the simulation writes none); the real-broker tests cover
  a tombstone compacted away.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from integration.sim.kernel import Kernel

# Log entry kinds.
DATA = 0
MARKER = 1

# Entry status.
OPEN = 0
COMMITTED = 1
ABORTED = 2
#: Removed by compaction (a later committed record of the same key exists).
REMOVED = 3


#: What ListOffsets answers for a partition without a leader (librdkafka's OFFSET_INVALID).
OFFSET_INVALID = -1001


class Entry:
    __slots__ = ("offset", "kind", "key", "value", "tid", "epoch", "status")

    def __init__(
        self, offset: int, kind: int, key: bytes | None, value: bytes | None,
        tid: str, epoch: int, status: int,
    ) -> None:
        self.offset = offset
        self.kind = kind
        self.key = key
        self.value = value
        self.tid = tid
        self.epoch = epoch
        self.status = status


class Log:
    """One partition of the ledger topic."""

    __slots__ = ("entries", "open_from")

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        #: First offset of each open transaction on this partition, by transactional id.
        self.open_from: dict[str, int] = {}

    @property
    def high_watermark(self) -> int:
        return len(self.entries)

    @property
    def last_stable_offset(self) -> int:
        if self.open_from:
            return min(self.open_from.values())
        return len(self.entries)


class Fenced(Exception):
    """The producer's epoch is older than the transactional id's: a newer writer began."""

    def __init__(self, tid: str, epoch: int, current: int) -> None:
        super().__init__(f"producer epoch {epoch} of {tid!r} fenced by epoch {current}")
        self.tid = tid
        self.epoch = epoch
        self.current = current


class Group:
    __slots__ = (
        "role", "members", "owner", "revoking", "expiry_scheduled", "generation", "next_expiry",
    )

    def __init__(self, role: str) -> None:
        self.role = role
        #: member id -> broker time of its last session heartbeat.
        self.members: dict[str, int] = {}
        self.owner: str | None = None
        #: (owner, deadline) while a forced rebalance waits for the owner's revoke.
        self.revoking: tuple[str, int] | None = None
        self.expiry_scheduled = False
        self.generation = 0
        #: No member can expire before this time (min last heartbeat + session timeout).
        self.next_expiry = 0


# Heartbeat answers.
UNKNOWN = "unknown"


class Broker:
    """The simulated cluster. Every method runs at the moment a request arrives."""

    def __init__(
        self,
        kernel: Kernel,
        *,
        partitions: int,
        session_timeout: int,
        rebalance_timeout: int,
        transaction_timeout: int,
    ) -> None:
        self.kernel = kernel
        #: The ledger topic's id (what a replay cache checks); the topic is never recreated.
        self.topic_id = "sim-ledger-topic"
        #: Records removed by compaction so far.
        self.compacted = 0
        #: Leader changes of ledger partitions: (partition, start, end) in ms. Meanwhile a
        #: ListOffsets for the partition's end answers -1001 (OFFSET_INVALID), as Kafka's did
        #: in issue 31.
        self.leader_changes: list[tuple[int, int, int]] = []
        self.logs = [Log() for _ in range(partitions)]
        self.groups: dict[str, Group] = {}
        self.stall_until = 0
        kernel.hold_reply = self.held_until
        self.session_timeout = session_timeout
        self.rebalance_timeout = rebalance_timeout
        self.transaction_timeout = transaction_timeout
        self.epochs: dict[str, int] = {}
        #: Open transaction per transactional id: (partition, epoch).
        self.open_txn: dict[str, tuple[int, int]] = {}
        #: Observers: on_assign(role, member) when the coordinator assigns the partition,
        #: on_commit(partition, entries) after a transaction commits.
        self.on_assign: Callable[[str, str], None] = lambda role, member: None
        self.on_commit: Callable[[int, list[Entry]], None] = lambda partition, entries: None

    def end_offset(self, partition: int) -> int:
        """ListOffsets(latest) of a ledger partition, as the client receives it: the high
        watermark, or -1001 (not an offset) while the partition's leader changes."""
        now = self.kernel.now
        if any(p == partition and a <= now < b for p, a, b in self.leader_changes):
            return OFFSET_INVALID
        return self.logs[partition].high_watermark

    # -- group coordinator ----------------------------------------------------------------

    def group(self, role: str) -> Group:
        group = self.groups.get(role)
        if group is None:
            group = self.groups[role] = Group(role)
        return group

    def _expire(self, group: Group) -> None:
        now = self.kernel.now
        if now < group.next_expiry and (group.revoking is None or now < group.revoking[1]):
            self._assign(group)  # nobody can have expired yet
            return
        expired = [m for m, seen in group.members.items() if seen + self.session_timeout <= now]
        for member in expired:
            del group.members[member]
            self.kernel.log("broker", "session expired", f"{group.role}: {member}")
            if group.owner == member:
                group.owner = None
                group.revoking = None
        if group.revoking is not None and group.revoking[1] <= now:
            owner = group.revoking[0]
            group.members.pop(owner, None)
            group.owner = None
            group.revoking = None
            self.kernel.log("broker", "rebalance timeout: kicked", f"{group.role}: {owner}")
        self._assign(group)
        if group.members:
            group.next_expiry = min(group.members.values()) + self.session_timeout
        self._schedule_expiry(group)

    def _schedule_expiry(self, group: Group) -> None:
        if group.expiry_scheduled or not group.members:
            return
        when = min(group.members.values()) + self.session_timeout
        if group.revoking is not None:
            when = min(when, group.revoking[1])
        group.expiry_scheduled = True
        self.kernel.at(max(when, self.kernel.now), self._expiry_tick, group)

    def _expiry_tick(self, group: Group) -> None:
        group.expiry_scheduled = False
        self._expire(group)

    def _assign(self, group: Group) -> None:
        if group.owner is not None or not group.members:
            return
        candidates = list(group.members)
        owner = candidates[self.kernel.rng.randrange(len(candidates))]
        group.owner = owner
        group.generation += 1
        self.kernel.log("broker", "assign", f"{group.role} -> {owner} (gen {group.generation})")
        self.on_assign(group.role, owner)

    def join(self, role: str, member: str) -> None:
        group = self.group(role)
        group.members[member] = self.kernel.now
        self._expire(group)

    def heartbeat(self, role: str, member: str) -> Any:
        """Session heartbeat: UNKNOWN (expired: rejoin) or (assigned, revoke_requested)."""
        group = self.group(role)
        self._expire(group)
        if member not in group.members:
            return UNKNOWN
        group.members[member] = self.kernel.now
        revoke = group.revoking is not None and group.revoking[0] == member
        return (group.owner == member, revoke)

    def leave(self, role: str, member: str) -> None:
        group = self.group(role)
        group.members.pop(member, None)
        if group.owner == member:
            group.owner = None
            group.revoking = None
            self.kernel.log("broker", "owner left", f"{role}: {member}")
        self._expire(group)

    def revoke_done(self, role: str, member: str) -> None:
        group = self.group(role)
        if group.revoking is not None and group.revoking[0] == member:
            group.owner = None
            group.revoking = None
            self.kernel.log("broker", "revoke acknowledged", f"{role}: {member}")
        self._expire(group)

    def force_rebalance(self, role: str) -> bool:
        """Ask the owner to give the partition up (cooperative revoke with a barrier)."""
        group = self.group(role)
        self._expire(group)
        if group.owner is None or group.revoking is not None or len(group.members) < 2:
            return False
        group.revoking = (group.owner, self.kernel.now + self.rebalance_timeout)
        self.kernel.log("broker", "forced rebalance", f"{role}: revoke {group.owner}")
        self._schedule_expiry(group)
        return True

    # -- a broker's crash as the others see it: a stalled high watermark ---------------------

    def stall(self, duration: int) -> None:
        """For ``duration`` ms the group coordinator processes session heartbeats (the session
        is renewed on receipt) but answers only afterwards, and NELI heartbeats are written but
        cannot be read back: a dead follower holds the high watermarks of the heartbeat
        partition and of the offsets topic until the controller drops it from the in-sync set.
        A successor's assignment is an answer too, so it waits for the same moment."""
        self.stall_until = max(self.stall_until, self.kernel.now + duration)
        self.kernel.log("broker", "stall", f"high watermarks frozen for {duration} ms")

    def held_until(self, fn: Any) -> int | None:
        if self.stall_until <= self.kernel.now:
            return None
        if fn == self.heartbeat or fn == self.neli_heartbeat:
            return self.stall_until
        return None

    def neli_heartbeat(self, role: str, member: str) -> bool:
        """Produce-and-fetch of the member's own NELI heartbeat (the broker does not check
        ownership on produce or fetch, as in Kafka)."""
        return True

    # -- transactions and logs ------------------------------------------------------------

    def init_transactions(self, tid: str) -> int:
        self._abort(tid, "init_transactions")
        epoch = self.epochs.get(tid, -1) + 1
        self.epochs[tid] = epoch
        return epoch

    def current_epoch(self, tid: str) -> int:
        return self.epochs.get(tid, 0)

    def _abort(self, tid: str, why: str) -> None:
        open_txn = self.open_txn.pop(tid, None)
        if open_txn is None:
            return
        partition, epoch = open_txn
        log = self.logs[partition]
        start = log.open_from.pop(tid)
        for entry in log.entries[start:]:
            if entry.tid == tid and entry.status == OPEN:
                entry.status = ABORTED
        log.entries.append(Entry(len(log.entries), MARKER, None, None, tid, epoch, ABORTED))
        self.kernel.log("broker", "txn aborted", f"{tid} epoch {epoch} ({why})")

    def write(
        self,
        tid: str,
        epoch: int,
        partition: int,
        messages: list[tuple[bytes, bytes | None]],
        *,
        midway: bool = False,
    ) -> list[Entry]:
        """One transaction: append and commit ``messages``; ``midway`` leaves it open."""
        current = self.epochs.get(tid, 0)
        if epoch != current:
            raise Fenced(tid, epoch, current)
        log = self.logs[partition]
        entries = []
        log.open_from[tid] = len(log.entries)
        self.open_txn[tid] = (partition, epoch)
        for key, value in messages:
            entry = Entry(len(log.entries), DATA, key, value, tid, epoch, OPEN)
            log.entries.append(entry)
            entries.append(entry)
        if midway:
            self.kernel.at(
                self.kernel.now + self.transaction_timeout, self._txn_timeout, tid, epoch
            )
            return entries
        for entry in entries:
            entry.status = COMMITTED
        log.entries.append(Entry(len(log.entries), MARKER, None, None, tid, epoch, COMMITTED))
        del log.open_from[tid]
        del self.open_txn[tid]
        self.on_commit(partition, entries)
        self.compacted += _compact(log)
        return entries

    def _txn_timeout(self, tid: str, epoch: int) -> None:
        if self.open_txn.get(tid, (None, None))[1] == epoch and self.epochs.get(tid) == epoch:
            self._abort(tid, "transaction timeout")
            self.epochs[tid] = epoch + 1  # the coordinator bumps the epoch: the writer is fenced


def _compact(log: Log) -> int:
    """Remove committed records below the last stable offset that a later one supersedes."""
    removed = 0
    seen: set[bytes] = set()
    for entry in reversed(log.entries[:log.last_stable_offset]):
        if entry.kind != DATA or entry.status != COMMITTED or entry.key is None:
            continue
        if entry.key in seen:
            entry.status = REMOVED
            removed += 1
        else:
            seen.add(entry.key)
    return removed
