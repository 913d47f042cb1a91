"""MockNeli: a stand-in for :class:`~neli_orchestrate.core.neli.Neli` in your own unit tests.

Usage::

    neli = MockNeli(barrier=on_event)
    neli.acquire()                 # queued, like a rebalance
    assert neli.pulse()            # the next pulse delivers LeaderAcquired and returns True
    neli.fence()                   # next pulse: LeaderFenced, is_leader False

Same API as ``Neli`` (``pulse``, ``is_leader``, ``leads``, ``background``, ``close``, context
manager, barrier). Commands (:meth:`MockNeli.acquire`, :meth:`MockNeli.revoke`,
:meth:`MockNeli.fence`) take effect on the next ``pulse`` and the barrier runs on the pulsing
thread, as with the real member; ``pulse(timeout)`` waits up to ``timeout`` for a command.
No Kafka is involved.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Sequence

from neli_orchestrate.core.clock import SYSTEM_CLOCK, Clock
from neli_orchestrate.core.config import NeliConfig
from neli_orchestrate.core.events import (
    REASON_ACQUIRED,
    REASON_CLOSED,
    REASON_HEARTBEAT_TIMEOUT,
    REASON_REVOKED,
    Barrier,
    LeaderAcquired,
    LeaderEvent,
    LeaderFenced,
    LeaderRevoked,
)
from neli_orchestrate.core.pulser import Pulser
from neli_orchestrate.core.roles import Role, check_roles, partition_for
from neli_orchestrate.errors import NeliError

__all__ = ["MockNeli"]

log = logging.getLogger(__name__)


class MockNeli:
    """A scriptable NELI member: acquire, revoke and fence on command; same API as ``Neli``."""

    def __init__(self, config: NeliConfig | None = None, barrier: Barrier | None = None, *,
                 roles: Sequence[Role] | None = None, member_id: str = "mock-member",
                 clock: Clock | None = None, revoke_timeout: float | None = None) -> None:
        self.config = config
        if roles is None:
            roles = config.roles if config is not None else (0,)
        self._roles = check_roles(roles)
        self._partitions = (config.resolved.partitions_to_create
                            if config is not None else len(self._roles))
        self._revoke_timeout = (revoke_timeout if revoke_timeout is not None else
                                config.resolved.revoke_timeout if config is not None else 60.0)
        self._barrier = barrier
        self._member_id = member_id
        self._clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self._leading: dict[Role, bool] = dict.fromkeys(self._roles, False)
        self._commands: collections.deque[tuple[str, Role, str]] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._pulser: Pulser | None = None
        self.events: list[LeaderEvent] = []
        """Every event delivered so far, in order."""
        self.pulses = 0
        self.barrier_errors: list[BaseException] = []
        """Exceptions the barrier raised (logged and swallowed, as ``Neli`` does)."""

    # -- commands (any thread) ---------------------------------------------------------------

    def acquire(self, role: Role | None = None) -> None:
        """Make this member lead ``role`` (default: the first) from the next pulse on."""
        self._command("acquire", role)

    def revoke(self, role: Role | None = None) -> None:
        """Revoke ``role`` at the next pulse (``LeaderRevoked``; the barrier may block)."""
        self._command("revoke", role)

    def fence(self, role: Role | None = None, reason: str = REASON_HEARTBEAT_TIMEOUT) -> None:
        """Fence ``role`` at the next pulse (``LeaderFenced`` with ``reason``)."""
        self._command("fence", role, reason)

    def _command(self, kind: str, role: Role | None, reason: str = "") -> None:
        role = self._roles[0] if role is None else self._check_role(role)
        with self._cond:
            self._commands.append((kind, role, reason))
            self._cond.notify_all()

    # -- the Neli API ------------------------------------------------------------------------

    @property
    def member_id(self) -> str:
        return self._member_id

    @property
    def roles(self) -> tuple[Role, ...]:
        return self._roles

    @property
    def partitions(self) -> int:
        return self._partitions

    def partition_for(self, role: Role) -> int:
        return partition_for(self._check_role(role), self._partitions)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def is_leader(self) -> bool:
        return self.leads(self._roles[0])

    def leads(self, role: Role) -> bool:
        role = self._check_role(role)
        with self._cond:
            return not self._closed and self._leading[role]

    def pulse(self, timeout: float = 0.0) -> bool:
        """Apply queued commands (delivering their events here); wait up to ``timeout`` for one."""
        if timeout < 0:
            raise ValueError(f"pulse timeout must be >= 0, not {timeout!r}")
        with self._cond:
            if self._closed:
                return False
            self.pulses += 1
            if not self._commands and timeout > 0 and not self._leading[self._roles[0]]:
                self._cond.wait(timeout)
            commands = list(self._commands)
            self._commands.clear()
        for kind, role, reason in commands:
            self._apply(kind, role, reason)
        return self.is_leader

    def background(self, task: Callable[[], object] | None = None) -> Pulser:
        if self._closed:
            raise NeliError("this member is closed")
        if self._pulser is not None and self._pulser.running:
            raise NeliError("a background pulser already drives this member")
        self._pulser = Pulser(self, task, poll_timeout=0.05)
        return self._pulser.start()

    def close(self) -> None:
        """Revoke every role led (``LeaderRevoked``, reason ``member-closed``) and close."""
        with self._cond:
            if self._closed:
                return
            led = [r for r in self._roles if self._leading[r]]
        for role in led:
            self._apply("revoke", role, REASON_CLOSED)
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __enter__(self) -> MockNeli:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MockNeli(member={self._member_id!r}, leading={self._leading})"

    # -- internals ------------------------------------------------------------------------------

    def _check_role(self, role: Role) -> Role:
        if role not in self._leading:
            raise NeliError(f"role {role!r} is not one of this member's roles {list(self._roles)}")
        return role

    def _apply(self, kind: str, role: Role, reason: str) -> None:
        now, wall = self._clock.monotonic(), self._clock.time()
        p = partition_for(role, self._partitions)
        common = dict(role=role, partition=p, member=self._member_id, timestamp=now,
                      wall_time=wall)
        event: LeaderEvent
        with self._cond:
            leading = self._leading[role]
            if kind == "acquire":
                if leading:
                    return
                self._leading[role] = True
                event = LeaderAcquired(reason=REASON_ACQUIRED, **common)  # type: ignore[arg-type]
            elif kind == "revoke":
                if not leading:
                    return
                self._leading[role] = False
                event = LeaderRevoked(reason=reason or REASON_REVOKED,  # type: ignore[arg-type]
                                      deadline=now + self._revoke_timeout, **common)
            else:
                if not leading:
                    return
                self._leading[role] = False
                event = LeaderFenced(reason=reason, **common)  # type: ignore[arg-type]
            self.events.append(event)
        if self._barrier is not None:
            try:
                self._barrier(event)
            except Exception as exc:  # noqa: BLE001 - like Neli: log, keep going, but keep it
                self.barrier_errors.append(exc)
                log.exception("barrier of %s raised on %s", self._member_id,
                              type(event).__name__)
