"""Fast NELI (the default, ``NeliConfig(mode="fast")``): leadership from its own heartbeat.

The member that the group coordinator assigns a role's partition writes heartbeats to that
partition and reads them back. It leads while it owns the partition and its *own* newest
heartbeat, and its newest accepted offset commit (proof of group membership, see
:mod:`neli_orchestrate.core.state`), are younger than ``heartbeat_timeout``. Records of anyone
else never count, so no other member, stale or forged, can make it lead. See
``docs/internals/protocol.md``.
"""

from __future__ import annotations

from neli_orchestrate.core.heartbeat import Heartbeat, decode_heartbeat
from neli_orchestrate.core.kafka import Record
from neli_orchestrate.core.state import LeadershipState

__all__ = ["FastNeliState"]

_MAX_PENDING = 1024     # own heartbeats awaiting read-back, per partition


class FastNeliState(LeadershipState):
    """Fast NELI leadership: evidence is the member's *own* heartbeat, read back from the partition.

    A heartbeat counts only if it carries this member's id and a sequence number this member
    sent since the partition was assigned; its send time (this member's monotonic clock) is
    the evidence. Records from anyone else never count.
    """

    mode = "fast"

    def record(self, record: Record, now: float, wall: float) -> None:
        with self._lock:
            st = self._parts.get(record.partition)
            if st is None or not st.assigned:
                return
            st.position = record.offset + 1
            if record.key is not None and record.key != self.member_key:
                # another member's record (with many roles on one partition, nearly all of
                # them): skip it without parsing
                self.counters["foreign_records"] += 1
                return
            beat = decode_heartbeat(record.key, record.value)
            if beat is None or beat.member != self.member:
                self.counters["foreign_records"] += 1
                return
            sent = st.pending.pop(beat.seq, None)
            if sent is None:
                return  # sent before this assignment, or not by this incarnation
            for older in [s for s in st.pending if s < beat.seq]:
                del st.pending[older]  # overtaken: a newer heartbeat already came back
            self.counters["own_heartbeats"] += 1
            if st.evidence is None or sent > st.evidence:
                st.evidence = sent

    def heartbeat_for(self, partition: int, now: float, wall: float) -> Heartbeat:
        """Register and return a heartbeat for ``partition`` (sent by the caller now)."""
        with self._lock:
            st = self._parts[partition]
            seq = self._next_seq()
            st.pending[seq] = now
            while len(st.pending) > _MAX_PENDING:
                del st.pending[min(st.pending)]
            st.next_heartbeat = now + self.heartbeat_interval
            self.counters["heartbeats_sent"] += 1
            return Heartbeat(member=self.member, seq=seq, sent_at=now, sent_wall=wall,
                             group=self.group)

    def due_heartbeats(self, now: float, wall: float) -> list[tuple[int, Heartbeat]]:
        with self._lock:
            due = [p for p, st in self._parts.items()
                   if st.assigned and p in self.partition_roles and now >= st.next_heartbeat]
            return [(p, self.heartbeat_for(p, now, wall)) for p in sorted(due)]

    def _heartbeat_times(self) -> list[float]:
        return [st.next_heartbeat for p, st in self._parts.items()
                if st.assigned and p in self.partition_roles]
