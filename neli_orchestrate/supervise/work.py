"""Supervised work: start COMMAND under its keeper, renew its lease, stop all of it, confirm.

Usage (``neli-orchestrate run``; the keeper outlives a frozen or killed caller)::

    work = start(["./export.sh"], env, grace=3.0, lease=run.lease_deadline())
    try:
        ending = work.wait()                    # COMMAND exited; its leftovers are stopped too
    except BaseException:
        ending = work.stop("terminated")        # returns once nothing is left
        raise

and for work that runs inside this process (the fenced Airflow try)::

    tree = OwnTree()                            # this process becomes a child subreaper
    ...                                         # the work starts its subprocesses
    tree.stop(grace=0.0)                        # SIGTERM, SIGKILL, confirm

:func:`start` runs COMMAND under a *keeper* (``keeper.py``, standard library only), its
parent: a child subreaper, with COMMAND in a cgroup v2 of its own where one can be made (then
the stop ends with ``cgroup.kill``). The keeper stops everything when asked, when COMMAND
exits (its leftovers), when the caller dies (its control pipe closes) and when the *lease*
runs out: the caller renews it with the instant its proof of leadership ends
(:meth:`Work.renew`), so a caller that lost Kafka and then froze has its work stopped by the
keeper on the same deadline it would have fenced itself on.

.. note:: A stop cannot be cut short by signals: :meth:`Work.stop` does not return before the
   keeper confirms that nothing is left (or its own deadline passes, then it kills the keeper
   and sweeps what was re-parented to this process). Callers must not raise from signal
   handlers while it runs (``neli_orchestrate.cli.run`` defers them).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from neli_orchestrate.supervise.keeper import (
    KILL_BUDGET,
    Cgroup,
    Tree,
    reap_children,
    set_subreaper,
)

__all__ = ["CommandNotStarted", "Ending", "OwnTree", "Work", "start", "stop_seconds"]

log = logging.getLogger(__name__)

#: ``auto`` (cgroup v2 where one can be made, else subreaper + sweep) or ``subreaper``;
#: read from the environment so an operator can choose without a new option.
MECHANISM_ENV = "NELI_SUPERVISE_MECHANISM"

_KEEPER = str(Path(__file__).with_name("keeper.py"))


def stop_seconds(grace: float) -> float:
    """The longest a stop takes: the grace, then SIGKILL and its confirmation."""
    return grace + KILL_BUDGET


class CommandNotStarted(Exception):
    """COMMAND could not be started (``status``: 127 not found, 126 not executable)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Ending:
    """How supervised work ended, once nothing of it is left."""

    #: COMMAND's return code as :mod:`subprocess` gives it (-N: killed by signal N); None if
    #: unknown (the keeper itself was killed).
    returncode: int | None
    #: ``exited``, ``stop: <reason>``, ``lease ended``, ``runner gone``, ``keeper got SIGTERM``
    cause: str
    #: processes that got SIGTERM / needed SIGKILL
    terminated: int
    killed: int
    #: pids that survived every SIGKILL (empty when the stop is confirmed)
    left: tuple[int, ...] = ()

    @property
    def exit_status(self) -> int:
        """A shell's exit status (killed by signal N: 128 + N)."""
        code = self.returncode
        if code is None:
            return 128 + signal.SIGKILL
        return 128 - code if code < 0 else code


class Work:
    """COMMAND under its keeper (from :func:`start`)."""

    def __init__(self, keeper: subprocess.Popen[bytes], ctl: int, status: int, pid: int,
                 mechanism: str, grace: float) -> None:
        self.keeper = keeper
        self.pid = pid
        self.mechanism = mechanism
        self.grace = grace
        self._ctl = ctl
        self._status = status
        self._buffer = b""
        self._reading = threading.Lock()  # one reader of the keeper's status at a time
        self.ending: Ending | None = None

    @property
    def cgroup(self) -> str | None:
        for part in self.mechanism.split("+"):
            if part.startswith("cgroup:"):
                return part[len("cgroup:"):]
        return None

    def renew(self, deadline: float | None) -> None:
        """The lease now ends at monotonic ``deadline`` (None: leave it as it is)."""
        if deadline is not None:
            self._send(f"L {deadline!r}")

    def _send(self, text: str) -> None:
        with contextlib.suppress(OSError):
            os.write(self._ctl, (text + "\n").encode())

    def wait(self, timeout: float | None = None, wake: int | None = None) -> Ending | None:
        """The ending once COMMAND and everything it started are gone; None if ``timeout``
        passed or ``wake`` (a file descriptor) became readable first."""
        end = None if timeout is None else time.monotonic() + timeout
        if not self._reading.acquire(timeout=-1 if timeout is None else timeout):
            return self.ending
        try:
            return self._read(end, wake)
        finally:
            self._reading.release()

    def _read(self, end: float | None, wake: int | None) -> Ending | None:
        while self.ending is None:
            remaining = None if end is None else max(0.0, end - time.monotonic())
            fds = [self._status] + ([wake] if wake is not None else [])
            ready, _, _ = select.select(fds, [], [], remaining)
            if self._status in ready:
                data = os.read(self._status, 4096)
                if not data:
                    return self._keeper_gone()
                self._buffer += data
                ending = self._parse()
                if ending is not None:
                    return ending
                continue
            if ready or (end is not None and time.monotonic() >= end):
                return None
        return self.ending

    def _parse(self) -> Ending | None:
        while b"\n" in self._buffer:
            raw, self._buffer = self._buffer.split(b"\n", 1)
            parts = raw.decode("utf-8", "replace").split()
            if parts and parts[0] == "done" and len(parts) >= 6:
                code = None if parts[1] == "-" else int(parts[1])
                left = () if parts[5] == "-" else tuple(int(p) for p in parts[5].split(","))
                self.ending = Ending(code, parts[2].replace("_", " "), int(parts[3]),
                                     int(parts[4]), left)
                self._close()
                return self.ending
        return None

    def stop(self, reason: str) -> Ending:
        """Stop everything (SIGTERM, grace, SIGKILL) and return once nothing is left.

        Waits for the keeper's confirmation up to :func:`stop_seconds` plus a few seconds;
        past that it kills the keeper and sweeps what was re-parented to this process.
        """
        if self.ending is not None:
            return self.ending
        log.warning("stopping command (pid %s and every process it started; %s): %s",
                    self.pid, self.mechanism, reason)
        self._send("S " + reason)
        ending = self.wait(timeout=stop_seconds(self.grace) + 12.0)
        if ending is not None:
            return ending
        log.error("the keeper (pid %s) did not confirm the stop: killing it and sweeping",
                  self.keeper.pid)
        return self._keeper_gone()

    def _keeper_gone(self) -> Ending:
        """The keeper died or hangs: everything it held is re-parented to this process (a
        subreaper) or is in the cgroup; stop it from here."""
        with contextlib.suppress(OSError):
            self.keeper.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.keeper.wait(timeout=5.0)
        path = self.cgroup
        tree = Tree(os.getpid(), cgroup=Cgroup(path) if path else None, reap=reap_children)
        tree.seen.add(self.pid)
        termed, killed, left = tree.stop(0.0)
        if tree.cgroup is not None and not left:
            tree.cgroup.remove()
        self.ending = Ending(None, "keeper gone", termed, killed, tuple(left))
        self._close()
        return self.ending

    def _close(self) -> None:
        for fd in (self._ctl, self._status):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._ctl = self._status = -1
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.keeper.wait(timeout=5.0)


def start(command: Sequence[str], env: Mapping[str, str], *, grace: float,
          lease: float | None = None, mechanism: str | None = None) -> Work:
    """Start COMMAND under a keeper; returns once it runs (or raises
    :class:`CommandNotStarted`). ``lease``: monotonic instant at which the keeper stops the
    work unless :meth:`Work.renew` moves it (None: no lease)."""
    chosen = (mechanism or os.environ.get(MECHANISM_ENV) or "auto").strip().lower()
    if chosen not in ("auto", "subreaper"):
        raise ValueError(f"{MECHANISM_ENV}={chosen!r}: use auto or subreaper")
    set_subreaper()  # should the keeper die, its orphans come here, not to init
    ctl_r, ctl_w = os.pipe()
    st_r, st_w = os.pipe()
    try:
        keeper = subprocess.Popen(
            [sys.executable, "-I", "-S", _KEEPER, str(ctl_r), str(st_w), repr(float(grace)),
             repr(float("inf") if lease is None else float(lease)), chosen, "--",
             *command],
            env=dict(env), pass_fds=(ctl_r, st_w), start_new_session=True)
    finally:
        os.close(ctl_r)
        os.close(st_w)
    buffer = b""
    while b"\n" not in buffer:
        data = os.read(st_r, 4096)
        if not data:
            break
        buffer += data
    first, _, rest = buffer.partition(b"\n")
    parts = first.decode("utf-8", "replace").split(" ", 3)
    if not parts or parts[0] != "started":
        os.close(ctl_w)
        os.close(st_r)
        keeper.wait()
        if parts and parts[0] == "failed":
            raise CommandNotStarted(int(parts[1]), " ".join(parts[2:]))
        raise CommandNotStarted(126, f"the keeper could not start {command[0]!r}")
    work = Work(keeper, ctl_w, st_r, int(parts[1]), parts[2], grace)
    work._buffer = rest
    if len(parts) > 3 and parts[3] != "-" and chosen == "auto":
        log.warning("no cgroup for the command (%s): stopping it through the child subreaper"
                    " and /proc sweeps", parts[3])
    log.info("started %s (pid %s) under keeper pid %s: %s", list(command)[:3], work.pid,
             keeper.pid, work.mechanism)
    return work


class OwnTree:
    """The processes that work running in *this* process starts (the fenced Airflow try).

    Makes this process a child subreaper, so a worker that leaves its parent's session is
    re-parented here and found; processes that already existed are left alone.
    """

    def __init__(self) -> None:
        self.subreaper = set_subreaper()
        self._tree = Tree(os.getpid(), reap=self._reap)
        self._tree.exclude = set(self._tree.alive())
        self._tree.seen.clear()

    @staticmethod
    def _reap() -> None:
        # Only re-parented orphans: a child this process started itself (subprocess.Popen)
        # is the work's to wait for.
        return None

    def alive(self) -> list[int]:
        """The work's processes alive now."""
        return self._tree.alive()

    def stop(self, grace: float) -> tuple[int, int, list[int]]:
        """SIGTERM, ``grace``, SIGKILL to every process the work started; (termed, killed,
        left) once none is left. Ignores signals' exceptions only in that the caller must not
        raise from handlers meanwhile."""
        return self._tree.stop(grace)
