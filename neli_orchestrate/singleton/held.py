"""A role this process keeps leading between claims: :meth:`Singleton.hold`.

Usage (a long-lived process that runs a role's work, e.g. a scheduler loop or a worker)::

    with singleton.hold("daily_flights") as held:        # joins the group once, then leads
        for date in dates:
            with held.claim(date) as run:                 # replay + commit: no join, no leave
                if run.should_run:
                    build_table(token=run.token)

A claim through a held role skips what a one-off claim pays for every time: the busy check,
a new member (its clients, their coordinators, the leader topic's check), the join and the
assignment, the membership proof, the leave. It reads the ledger's end and commits the claim
(about four round trips to the broker, docs/internals/performance.md). The decision table,
the fence and the token rule are the same as a one-off claim's.

While the role is held, other deployments find its group busy: their gates answer ``WAIT`` (or
``SKIP_DONE``) without joining, as under any running leader. Leaving the block leaves the group,
so a standby leads at once. When leadership is lost (the lease lapsed, the partition was
revoked, the member failed), the work running then is fenced and every later call raises
:class:`FencedError`: hold the role again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from neli_orchestrate.claim import Claim
from neli_orchestrate.errors import ConfigError, FencedError
from neli_orchestrate.ledger.record import RunState
from neli_orchestrate.singleton.leadership import _Leadership
from neli_orchestrate.singleton.run import Reservation, Run

if TYPE_CHECKING:
    from neli_orchestrate.singleton.singleton import Singleton

__all__ = ["HeldRole"]

T = TypeVar("T")


class HeldRole:
    """The claims of one role while this process leads it (from :meth:`Singleton.hold`).

    The same answers as the :class:`~neli_orchestrate.Singleton` methods of the same names,
    one claim at a time (calls from several threads queue).
    """

    def __init__(self, singleton: Singleton, lead: _Leadership) -> None:
        self._singleton = singleton
        self._lead = lead
        self._lock = threading.Lock()
        self._ended = False

    @property
    def role(self) -> str:
        """The role held."""
        return self._lead.role

    @property
    def lost(self) -> str | None:
        """Why leadership was lost (the hold is over), or None while it holds."""
        return self._lead.lost

    def reserve(self, run_key: str) -> Reservation:
        """As :meth:`Singleton.reserve`, without joining or leaving: the claim's ``CLAIMED``
        record, for :meth:`execute` in this process (no other process can lead the role
        while it is held)."""
        single = self._singleton
        with self._lock:
            self._leading()
            writer = None
            try:
                run, _, writer = single._claim_as_leader(self._lead, self.role, run_key,
                                                         RunState.CLAIMED)
                return single._reservation(run)
            finally:
                if writer is not None:
                    single._release(writer, self._lead)
                self._lead.detach()

    @contextlib.contextmanager
    def claim(self, run_key: str) -> Iterator[Run]:
        """As :meth:`Singleton.claim`: decide on ``run_key`` and hold the run for the block if
        it is ours (``COMPLETED`` when the block ends, ``FAILED`` on an exception)."""
        with self._lock:
            self._leading()
            with self._singleton._claimed(self._lead, self.role, run_key,
                                          let_go=self._lead.detach) as run:
                yield run

    def execute(self, claim: Claim, work: Callable[[Run], T], /, *,
                on_fence: Callable[[str], object] | None = None) -> T:
        """As :meth:`Singleton.execute`: verify the claim of :meth:`reserve`, run ``work(run)``
        and record the outcome."""
        if claim.role is not None and claim.role != self.role:
            raise ConfigError(f"the claim of run {claim.run_key!r} is for role {claim.role!r},"
                              f" not the held role {self.role!r}")
        with self._lock:
            self._leading()
            try:
                return self._singleton._execute_as_leader(
                    self._lead, dataclasses.replace(claim, role=self.role), work,
                    on_fence=on_fence)
            finally:
                self._lead.detach()

    def _end(self) -> None:
        self._ended = True

    def _leading(self) -> None:
        """Raise unless leadership still holds, by the lease at this instant (not only at the
        watchdog's last pulse)."""
        if self._ended:
            raise FencedError(f"role {self.role!r} is no longer held (its hold block ended)",
                              role=self.role)
        self._lead.verify()
        if self._lead.lost is not None:
            raise FencedError(f"the hold of role {self.role!r} ended: {self._lead.lost}; hold"
                              " it again (Singleton.hold)", role=self.role)
