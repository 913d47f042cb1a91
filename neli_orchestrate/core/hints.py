"""Release hints and nudges: a follower learns early that its leader left (Fast NELI, KIP-848).

A member that closes writes a release hint (:class:`~neli_orchestrate.core.heartbeat.ReleaseHint`)
to the partitions it held *after* its revoke barrier, just before it leaves the group
(:func:`write_release_hints`). Followers read the partitions of their roles outside the group
(:class:`HintWatch`, over the seam's :class:`~neli_orchestrate.core.kafka.LeaderTopicWatcher`)
and, on a hint, ask the coordinator for their assignment at once (a nudge:
:meth:`~neli_orchestrate.core.kafka.GroupConsumer.rejoin`) instead of at their next group
heartbeat. A KIP-848 follower whose leader goes quiet without a hint (a crash, a stall) nudges
in a burst around the leader's expected session deadline.

.. note:: A hint or a nudge grants nothing: the successor still needs the assignment, its own
   heartbeat read back and an accepted commit (``tests/core/test_core_hints.py`` breaks this
   on purpose and shows the exclusivity check catching it).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

from neli_orchestrate.core.clock import Clock
from neli_orchestrate.core.config import ResolvedConfig
from neli_orchestrate.core.heartbeat import ReleaseHint, decode_hint, group_tag, of_group
from neli_orchestrate.core.kafka import (
    ConsumerFault,
    HeartbeatProducer,
    LeaderTopicWatcher,
)
from neli_orchestrate.core.state import LeadershipState

__all__ = ["HINT_FLUSH", "HintWatch", "write_release_hints"]

log = logging.getLogger(__name__)

_DRAIN = 500            # records handled per poll before the loop re-evaluates
# After a release hint: nudge at once, and again after these delays while no assignment has
# come. The hint is written when the departing leader's revoke barrier has finished, just
# before its LeaveGroup, so it can overtake the leave: a KIP-848 heartbeat that arrives first
# brings nothing new (retry soon); a classic rejoin starts a rebalance that the leave then
# completes (one retry, late, in case the rejoin itself was lost).
_NUDGE_RETRIES = (0.03, 0.1, 0.25)  # KIP-848 only: classic groups get no hints
_NUDGE_RETRY = _NUDGE_RETRIES[-1]
_BURST_STEP = 0.05    # KIP-848: nudge spacing around a silent leader's session deadline
HINT_FLUSH = 0.5
"""How long a closing member waits for its release hints to be written (seconds)."""

#: ``warn(key, message, *args)``: log a repeating problem the first time and then rarely.
Warn = Callable[..., None]


def write_release_hints(producer: HeartbeatProducer, partitions: Sequence[int],
                        hint: ReleaseHint) -> list[int]:
    """Queue ``hint`` on each of ``partitions``; return those it was queued on.

    Not awaited: the closing member flushes (up to :data:`HINT_FLUSH`) once it has left the
    group. A hint that is lost only slows the hand-over down.
    """
    key, value = hint.encode()
    written: list[int] = []
    try:
        for p in partitions:
            producer.send(p, key, value)
            written.append(p)
    except Exception:  # noqa: BLE001 - a lost hint only slows the hand-over down
        log.debug("release hint of member %s not written", hint.member, exc_info=True)
    log.debug("member %s wrote release hints to partition(s) %s", hint.member,
              list(partitions))
    return written


class HintWatch:
    """A follower's watch over its roles' partitions, outside the group, and its nudges.

    Watches exactly the role partitions the member does not hold (:meth:`rewatch`), reading
    them from their end. ``on_hint(partition, hint, now)`` is called for another member's
    release hint of this group; the member passes it back to :meth:`hint_read`. Without a
    watcher (classic groups, hints off) every method does nothing.
    """

    def __init__(self, state: LeadershipState, config: ResolvedConfig, member: str, *,
                 clock: Clock, rejoin: Callable[[], None],
                 on_hint: Callable[[int, ReleaseHint, float], None], warn: Warn) -> None:
        self._state = state
        self._r = config
        self._member = member
        self._clock = clock
        self._rejoin = rejoin
        self._on_hint = on_hint
        self._warn = warn
        self._group_tag = group_tag(config.group_id)
        self._watcher: LeaderTopicWatcher | None = None
        self._started = False
        #: The partitions read now (sorted).
        self.watched: tuple[int, ...] = ()
        self._seen: dict[int, float] = {}      # watched partition -> when a record was read
        #: When the next planned nudge is due (monotonic), or None.
        self.next_nudge: float | None = None
        self._nudge_plan: list[float] = []
        self._silence_seen: dict[int, float] = {}  # partition -> last record already acted on

    def open(self, watcher: LeaderTopicWatcher) -> None:
        """Read through ``watcher`` from the first :meth:`start` on."""
        self._watcher = watcher

    def start(self) -> None:
        """Position the watcher at the member's first pulse (nothing is read before, and the
        member's start stays short)."""
        if self._watcher is not None and not self.watched and not self._started:
            self._started = True
            self.rewatch()

    def close(self) -> None:
        if self._watcher is not None:
            try:
                self._watcher.close()
            except Exception:  # noqa: BLE001
                log.debug("closing the hint watcher failed", exc_info=True)
        self._watcher = None

    def rewatch(self) -> None:
        """Watch exactly the role partitions not assigned to this member."""
        if self._watcher is None:
            return
        assigned = set(self._state.assigned_partitions())
        watched = tuple(sorted(p for p in self._state.partition_roles if p not in assigned))
        if watched == self.watched:
            return
        self.watched = watched
        self._seen = {p: t for p, t in self._seen.items() if p in watched}
        if not watched:
            self.next_nudge = None
            self._nudge_plan = []
            self._silence_seen.clear()
        try:
            self._watcher.watch(watched)
        except Exception as exc:  # noqa: BLE001 - without hints hand-overs are only slower
            self._warn("watch", "member %s cannot watch partition(s) %s for release "
                       "hints: %s", self._member, list(watched), exc)

    def watch_first(self, now: float) -> bool:
        """Block on the watcher rather than the group consumer?

        Only for a member that holds no partition (nothing of its own to read back) and while
        every watched partition shows a live leader (a record within two heartbeat
        intervals): then a hint is the likely next event. Otherwise the group's callbacks
        come first (an assignment after a crash, a nudge being answered).
        """
        if not self.watched or self.next_nudge is not None:
            return False
        if self._state.assigned_partitions():
            return False
        quiet = 2 * self._r.heartbeat_interval
        return all(now - self._seen.get(p, -math.inf) < quiet for p in self.watched)

    def poll(self, timeout: float) -> None:
        """Read the watched partitions for up to ``timeout`` seconds; hints go to ``on_hint``."""
        if self._watcher is None or not self.watched:
            return
        result = self._watcher.poll(timeout)
        handled = 0
        while result is not None:
            if isinstance(result, ConsumerFault):
                self._warn(f"watch:{result.code}", "hint watcher of member %s: %s: %s",
                           self._member, result.code, result.message)
            elif result.partition in self.watched and of_group(result.value, self._group_tag):
                # only this group's records are news of its leader: other roles' leaders
                # heartbeat on the same partition
                now = self._clock.monotonic()
                self._seen[result.partition] = now
                hint = decode_hint(result.value)
                if hint is not None and hint.member != self._member:
                    self._on_hint(result.partition, hint, now)
            handled += 1
            if handled >= _DRAIN:
                break
            result = self._watcher.poll(0)

    def hint_read(self, partition: int, hint: ReleaseHint, now: float) -> None:
        """The leader of ``partition`` left: ask for the assignment now, and a few times more."""
        self._state.counters["hints_read"] = self._state.counters.get("hints_read", 0) + 1
        log.debug("member %s read a release hint of %s on partition %d", self._member,
                  hint.member, partition)
        self._seen.pop(partition, None)   # the leader is gone: the group comes first now
        self._nudge(now)
        self._plan_nudges([now + d for d in _NUDGE_RETRIES])

    def nudge_if_due(self, now: float) -> None:
        """Nudge when a planned nudge is due (after a hint, or around a quiet leader's
        session deadline)."""
        self._check_silence(now)
        if self.next_nudge is not None and now >= self.next_nudge:
            while self._nudge_plan and self._nudge_plan[0] <= now:
                self._nudge_plan.pop(0)
            self.next_nudge = self._nudge_plan[0] if self._nudge_plan else None
            if self.watched:
                self._nudge(now)

    def _plan_nudges(self, times: Sequence[float]) -> None:
        self._nudge_plan = sorted(set(self._nudge_plan) | set(times))
        self.next_nudge = self._nudge_plan[0] if self._nudge_plan else None

    def _check_silence(self, now: float) -> None:
        """A watched partition went quiet: its leader died, stalls, or runs a long barrier.

        The coordinator hands the partition over only when the leader's session ends, at an
        instant this member cannot know exactly (about the leader's last record plus the
        session timeout). Learning of it at the next group heartbeat would add up to one
        interval; KIP-848 members heartbeat every 50 ms around the expected deadline instead
        (a heartbeat changes nothing at the coordinator, so this is safe whatever the leader
        is doing). Classic members do nothing: a rejoin starts a rebalance, and a leader that
        is quiet because its revoke barrier runs inside ``close()`` would then lose the
        partition before its barrier returns (observed with librdkafka 2.16).
        """
        if self._r.group_protocol == "classic":
            return
        quiet = 2 * self._r.heartbeat_interval
        for p in self.watched:
            last = self._seen.get(p)
            if last is None or self._silence_seen.get(p) == last or now - last < quiet:
                continue
            self._silence_seen[p] = last
            if self._r.group_heartbeat_interval > 2 * _BURST_STEP:
                first = last + self._r.session_timeout - self._r.group_heartbeat_interval
                count = int((self._r.group_heartbeat_interval + quiet) / _BURST_STEP) + 1
                self._plan_nudges([max(now, first + i * _BURST_STEP) for i in range(count)])

    def _nudge(self, now: float) -> None:
        """Ask the coordinator for our assignment now. Grants nothing by itself."""
        self._state.counters["nudges"] = self._state.counters.get("nudges", 0) + 1
        try:
            self._rejoin()
        except Exception as exc:  # noqa: BLE001 - the next group heartbeat does the same
            self._warn("rejoin", "member %s could not ask for its assignment early: %s",
                       self._member, exc)
