"""The leadership lifecycle of one claim: acquire a role's NELI member, keep it polled, release.

A :class:`~neli_orchestrate.Singleton` makes one per claim, reserve, execute, reset
or expire (package-private: users call the Singleton)::

    lead = _Leadership(config, "daily_flights", Neli, time.monotonic, metric)
    try:
        if lead.acquire(timeout=60):
            lead.attach(run)          # a loss of leadership from now on fences the run
            ...
    finally:
        lead.close()                  # leaves the group: the next deployment need not wait

.. note:: Leading is not holding the run: the claim in the ledger and its token are what
   fence a stale executor (:mod:`neli_orchestrate.singleton.singleton`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from neli_orchestrate.core.events import LeaderFenced, LeaderRevoked
from neli_orchestrate.metrics import Metric
from neli_orchestrate.singleton.config import SingletonConfig
from neli_orchestrate.singleton.run import Run

log = logging.getLogger(__name__)

__all__ = ["NeliFactory"]


class MetricCallback(Protocol):
    """How the lifecycle reports: ``metric(name, role, value=...)`` (the Singleton's hook)."""

    def __call__(self, name: Metric, role: str, run_key: str | None = None, *,
                 value: float = 1.0) -> None: ...


NeliFactory = Callable[..., Any]


class _Leadership:
    """The NELI member of one role for one claim: acquire, keep polled, watch, release.

    From the moment it leads, a watchdog thread pulses the member (heartbeats stop otherwise,
    and the member would fence itself while the ledger is being replayed). A loss of
    leadership is remembered in :attr:`lost` and fences the attached run.
    """

    def __init__(self, config: SingletonConfig, role: str, neli_factory: NeliFactory,
                 clock: Callable[[], float], metric: MetricCallback) -> None:
        self.role = role
        self._config = config
        self._clock = clock
        self._metric = metric
        self._lock = threading.Lock()
        self._run: Run | None = None
        self._lost: str | None = None
        self._work_done = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.neli = neli_factory(config.role_neli(role), barrier=self._barrier)

    @property
    def member(self) -> str:
        return str(self.neli.member_id)

    @property
    def lost(self) -> str | None:
        """Why leadership was lost since :meth:`acquire` succeeded, or None."""
        return self._lost

    def acquire(self, timeout: float) -> bool:
        """Poll until this member leads the role or ``timeout`` passes; then start the watchdog."""
        started = self._clock()
        deadline = started + timeout
        while not self.neli.pulse(timeout=self._config.poll_interval):
            if self._clock() >= deadline:
                return False
        self._metric(Metric.LEADER_ACQUIRED, self.role)
        self._metric(Metric.TIME_TO_LEAD, self.role, value=self._clock() - started)
        self._thread = threading.Thread(target=self._watchdog, name=f"neli-watchdog-{self.role}",
                                        daemon=True)
        self._thread.start()
        return True

    def attach(self, run: Run) -> None:
        """Fence ``run`` when leadership is lost (at once if it already was)."""
        with self._lock:
            self._run = run
            reason = self._lost
        if reason is not None:
            run._fence(reason)

    def verify(self) -> None:
        """Check leadership now (not only at the watchdog's next pulse); a loss fences the run."""
        if self._lost is None and not self.neli.is_leader:
            self._lose("leadership lost before the work started (lease lapsed)")

    def work_finished(self) -> None:
        """The work and its end record are done: release a waiting revoke barrier."""
        self._work_done.set()

    def detach(self) -> None:
        """Between two claims of a held role: no run attached, and from now on a loss of
        leadership is a loss again (``work_finished`` had stopped the watchdog counting it)."""
        with self._lock:
            self._run = None
        self._work_done.clear()

    def _lose(self, reason: str) -> None:
        with self._lock:
            if self._lost is not None:
                return
            self._lost = reason
            run = self._run
        log.warning("member %s lost leadership of role %r: %s", self.member, self.role, reason)
        self._metric(Metric.LEADER_LOST, self.role)
        if run is not None:
            run._fence(reason)

    def _watchdog(self) -> None:
        while not self._stop.is_set() and self._lost is None:
            try:
                leading = self.neli.pulse(timeout=self._config.poll_interval)
            except Exception as exc:  # noqa: BLE001 - a broken member cannot vouch for the run
                self._lose(f"the NELI member failed: {exc!r}")
                break
            if not leading and not self._stop.is_set() and not self._work_done.is_set():
                self._lose("leadership lost (own heartbeat missing or partition lost)")
                break
        if self._lost is not None and not self._stop.is_set():
            # A fenced member is closed at once (it leaves the group), not left unpolled in it
            # until max_poll_interval: the successor is assigned within the session timeout
            # even while work that cannot be cancelled is still finishing. (Not from inside
            # the barrier: LeaderFenced only flags the loss; this thread closes.)
            self._close_member()

    def _close_member(self) -> None:
        try:
            self.neli.close()
        except Exception:  # noqa: BLE001 - closing is best effort; the group times us out
            log.warning("closing the NELI member of role %r failed", self.role, exc_info=True)

    def _barrier(self, event: object) -> None:
        if isinstance(event, LeaderFenced):
            self._lose(f"fenced: {getattr(event, 'reason', event)}")
        elif isinstance(event, LeaderRevoked):
            # The revoke barrier: the successor is not assigned until this returns, so the
            # work and its COMPLETED record finish under our leadership. Past event.deadline
            # the member fences itself (LeaderFenced, delivered concurrently).
            if self._run is None or self._work_done.is_set():
                return
            remaining = event.deadline - self._clock()
            log.info("role %r revoked: waiting up to %.1f s for run %r to finish", self.role,
                     remaining, self._run.run_key)
            self._work_done.wait(max(0.0, remaining))

    def close(self) -> None:
        self._stop.set()
        self._work_done.set()
        # Close the member first: Neli.close wakes the watchdog's pulse at once (an extra own
        # heartbeat), where joining first waited for the pulse's poll_interval to run out.
        self._close_member()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(5.0, 10 * self._config.poll_interval))
