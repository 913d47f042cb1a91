"""Full NELI (the paper's main protocol), used with ``NeliConfig(mode="full")``.

Every member broadcasts a record to every partition of the leader topic each
``heartbeat_interval``, so no partition ever dries up while one member lives. A member keeps
the vector V: for each partition it owns, the broker (log-append) timestamp of the newest
record read there, translated to its own monotonic clock. It leads partition i while V[i] is
within T = ``heartbeat_timeout``:

- exclusive (default): T + clock_error (+ the group heartbeat interval) < session timeout, so
  a member that stops hearing the broker stops leading before the group may reassign its
  partition; a new assignee first waits a grace period of T, giving an outgoing leader that
  was not told (e.g. partitioned away) time to lapse. The newest accepted offset commit must
  also be within T (membership proof, see :mod:`neli_orchestrate.core.state`).
- non-exclusive (``exclusive=False``): T exceeds the session timeout, so an outgoing leader
  still leads while its successor takes over: at least one leader, overlap allowed.

Broker timestamps, not local receipt times, are what make a record buffered during a stall
worthless afterwards: its age is measured from when the broker appended it.
"""

from __future__ import annotations

import logging
import math

from neli_orchestrate.core.heartbeat import Heartbeat
from neli_orchestrate.core.kafka import Record
from neli_orchestrate.core.state import LeadershipState

__all__ = ["FullNeliState"]

log = logging.getLogger(__name__)


class FullNeliState(LeadershipState):
    """Full NELI leadership: evidence is the broker timestamp of any record on the partition."""

    mode = "full"

    def __init__(self, *, clock_error: float, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.clock_error = clock_error
        self._next_broadcast = -math.inf
        self._warned_timestamps = False
        self._warned_skew = False
        self.counters.update(records_without_broker_time=0, evidence_records=0)

    def record(self, record: Record, now: float, wall: float) -> None:
        with self._lock:
            st = self._parts.get(record.partition)
            if st is None or not st.assigned:
                return
            st.position = record.offset + 1
            if not record.log_append_time or record.timestamp_ms is None:
                self.counters["records_without_broker_time"] += 1
                if not self._warned_timestamps:
                    self._warned_timestamps = True
                    log.error("record at offset %d of partition %d has no broker timestamp: "
                              "Full NELI needs the leader topic to use "
                              "message.timestamp.type=LogAppendTime", record.offset,
                              record.partition)
                return
            age = wall - record.timestamp_ms / 1000.0
            if age < -self.clock_error and not self._warned_skew:
                self._warned_skew = True
                log.warning("the broker's clock is %.3f s ahead of this host's, more than "
                            "clock_error=%g s: exclusivity assumptions do not hold", -age,
                            self.clock_error)
            # A broker clock ahead of ours must not stretch the lease: never date evidence
            # in the future.
            appended = min(now, now - age)
            if st.evidence is None or appended > st.evidence:
                st.evidence = appended
            self.counters["evidence_records"] += 1

    def due_heartbeats(self, now: float, wall: float) -> list[tuple[int, Heartbeat]]:
        with self._lock:
            if now < self._next_broadcast:
                return []
            self._next_broadcast = now + self.heartbeat_interval
            beats = []
            for p in range(self.partitions):
                beats.append((p, Heartbeat(member=self.member, seq=self._next_seq(),
                                           sent_at=now, sent_wall=wall, group=self.group)))
            self.counters["heartbeats_sent"] += len(beats)
            return beats

    def _heartbeat_times(self) -> list[float]:
        return [self._next_broadcast]
