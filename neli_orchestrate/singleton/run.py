"""What :class:`~neli_orchestrate.Singleton` answers: a :class:`Reservation`, or a
:class:`Run` that is held while the work runs and fenced if leadership is lost meanwhile.

Usage::

    with singleton.claim(role="daily_flights", run_key="2013-01-05") as run:
        if run.should_run:
            run.on_fence(lambda reason: job.cancel())
            build_table(token=run.token)

Both carry the :class:`~neli_orchestrate.claim.Claim` handed to the work (``.claim``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from neli_orchestrate.claim import Claim
from neli_orchestrate.decision import Outcome
from neli_orchestrate.errors import FencedError
from neli_orchestrate.ledger.record import LedgerRecord

log = logging.getLogger(__name__)

_UNSAID = object()

__all__ = ["Reservation", "Run"]


@dataclass(frozen=True)
class Reservation:
    """Answer of :meth:`Singleton.reserve`: whether this deployment now holds the run's claim."""

    role: str
    run_key: str
    outcome: Outcome
    reason: str
    #: The claim's fencing token when :attr:`should_run`, else None.
    token: int | None
    #: The latest ledger record the decision saw (for SKIP_DONE: who completed it, and when).
    record: LedgerRecord | None
    deployment: str
    #: WAIT: wall-clock time after which asking again may give another answer (None: ask at
    #: the caller's own interval; another member leads, or the other deployment must act).
    wait_until: float | None = None

    @property
    def should_run(self) -> bool:
        """True if this deployment holds a fresh claim and its executor should run the work."""
        return self.token is not None

    @property
    def claim(self) -> Claim | None:
        """The claim this deployment holds (the handle its work gets), None unless
        :attr:`should_run`."""
        if self.token is None:
            return None
        return Claim(token=self.token, run_key=self.run_key, role=self.role,
                     deployment=self.deployment)


@dataclass(frozen=True, eq=False, repr=False)
class Run(Reservation):
    """One run of a role inside :meth:`Singleton.claim` or :meth:`Singleton.execute`: the
    answer, held while the work runs, and fenced (:meth:`check`, :meth:`on_fence`) if
    leadership is lost meanwhile.

    ``outcome`` says what the decision table decided; run the work only if :attr:`should_run`.
    """

    def __post_init__(self) -> None:
        object.__setattr__(self, "_lock", threading.Lock())
        object.__setattr__(self, "_fenced", None)
        object.__setattr__(self, "_callbacks", [])
        object.__setattr__(self, "_retry_in", _UNSAID)
        object.__setattr__(self, "_held", None)
        object.__setattr__(self, "_lease", None)

    _lock: threading.Lock = field(init=False, repr=False)
    _fenced: str | None = field(init=False, repr=False)
    _callbacks: list[Callable[[str], object]] = field(init=False, repr=False)
    _retry_in: float | None | object = field(init=False, repr=False)
    #: Set by the singleton while the run is held: writes RUNNING updates of this claim.
    _held: Any = field(init=False, repr=False)
    #: Set by the singleton while the run is held: the member's leadership deadline.
    _lease: Callable[[], float | None] | None = field(init=False, repr=False)

    def lease_deadline(self) -> float | None:
        """The monotonic instant (``time.monotonic``) at which this member's last proof of
        leadership runs out, unless renewed; None when it does not lead (or the run is not
        held). A process outside the member (``neli-orchestrate run``'s keeper) stops the work
        by then."""
        lease = self._lease
        if lease is None or self._fenced is not None:
            return None
        return lease()

    @property
    def unstopped(self) -> tuple[str, ...]:
        """Remote applications earlier claims of this run key started that nobody confirmed
        stopped (e.g. ``standalone application driver-… on spark://…``); empty if none.

        Before starting work that must not run beside them, stop each and confirm it stopped,
        then call :meth:`record_stopped`. The fenced Airflow task does this for Spark
        applications.
        """
        held = self._held
        return held.record.unstopped if held is not None else ()

    def record_application(self, application: str) -> None:
        """Name, in the ledger, the remote application this run's work just submitted (a Spark
        driver in cluster deploy mode), so that a successor can stop it should this try die or
        be cut off before it stops it itself. Writes a ``RUNNING`` update of this claim.

        Raises :class:`FencedError` if the run was fenced meanwhile.
        """
        self._update(application=_text("application", application))

    def record_stopped(self, application: str) -> None:
        """Say that ``application``, one of :attr:`unstopped`, is confirmed stopped: a
        ``RUNNING`` update drops it, and later claims no longer inherit it."""
        if application not in self.unstopped:
            raise ValueError(f"{application!r} is not among this run's unstopped applications "
                             f"{self.unstopped!r}")
        self._update(unstopped=tuple(a for a in self.unstopped if a != application))

    def _update(self, **fields: Any) -> None:
        held = self._held
        if held is None:
            raise RuntimeError("only a held run (inside the work) records its application")
        self.check()
        held.update(self, **fields)

    def expect_retry(self, seconds: float | None) -> None:
        """Say, before the work's error leaves the run, when this deployment tries again.

        ``seconds``: this deployment's orchestrator starts its next try in about that long
        (Airflow: the task's retry delay); the ``FAILED`` record then keeps the run key for
        that try until ``seconds`` plus ``handoff_timeout`` from now. ``None``: no try of this
        deployment will follow (the last try, or the deployment is being stopped): the
        ``FAILED`` record lets any deployment take the run over at once. Not called: the
        window is ``handoff_timeout`` from the failure.
        """
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(
                seconds, int | float) or not 0 <= seconds < float("inf")):
            raise ValueError(f"seconds must be None or a finite number >= 0, got {seconds!r}")
        object.__setattr__(self, "_retry_in", seconds)

    def _retry_deadline(self, now: float, handoff_timeout: float) -> float | None:
        """The ``FAILED`` record's handoff deadline by :meth:`expect_retry` (None: not said)."""
        retry_in = self._retry_in
        if retry_in is _UNSAID:
            return None
        if retry_in is None:
            return now
        return now + float(retry_in) + handoff_timeout  # type: ignore[arg-type]

    @property
    def fenced(self) -> bool:
        """True once leadership was lost while the work ran."""
        return self._fenced is not None

    def on_fence(self, callback: Callable[[str], object]) -> None:
        """Call ``callback(reason)`` from the watchdog thread when leadership is lost.

        Use it to stop the work at once (kill spark-submit, cancel a Spark job group). A
        callback registered after the fence runs immediately.

        .. note:: Callbacks run on the watchdog thread; keep them short and thread-safe.
        """
        with self._lock:
            reason = self._fenced
            if reason is None:
                self._callbacks.append(callback)
        if reason is not None:
            _call_quietly(callback, reason)

    def check(self) -> None:
        """Raise :class:`FencedError` if this member no longer holds the run."""
        reason = self._fenced
        if reason is not None:
            raise FencedError(
                f"role {self.role!r} run {self.run_key!r} (token {self.token}) was fenced:"
                f" {reason}",
                role=self.role,
                token=self.token,
            )

    def _fence(self, reason: str) -> None:
        with self._lock:
            if self._fenced is not None:
                return
            object.__setattr__(self, "_fenced", reason)
            callbacks = self._callbacks
            object.__setattr__(self, "_callbacks", [])
        log.error("fenced: role %r run %r token %s: %s", self.role, self.run_key, self.token,
                  reason)
        for callback in callbacks:
            _call_quietly(callback, reason)

    def __repr__(self) -> str:
        return (f"Run(role={self.role!r}, run_key={self.run_key!r}, outcome={self.outcome},"
                f" token={self.token})")


def _text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _call_quietly(callback: Callable[[str], object], reason: str) -> None:
    try:
        callback(reason)
    except Exception:  # noqa: BLE001 - one bad callback must not stop the others
        log.exception("fence callback %r failed", callback)

