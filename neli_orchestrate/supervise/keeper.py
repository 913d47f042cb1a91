"""The process tree of a piece of work: find all of it, stop all of it, confirm it is gone.

Standard library only: this file is also the *keeper* program (``python -I -S keeper.py``),
the parent of COMMAND that outlives a frozen or killed runner, and it starts in milliseconds.

Mechanisms, strongest first:

- **cgroup v2 with ``cgroup.kill``** (Linux 5.14+, where this process may create a child
  cgroup): COMMAND starts inside a cgroup of its own; nothing it starts can leave it, and
  ``cgroup.kill`` SIGKILLs every member at once, as systemd does.
- **child subreaper + /proc sweep** (any Linux): the keeper calls
  ``prctl(PR_SET_CHILD_SUBREAPER)``, so a worker that leaves COMMAND's process group or session
  (``setsid``, a daemonising double fork) is re-parented to the keeper, not to init, and every
  sweep of /proc finds it among the keeper's descendants.

Both run together where the cgroup exists (the sweep also reaches a process that left the
cgroup by privilege). A stop is: SIGTERM to everything, up to ``grace`` seconds, SIGKILL to
everything, again until nothing is left; zombies count as gone (they run no code).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable

#: prctl(2) option: orphaned descendants are re-parented to this process instead of init.
PR_SET_CHILD_SUBREAPER = 36
#: Seconds a stop allows between the SIGKILL and the confirmation that nothing is left;
#: the guard arithmetic (``neli_orchestrate.supervise.guard_margin``) budgets it.
KILL_BUDGET = 1.0
#: How often a stop looks again while it waits.
_TICK = 0.01


def set_subreaper() -> bool:
    """Make this process a child subreaper; False where the kernel refuses (not Linux, old)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) of ``pid``; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rfind(b")") + 2:].split()
    try:
        return rest[0].decode(), int(rest[1])
    except (IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def descendants(root: int) -> list[int]:
    """Every live (non-zombie) descendant of ``root`` now, from one reading of /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = _stat(int(name))
        if st is None or st[0] in ("Z", "X"):
            continue
        children.setdefault(st[1], []).append(int(name))
    found: list[int] = []
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def _signal(pid: int, sig: int) -> bool:
    """Send ``sig`` through a pidfd (never to a recycled pid); False if ``pid`` is gone."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        signal.pidfd_send_signal(fd, sig)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


class Cgroup:
    """A child cgroup v2 of this process's own, with ``cgroup.kill``."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def create(cls, name: str) -> Cgroup | str:
        """The new cgroup, or why none can be made here (a sentence)."""
        mount = None
        try:
            with open("/proc/self/mountinfo", encoding="utf-8") as f:
                for line in f:
                    fields = line.split()
                    if " - cgroup2 " in line:
                        mount = fields[4]
                        break
            with open("/proc/self/cgroup", encoding="utf-8") as f:
                own = next((line.strip()[3:] for line in f if line.startswith("0::")), None)
        except OSError as exc:
            return f"cannot read /proc: {exc}"
        if mount is None or own is None:
            return "no cgroup v2 hierarchy is mounted"
        parent = os.path.join(mount, own.lstrip("/"))
        path = os.path.join(parent, name)
        try:
            os.mkdir(path)
        except OSError as exc:
            return f"cannot create a cgroup under {parent}: {exc.strerror}"
        if not os.path.exists(os.path.join(path, "cgroup.kill")):
            with contextlib.suppress(OSError):
                os.rmdir(path)
            return f"{parent} has no cgroup.kill (Linux before 5.14)"
        return cls(path)

    def join(self) -> None:
        """Move the calling process into this cgroup (COMMAND's child, before exec)."""
        with open(os.path.join(self.path, "cgroup.procs"), "w", encoding="ascii") as f:
            f.write(str(os.getpid()))

    def holds(self, pid: int) -> bool:
        """True if ``pid`` is in this cgroup."""
        try:
            with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
                own = next((line.strip()[3:] for line in f if line.startswith("0::")), "")
        except OSError:
            return False
        return self.path.endswith(own) and own not in ("", "/")

    def procs(self) -> list[int]:
        try:
            with open(os.path.join(self.path, "cgroup.procs"), encoding="ascii") as f:
                return [int(p) for p in f.read().split()]
        except (OSError, ValueError):
            return []

    def kill(self) -> None:
        with contextlib.suppress(OSError), \
                open(os.path.join(self.path, "cgroup.kill"), "w", encoding="ascii") as f:
            f.write("1")

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            os.rmdir(self.path)


def reap_children(on_exit: Callable[[int, int], None] | None = None) -> None:
    """Reap every child of this process that has ended (orphans re-parented to a subreaper
    become its children); ``on_exit(pid, status)`` for each."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if on_exit is not None:
            on_exit(pid, status)


class Tree:
    """Every process a piece of work started: the live descendants of ``root`` (not in
    ``exclude``), every process seen so far that still lives, and the cgroup's members."""

    def __init__(self, root: int, *, cgroup: Cgroup | None = None,
                 exclude: Iterable[int] = (), reap: Callable[[], None] | None = None) -> None:
        self.root = root
        self.cgroup = cgroup
        self.exclude = set(exclude)
        self.seen: set[int] = set()
        self.reap = reap

    def alive(self) -> list[int]:
        if self.reap is not None:
            self.reap()
        now = {p for p in descendants(self.root) if p not in self.exclude}
        if self.cgroup is not None:
            now.update(self.cgroup.procs())
        now.update(p for p in self.seen if alive(p))
        now.discard(os.getpid())
        self.seen.update(now)
        return sorted(p for p in now if alive(p))

    def stop(self, grace: float, *, kill_budget: float = KILL_BUDGET,
             clock: Callable[[], float] = time.monotonic) -> tuple[int, int, list[int]]:
        """SIGTERM to all, up to ``grace`` s, SIGKILL to all until none is left.

        Returns (how many got SIGTERM, how many needed SIGKILL, pids still alive). Nothing
        here raises or returns early on a signal: the caller's handlers must not raise while
        this runs. Past ``kill_budget`` after the SIGKILL it keeps killing, for at most 10 s
        more, and then returns what is left (a process in uninterruptible sleep).
        """
        termed = [p for p in self.alive() if _signal(p, signal.SIGTERM)]
        end = clock() + grace
        while clock() < end and self.alive():
            time.sleep(_TICK)
        killed: set[int] = set()
        end = clock() + kill_budget + 10.0
        while True:
            left = self.alive()
            if not left or clock() >= end:
                return len(termed), len(killed), left
            if self.cgroup is not None:
                self.cgroup.kill()
            for pid in left:
                if _signal(pid, signal.SIGKILL):
                    killed.add(pid)
            time.sleep(_TICK / 2)


# -- the keeper program ----------------------------------------------------------------------


def _line(fd: int, text: str) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, (text.replace("\n", " ") + "\n").encode("utf-8", "replace"))


def main(argv: list[str]) -> int:
    """``keeper.py CTL_FD STATUS_FD GRACE LEASE MECHANISM -- COMMAND...``

    Reads from CTL_FD: ``L <monotonic deadline>`` (the lease: the latest instant the runner
    still proves leadership), ``S <reason>`` (stop now); EOF (the runner died) stops too.
    Writes to STATUS_FD: ``started <pid> <mechanism>`` or ``failed <status> <message>``,
    then once everything is gone ``done <returncode|-> <cause> <termed> <killed> <left>``.
    SIGTERM, SIGINT and SIGHUP to the keeper stop the work too; none interrupts a stop.
    """
    ctl, out = int(argv[0]), int(argv[1])
    grace, lease, mechanism = float(argv[2]), float(argv[3]), argv[4]
    command = argv[6:]
    os.set_blocking(out, True)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    asked: list[str] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: asked.append(signal.Signals(signum).name))
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)

    reaper = set_subreaper()
    cgroup: Cgroup | None = None
    why_not = "not asked for" if mechanism != "auto" else ""
    if mechanism == "auto":
        made = Cgroup.create(f"neli-work-{os.getpid()}-{time.monotonic_ns() % 10**9}")
        if isinstance(made, Cgroup):
            cgroup = made
        else:
            why_not = made
    group = cgroup

    def before_exec() -> None:
        if group is not None:
            group.join()

    try:
        proc = subprocess.Popen(command, start_new_session=True, close_fds=True,
                                preexec_fn=before_exec if group is not None else None)
    except FileNotFoundError:
        _line(out, f"failed 127 command not found: {command[0]}")
        if cgroup is not None:
            cgroup.remove()
        return 0
    except PermissionError:
        _line(out, f"failed 126 permission denied: {command[0]}")
        if cgroup is not None:
            cgroup.remove()
        return 0
    except (OSError, subprocess.SubprocessError) as exc:
        _line(out, f"failed 126 cannot start {command[0]}: {exc}")
        if cgroup is not None:
            cgroup.remove()
        return 0
    if cgroup is not None and not cgroup.holds(proc.pid) and alive(proc.pid):
        why_not = f"COMMAND did not join {cgroup.path}"
        cgroup.remove()
        cgroup = None
    parts = []
    if cgroup is not None:
        parts.append(f"cgroup:{cgroup.path}")
    if reaper:
        parts.append("subreaper")
    parts.append("proc-sweep")
    _line(out, f"started {proc.pid} {'+'.join(parts)} {why_not or '-'}")

    status: dict[int, int] = {}

    def on_exit(pid: int, raw: int) -> None:
        if pid == proc.pid:
            status[pid] = os.waitstatus_to_exitcode(raw)

    def reap() -> None:
        reap_children(on_exit)

    tree = Tree(os.getpid(), cgroup=cgroup, reap=reap)
    pidfd = os.pidfd_open(proc.pid)
    buffer = b""
    cause = ""
    while not cause:
        timeout = max(0.0, lease - time.monotonic())
        try:
            ready, _, _ = select.select([ctl, pidfd, wake_r], [], [], min(timeout, 3600.0))
        except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for clarity
            ready = []
        if asked:
            cause = f"keeper got {asked[0]}"
            break
        if wake_r in ready:
            with contextlib.suppress(OSError):
                os.read(wake_r, 512)
        if ctl in ready:
            data = os.read(ctl, 4096)
            if not data:
                cause = "runner gone"
                break
            buffer += data
            while b"\n" in buffer:
                raw, buffer = buffer.split(b"\n", 1)
                text = raw.decode("utf-8", "replace")
                if text.startswith("L "):
                    with contextlib.suppress(ValueError):
                        lease = max(lease, float(text[2:]))
                elif text.startswith("S"):
                    cause = "stop: " + (text[2:] or "asked")
        if pidfd in ready:
            reap()
            if proc.pid in status:
                cause = cause or "exited"
        if not cause and time.monotonic() >= lease:
            cause = "lease ended"
    termed, killed, left = tree.stop(grace)
    reap()
    if proc.pid not in status:
        with contextlib.suppress(ChildProcessError):
            _, last = os.waitpid(proc.pid, 0)
            status[proc.pid] = os.waitstatus_to_exitcode(last)
    if cgroup is not None and not left:
        cgroup.remove()
    code = status.get(proc.pid)
    _line(out, f"done {'-' if code is None else code} {cause.replace(' ', '_')} {termed}"
               f" {killed} {','.join(map(str, left)) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
