"""Pulser: a background thread that keeps a member pulsing and runs a task while it leads.

Usage::

    with Neli(config, barrier=on_event) as neli:
        pulser = neli.background(do_a_bit_of_leader_work)
        ...                       # the main thread is free; neli.is_leader works from here
        pulser.stop()             # or neli.close(), which also ends the pulser
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

__all__ = ["Pulsable", "Pulser"]

log = logging.getLogger(__name__)


class Pulsable(Protocol):
    """What a pulser drives: :class:`~neli_orchestrate.core.neli.Neli` or ``MockNeli``."""

    @property
    def closed(self) -> bool: ...

    @property
    def member_id(self) -> str: ...

    def pulse(self, timeout: float = 0.0) -> bool: ...

    def close(self) -> None: ...


class Pulser:
    """Pulses a member from its own thread; calls ``task()`` repeatedly while the member leads.

    The task should do a bounded chunk of leader work and return: the member polls Kafka (and
    keeps its lease) only between two calls, so a task that runs longer than the heartbeat
    timeout loses leadership (``LeaderFenced``). A task that has nothing to do should wait a
    little inside itself rather than return at once.

    If the task raises, the pulser stops, keeps the exception in :attr:`error` and closes the
    member, so that leadership moves to another member instead of staying with a broken one.
    A fatal error from ``pulse`` also stops the pulser (kept in :attr:`error`).

    .. note:: The pulser does not make the task stop when leadership ends mid-task; react to
       ``LeaderFenced`` / ``LeaderRevoked`` in the barrier, or check ``is_leader``.
    """

    def __init__(self, neli: Pulsable, task: Callable[[], object] | None = None, *,
                 poll_timeout: float = 0.1, close_on_error: bool = True) -> None:
        self._neli = neli
        self._task = task
        self._poll_timeout = poll_timeout
        self._close_on_error = close_on_error
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"neli-pulser-{neli.member_id}", daemon=True
        )

    def start(self) -> Pulser:
        """Start the thread (done by ``Neli.background``); returns self."""
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        """True while the thread runs."""
        return self._thread.is_alive()

    @property
    def error(self) -> BaseException | None:
        """The exception that stopped the pulser (from the task or from ``pulse``), if any."""
        return self._error

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def stop(self, timeout: float | None = None) -> bool:
        """Stop pulsing (the member stays open) and wait up to ``timeout``; True once stopped."""
        self._stop.set()
        return self.join(timeout)

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the pulser ends (member closed, stopped or failed); True if it ended."""
        if threading.current_thread() is self._thread:
            return False
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        neli = self._neli
        leading = False
        try:
            while not self._stop.is_set() and not neli.closed:
                # A leader with a task pulses without blocking, so the task gets the time;
                # anyone else blocks in the poll until leadership arrives or time is up.
                timeout = 0.0 if (leading and self._task is not None) else self._poll_timeout
                leading = neli.pulse(timeout)
                if leading and self._task is not None and not self._stop.is_set():
                    self._task()
        except BaseException as exc:  # noqa: BLE001 - kept for the owner, who decides
            self._error = exc
            log.exception("pulser of member %s stopped", neli.member_id)
            if self._close_on_error:
                try:
                    neli.close()
                except Exception:  # noqa: BLE001
                    log.exception("closing member %s after a pulser failure failed",
                                  neli.member_id)
