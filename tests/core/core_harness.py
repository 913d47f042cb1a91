"""Drive NELI members in separate processes and read back what each one saw, and when."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MEMBER = Path(__file__).with_name("core_member.py")
DEADLINE = 45.0   # generous: CI shares two cores between broker, members and other tests


@dataclass
class Interval:
    member: str
    role: str
    start: float
    end: float | None  # None: still leading when observed


class Member:
    """One member process; its output is a JSON-lines file written by core_member.py."""

    def __init__(self, tmp: Path, name: str, **settings: Any) -> None:
        self.name = name
        self.out = tmp / f"{name}.jsonl"
        self.err = tmp / f"{name}.stderr"
        settings = {"name": name, "out": str(self.out), **settings}
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(MEMBER), json.dumps(settings)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err,
                cwd=str(MEMBER.parent),
            )
        self.killed_at: float | None = None

    # -- reading ----------------------------------------------------------------------------

    def lines(self, kind: str | None = None) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        result = []
        for raw in self.out.read_text().splitlines():
            try:
                line = json.loads(raw)
            except ValueError:
                continue  # a line being written
            if kind is None or line["kind"] == kind:
                result.append(line)
        return result

    def events(self, *types: str) -> list[dict[str, Any]]:
        return [e for e in self.lines("event") if not types or e["type"] in types]

    def leading(self, role: str = "0") -> bool:
        """Leads ``role`` according to its events (Acquired not yet followed by an end)."""
        state = False
        for e in self.events():
            if str(e["role"]) == role:
                state = e["type"] == "LeaderAcquired"
        return state and self.killed_at is None

    def intervals(self, role: str = "0") -> list[Interval]:
        result: list[Interval] = []
        for e in self.events():
            if str(e["role"]) != role:
                continue
            if e["type"] == "LeaderAcquired":
                result.append(Interval(self.name, role, e["ts"], None))
            elif result and result[-1].end is None:
                result[-1].end = e["ts"]
        if result and result[-1].end is None and self.killed_at is not None:
            result[-1].end = self.killed_at   # a dead process does no more work
        return result

    def tail(self) -> str:
        text = self.out.read_text() if self.out.exists() else ""
        err = self.err.read_text(errors="replace") if self.err.exists() else ""
        return f"--- {self.name} output ---\n{text[-3000:]}\n--- stderr ---\n{err[-3000:]}"

    # -- commands ----------------------------------------------------------------------------

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"close\n")
        self.proc.stdin.flush()

    def kill(self) -> float:
        self.killed_at = time.monotonic()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        return self.killed_at

    def stop(self) -> float:
        self.proc.send_signal(signal.SIGSTOP)
        return time.monotonic()

    def cont(self) -> float:
        self.proc.send_signal(signal.SIGCONT)
        return time.monotonic()

    def wait_exit(self, timeout: float = DEADLINE) -> int:
        return self.proc.wait(timeout)

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(30)


def wait_for(what: str, condition: Callable[[], Any], members: Iterable[Member],
             timeout: float = DEADLINE) -> Any:
    """Poll ``condition`` until it returns a truthy value; fail with every member's log."""
    members = list(members)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        for m in members:
            code = m.proc.poll()
            if code not in (None, 0) and m.killed_at is None:
                raise AssertionError(f"member {m.name} exited with {code}\n{m.tail()}")
        time.sleep(0.02)
    logs = "\n".join(m.tail() for m in members)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}\n{logs}")


def leader_among(members: Iterable[Member], role: str = "0") -> Member | None:
    leaders = [m for m in members if m.leading(role)]
    assert len(leaders) <= 1, f"two leaders at once: {[m.name for m in leaders]}"
    return leaders[0] if leaders else None


def samples_after(member: Member, since: float) -> list[dict[str, Any]]:
    return [s for s in member.lines("sample") if s["ts"] > since]


def assert_no_overlap(members: Iterable[Member], role: str = "0") -> list[Interval]:
    """Leadership intervals of ``role`` across members never overlap (exclusive mode)."""
    intervals = sorted((i for m in members for i in m.intervals(role)), key=lambda i: i.start)
    for before, after in zip(intervals, intervals[1:], strict=False):
        assert before.end is not None and before.end <= after.start, (
            f"{before.member} led role {role} until {before.end} but {after.member} "
            f"already led from {after.start}"
        )
    return intervals


def uncovered(intervals: list[Interval], start: float, end: float) -> list[tuple[float, float]]:
    """Gaps in [start, end] where no interval (end None = still open) covers the time."""
    gaps = []
    cursor = start
    for i in sorted(intervals, key=lambda i: i.start):
        if i.start > cursor:
            gaps.append((cursor, min(i.start, end)))
        cursor = max(cursor, i.end if i.end is not None else end)
        if cursor >= end:
            break
    if cursor < end:
        gaps.append((cursor, end))
    return [(a, b) for a, b in gaps if b > a]


def env_ok() -> None:
    assert os.name == "posix", "these tests signal processes (SIGSTOP, SIGKILL)"
