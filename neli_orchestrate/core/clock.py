"""Injectable clocks: the protocol reads time only through a :class:`Clock`.

Deadlines use the monotonic clock. The wall clock is read in one place only: to age a broker
(log-append) timestamp in Full NELI, where it is compared with the broker's clock.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "FakeClock", "SystemClock", "SYSTEM_CLOCK"]


@runtime_checkable
class Clock(Protocol):
    """Time source of a NELI member; inject a :class:`FakeClock` to test without waiting."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (deadlines, leases)."""
        ...

    def time(self) -> float:
        """Seconds since the Unix epoch (only to age broker timestamps)."""
        ...

    def wait(self, event: threading.Event, until: float) -> bool:
        """Wait until ``event`` is set or the monotonic clock reaches ``until``; return the flag."""
        ...


class SystemClock:
    """The real clocks of this host: ``time.monotonic`` and ``time.time``."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def wait(self, event: threading.Event, until: float) -> bool:
        return event.wait(max(0.0, until - time.monotonic()))

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK = SystemClock()


class FakeClock:
    """A clock that moves only when told to: deterministic tests of deadlines and leases.

    Usage::

        clock = FakeClock()
        clock.advance(0.5)          # half a second passes, instantly
        clock.monotonic()           # 1000.5

    ``wait(event, until)`` gives a real thread ``wait_grace`` real seconds to set the event;
    if it does not, the fake clock jumps to ``until`` (the deadline passed) and the flag is
    returned. Thread-safe.
    """

    def __init__(self, start: float = 1000.0, wall_offset: float = 1_700_000_000.0,
                 *, wait_grace: float = 2.0) -> None:
        self._now = float(start)
        self._wall_offset = float(wall_offset)
        self.wait_grace = wait_grace
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def time(self) -> float:
        with self._lock:
            return self._now + self._wall_offset

    def advance(self, seconds: float) -> float:
        """Move the clock forward by ``seconds`` (never backwards); return the new reading."""
        if seconds < 0:
            raise ValueError(f"a monotonic clock cannot go back ({seconds} s)")
        with self._lock:
            self._now += seconds
            return self._now

    def advance_to(self, instant: float) -> float:
        """Move the clock forward to ``instant`` if it is in the future; return the reading."""
        with self._lock:
            self._now = max(self._now, instant)
            return self._now

    def skew_wall(self, seconds: float) -> None:
        """Shift only the wall clock (simulates clock error between broker and member)."""
        with self._lock:
            self._wall_offset += seconds

    def wait(self, event: threading.Event, until: float) -> bool:
        if event.is_set() or self.monotonic() >= until:
            return event.is_set()
        if event.wait(self.wait_grace):
            return True
        self.advance_to(until)
        return event.is_set()

    def __repr__(self) -> str:
        return f"FakeClock(monotonic={self.monotonic():.3f})"
