"""`neli-orchestrate run --hold` with a real `dagster-daemon` on two "hosts" of one instance.

Dagster supports one daemon per instance; two for availability launch duplicate schedule runs
(dagster-io/dagster#9623). Here both hosts run `run --hold --role dagster-daemon -- dagster-daemon
run`; the leading host is killed with SIGKILL after the schedule's first tick. Checked: at most
one daemon process alive at any 50 ms sample, the other host's daemon starts within the session
timeout plus its start-up, and every tick from the first to the last has exactly one run.
(Dagster's own tick records kept two daemons on one SQLite instance from launching a tick twice
in a mutation run; the daemon count is what catches a held command left running.)
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from cli_helpers import new_namespace
from test_run import Region, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.dagster]

HERE = Path(__file__).resolve().parent
SESSION = 3.0


def daemons(home: Path) -> list[int]:
    """Pids of live dagster-daemon processes of this test's instance."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            if not any(part.endswith(b"dagster-daemon") for part in cmdline[:2]):
                continue
            if f"DAGSTER_HOME={home}".encode() not in (entry / "environ").read_bytes():
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if state != "Z":
            found.append(int(entry.name))
    return found


def runs_by_tick(home: Path) -> dict[str, list[str]]:
    import dagster as dg

    os.environ["DAGSTER_HOME"] = str(home)
    with dg.DagsterInstance.get() as instance:
        by_tick: dict[str, list[str]] = {}
        for run in instance.get_runs():
            tick = run.tags.get(".dagster/scheduled_execution_time")  # the scheduler sets it
            if tick is not None:
                by_tick.setdefault(tick, []).append(run.run_id)
        return by_tick


def test_dagster_daemon_held_on_two_hosts_runs_each_tick_once(kafka_broker, tmp_path,
                                                             monkeypatch) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("")  # defaults: SQLite storage in DAGSTER_HOME
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    assert runs_by_tick(home) == {}  # creates the instance's storage before any daemon races
    namespace = new_namespace()
    most, samples, stop = [0], [0], threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            most[0] = max(most[0], len(daemons(home)))
            samples[0] += 1

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    command = ["dagster-daemon", "run", "-f", str(HERE / "daemon_defs.py"),
               "--working-directory", str(HERE)]
    hosts = {name: Region(kafka_broker, namespace, name, "dagster-daemon", "",
                          [str(Path(sys.executable).parent / command[0]), *command[1:]],
                          "--hold", "--restart-delay", "1")
             for name in ("host-a", "host-b")}
    try:
        first_daemon = wait_for(lambda: daemons(home), 120, "a daemon to start")[0]
        # the first tick's run, launched by the leading host's daemon
        wait_for(lambda: runs_by_tick(home), 150, "the schedule's first run")
        leader = next(h for h in hosts.values()
                      if first_daemon in _descendants(h.proc.pid))
        other = next(h for h in hosts.values() if h is not leader)
        killed_at = time.monotonic()
        leader.proc.kill()  # kill -9 of the leading host's line
        second = wait_for(lambda: [p for p in daemons(home) if p != first_daemon], 60,
                          "the other host's daemon")[0]
        took = time.monotonic() - killed_at
        assert second in _descendants(other.proc.pid)
        assert took < SESSION + 30, took  # session timeout plus the daemon's start-up
        ticks_before = set(runs_by_tick(home))
        # one more tick under the new daemon: with the first tick it spans the hand-over, so
        # the one-minute spacing below still shows none was missed (a second one added ~60 s)
        wait_for(lambda: len(set(runs_by_tick(home)) - ticks_before) >= 1, 140,
                 "a tick under the second daemon")
        by_tick = runs_by_tick(home)
        print(f"\ndaemon hand-over {took:.1f} s after kill -9; ticks {sorted(by_tick)}")
        assert all(len(runs) == 1 for runs in by_tick.values()), by_tick
        from datetime import datetime, timedelta
        ticks = sorted(datetime.fromisoformat(t) for t in by_tick)
        assert [b - a for a, b in zip(ticks, ticks[1:], strict=False)] == \
            [timedelta(minutes=1)] * (len(ticks) - 1), ticks  # no tick missed
        assert samples[0] > 100 and most[0] == 1, f"{most[0]} daemons alive at once"
    finally:
        stop.set()
        sampler.join()
        for host in hosts.values():
            if host.proc.poll() is None:
                os.kill(host.proc.pid, signal.SIGTERM)
                host.proc.communicate(timeout=60)
        wait_for(lambda: not daemons(home), 60, "every daemon to stop")


def _descendants(pid: int) -> set[int]:
    """``pid``'s live descendants (dagster-daemon runs in a new session, so walk parents)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                parents[int(entry.name)] = int(fields[1])
            except (FileNotFoundError, IndexError, ValueError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        children = {child for child, parent in parents.items() if parent in frontier}
        frontier = children - found
        found |= children
    return found
