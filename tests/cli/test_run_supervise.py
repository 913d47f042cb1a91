"""Nothing a stint started outlives it: `run` and `run --hold` against a real broker.

Each scenario of issue #29, with two claims' processes sampled from /proc every 5 ms: the
overlap (time during which processes of two different claims were alive at once) must be
0.00 s. COMMAND and every worker it starts log their pid and token; the sampler checks which of
them live.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import test_run
from cli_helpers import new_namespace, singleton
from test_run import Region, alive, wait_for

from neli_orchestrate.ledger.record import RunState
from neli_orchestrate.supervise import keeper

pytestmark = pytest.mark.kafka

#: COMMAND: ``log mode``. Modes: ``drain`` (on SIGTERM, takes 30 s to exit: SIGKILL ends it),
#: ``leave`` (starts a worker in its own process group, exits 0 after 1 s), ``setsid`` (starts
#: a worker in a new session with ``setsid -f``, which leaves it an orphan, then runs),
#: ``ignore`` (ignores SIGTERM). Workers ignore SIGTERM.
WORK = textwrap.dedent("""
    import json, os, signal, subprocess, sys, time
    log, mode = sys.argv[1], sys.argv[2]
    def note(event):
        with open(log, "a") as f:
            f.write(json.dumps({"event": event, "pid": os.getpid(), "t": time.monotonic(),
                                "token": os.environ.get("NELI_TOKEN"), "mode": mode}) + "\\n")
    if mode == "worker":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        note("start")
        while True:
            time.sleep(0.05)
    def drain(signum, frame):
        note("sigterm")
        end = time.monotonic() + 30
        while time.monotonic() < end:
            time.sleep(0.02)
        sys.exit(0)
    note("start")
    if mode in ("drain", "setsid"):
        signal.signal(signal.SIGTERM, drain)
    if mode == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "leave":
        subprocess.Popen([sys.executable, "-c", CODE, log, "worker"])
        time.sleep(1.0)
        sys.exit(0)
    if mode == "setsid":
        subprocess.Popen(["setsid", "-f", sys.executable, "-c", CODE, log, "worker"])
    while True:
        time.sleep(0.05)
""")
WORK = "CODE = " + repr(WORK) + "\n" + WORK


class Overlap:
    """Samples /proc every 5 ms: how long processes of two different claims lived at once."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.seconds = 0.0
        self.samples = 0
        self.pids: dict[int, str] = {}
        #: monotonic time of the last sample that saw each pid alive
        self.last_alive: dict[int, float] = {}
        self._offset = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        if not self.log.exists():
            return
        with open(self.log, encoding="utf-8") as f:
            f.seek(self._offset)
            text = f.read()
        complete = text[:text.rfind("\n") + 1]
        self._offset += len(complete.encode())
        for line in complete.splitlines():
            event = json.loads(line)
            if event["event"] == "start":
                self.pids[event["pid"]] = event["token"]

    def tokens_alive(self) -> set[str]:
        self._read()
        now = time.monotonic()
        living = [pid for pid in self.pids if alive(pid)]
        for pid in living:
            self.last_alive[pid] = now
        return {self.pids[pid] for pid in living}

    def _sample(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(0.005):
            now = time.monotonic()
            if len(self.tokens_alive()) >= 2:
                self.seconds += now - last
            last = now
            self.samples += 1

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.seconds


def starts(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [e for e in (json.loads(line) for line in log.read_text().splitlines())
            if e["event"] == "start"]


@pytest.fixture
def lines(kafka_broker: str, tmp_path: Path) -> Iterator[Callable[..., Region]]:
    """``lines(deployment, mode, *extra, run_key="")``: a `run` (``--hold`` without a run
    key) whose COMMAND is :data:`WORK` in ``mode``."""
    namespace = new_namespace()
    log = tmp_path / "log"
    started: list[Region] = []

    def start(deployment: str, mode: str, *extra: str, run_key: str = "",
              broker: str | None = None) -> Region:
        command = [sys.executable, "-c", WORK, str(log), mode]
        hold = () if run_key else ("--hold", "--restart-delay", "0.5")
        region = Region(broker or kafka_broker, namespace, deployment, "daemon", run_key,
                        command, *hold, *extra)
        started.append(region)
        return region

    start.log = log  # type: ignore[attr-defined]
    start.namespace = namespace  # type: ignore[attr-defined]
    yield start
    for region in started:
        if region.proc.poll() is None:
            os.kill(region.proc.pid, signal.SIGCONT)
            region.kill()
    for event in starts(log):  # whatever a failed test left behind
        if alive(event["pid"]):
            os.kill(event["pid"], signal.SIGKILL)


def test_a_second_sigterm_and_a_sigint_cannot_cut_a_slow_stop_short(lines) -> None:
    sampler = Overlap(lines.log)
    east = lines("us-east-1", "drain")
    first = wait_for(lambda: starts(lines.log), 60, "east's command")[0]
    west = lines("eu-west-1", "drain")
    time.sleep(1.0)  # west waits without joining
    east.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: [e for e in _events(lines.log) if e["event"] == "sigterm"], 10,
             "the command to get SIGTERM")
    east.proc.send_signal(signal.SIGTERM)  # impatient: again, and Ctrl-C
    east.proc.send_signal(signal.SIGINT)
    code = _exit_status(east, within=30)
    assert not alive(first["pid"]), "east exited while its command still ran"
    assert code == 128 + signal.SIGTERM, east.finish()[2]
    second = wait_for(lambda: starts(lines.log)[1:], 60, "west to take over")[0]
    assert second["token"] != first["token"]
    assert sampler.stop() == 0.0, "two claims' processes were alive at once"
    assert sampler.samples > 100
    west.proc.terminate()
    assert west.proc.wait(timeout=30) == 128 + signal.SIGTERM


def test_one_shot_run_stops_a_slow_command_whatever_signals_follow(kafka_broker, lines) -> None:
    sampler = Overlap(lines.log)
    east = lines("us-east-1", "drain", run_key="daily/2013-02-01")
    first = wait_for(lambda: starts(lines.log), 60, "the command")[0]
    east.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: [e for e in _events(lines.log) if e["event"] == "sigterm"], 10,
             "the command to get SIGTERM")
    for _ in range(3):
        east.proc.send_signal(signal.SIGTERM)
        east.proc.send_signal(signal.SIGINT)
    code, out, err = east.finish()
    assert not alive(first["pid"])
    assert code == 128 + signal.SIGTERM and out["result"] == "terminated", err
    with singleton(kafka_broker, lines.namespace, "reader") as reader:
        latest = reader.status("daemon", "daily/2013-02-01")
    assert latest.state is RunState.FAILED and "SIGTERM" in latest.reason
    # stop first, then record: FAILED was written after the command's last sign of life
    sampler.stop()
    recorded = latest.at - (time.time() - time.monotonic())  # the same host's clocks
    assert recorded > sampler.last_alive[first["pid"]], (
        f"FAILED recorded {sampler.last_alive[first['pid']] - recorded:.3f} s before the"
        " command was gone")


def test_hold_stops_what_the_command_left_behind_before_the_next_stint(lines) -> None:
    sampler = Overlap(lines.log)
    east = lines("us-east-1", "leave")
    west = lines("eu-west-1", "leave")
    # each stint's command exits after 1 s and leaves a worker: three stints, never two alive
    wait_for(lambda: len({e["token"] for e in starts(lines.log)}) >= 3, 90, "three stints")
    overlap = sampler.stop()
    east.proc.terminate()
    west.proc.terminate()
    assert overlap == 0.0, "a stint's leftover worker lived into the next stint"
    workers = [e for e in starts(lines.log) if e["mode"] == "worker"]
    assert len(workers) >= 2


@pytest.mark.parametrize("how", ["kill-9", "sigterm", "sigstop", "kill-9 without cgroup"])
def test_a_setsid_worker_is_stopped_with_its_stint(lines, how: str, monkeypatch) -> None:
    if how.endswith("without cgroup"):  # the child subreaper and the sweep alone
        monkeypatch.setenv("NELI_SUPERVISE_MECHANISM", "subreaper")
    sampler = Overlap(lines.log)
    east = lines("us-east-1", "setsid")
    wait_for(lambda: [e for e in starts(lines.log) if e["mode"] == "worker"], 60,
             "east's command and its setsid worker")
    west = lines("eu-west-1", "setsid")
    time.sleep(1.0)
    east_pids = [e["pid"] for e in starts(lines.log)]
    if how.startswith("kill-9"):
        east.proc.kill()
    elif how == "sigterm":
        east.proc.terminate()
    else:
        os.kill(east.proc.pid, signal.SIGSTOP)  # frozen: the keeper's lease runs out
    wait_for(lambda: len({e["token"] for e in starts(lines.log)}) >= 2, 60,
             "west to take over")
    wait_for(lambda: [e for e in starts(lines.log)[2:] if e["mode"] == "worker"], 30,
             "west's worker")
    time.sleep(0.5)
    assert sampler.stop() == 0.0, "east's processes lived on while west's ran"
    assert not [pid for pid in east_pids if alive(pid)]
    os.kill(east.proc.pid, signal.SIGCONT)
    west.proc.terminate()
    assert west.proc.wait(timeout=30) == 128 + signal.SIGTERM


#: The lease's fix removed (``NELI_TEST_BREAK_LEASE=1``, to show the test below fails): the
#: runner renews its keeper's lease a heartbeat timeout past each ping, as before issue #29,
#: instead of to the member's last proof of leadership.
BROKEN_LEASE_RUNNER = """
import sys, time
from neli_orchestrate.singleton.run import Run
def lease_deadline(self):
    if self._lease is None or self._fenced is not None:
        return None
    return time.monotonic() + 10.6
Run.lease_deadline = lease_deadline
from neli_orchestrate.cli import main
sys.exit(main())
"""


@pytest.fixture
def split_world(tmp_path: Path) -> Iterator[Any]:
    """A broker of this test's own whose clients connect through one proxy per deployment
    (integration/chaos/hold.py): cutting ``east``'s proxy cuts east off Kafka, and only east."""
    from integration.chaos.hold import HoldWorld
    from neli_orchestrate.testing.local_kafka import LocalKafkaError

    try:
        world = HoldWorld(tmp_path / "world").__enter__()
    except LocalKafkaError as exc:
        pytest.fail(f"Kafka broker could not start: {exc}", pytrace=False)
    yield world
    world.__exit__()


def test_a_runner_cut_off_kafka_that_then_freezes_is_stopped_before_a_successor_leads(
        lines, split_world, monkeypatch) -> None:
    """The keeper's lease is the member's last proof of leadership, not the runner's last
    sign of life. East alone is cut off Kafka (its proxy drops everything) while west, whose
    network never fails, contends all along and leads as early as the protocol allows; east
    keeps running (and pinging its keeper) past its last heartbeat, then freezes just before
    its own fence. Its command must be gone before west's starts: overlap 0.00 s."""
    if os.environ.get("NELI_TEST_BREAK_LEASE") == "1":
        monkeypatch.setattr(test_run, "RUNNER", ["-c", BROKEN_LEASE_RUNNER])
    # the longest heartbeat timeout a 12 s session allows with a 0.3 s grace
    timing = ("--session-timeout", "12", "--heartbeat-timeout", "10.6", "--grace", "0.3")
    sampler = Overlap(lines.log)
    east = lines("us-east-1", "ignore", *timing, broker=split_world.bootstrap("east"))
    first = wait_for(lambda: starts(lines.log), 60, "east's command")[0]
    west = lines("eu-west-1", "ignore", *timing, broker=split_world.bootstrap("west"))
    time.sleep(1.0)  # west's runner up and contending
    lost = time.monotonic()
    split_world.proxies["east"].cut()
    time.sleep(10.1)  # east keeps running (and pinging its keeper) past its last heartbeat...
    os.kill(east.proc.pid, signal.SIGSTOP)  # ...then freezes just before its own fence
    wait_for(lambda: not alive(first["pid"]), 30, "east's keeper to stop the command")
    stopped = time.monotonic() - lost
    second = wait_for(lambda: starts(lines.log)[1:], 90, "west to take over")[0]
    assert second["token"] != first["token"]
    time.sleep(0.5)
    overlap = sampler.stop()
    print(f"lease test: command stopped {stopped:.2f} s and west started"
          f" {second['t'] - lost:.2f} s after east was cut off; overlap {overlap:.2f} s")
    assert overlap == 0.0, f"east's command outlived its leadership into west's: {overlap:.2f} s"
    assert stopped < 12.0, stopped  # the session: before anyone else could lead
    os.kill(east.proc.pid, signal.SIGCONT)
    split_world.proxies["east"].heal()
    west.proc.terminate()
    west.proc.wait(timeout=30)


@pytest.mark.parametrize("delay", [0.0, 0.002, 0.01, 0.03])
def test_a_sigterm_right_after_the_start_leaves_nothing_running(lines, delay: float) -> None:
    """The windows between starting COMMAND and guarding it: signal the runner as soon as its
    first child process exists (plus ``delay``)."""
    # a 6 s session: a loaded machine must not fence the runner before its first child
    east = lines("us-east-1", "setsid", "--session-timeout", "6", "--grace", "0.2",
                 run_key=f"k/{delay}")
    deadline = time.monotonic() + 60
    while not keeper.descendants(east.proc.pid):
        assert time.monotonic() < deadline and east.proc.poll() is None, east.finish()
        time.sleep(0.0005)
    time.sleep(delay)
    tree = set(keeper.descendants(east.proc.pid))
    east.proc.send_signal(signal.SIGTERM)
    east.proc.wait(timeout=30)
    left = [p for p in tree | {e["pid"] for e in starts(lines.log)} if alive(p)]
    assert left == [], f"processes of the stint outlived `run`: {left}"
    assert east.proc.returncode == 128 + signal.SIGTERM, east.finish()


def _exit_status(region: Region, within: float) -> int:
    """The runner's exit status, which must come within ``within`` s (else its log fails)."""
    try:
        return region.proc.wait(timeout=within)
    except subprocess.TimeoutExpired:
        region.proc.kill()
        _, err = region.proc.communicate(timeout=30)
        raise AssertionError(f"the runner did not exit within {within} s:\n{err[-6000:]}") from None


def _events(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def test_a_command_that_cannot_start_exits_127_and_the_ledger_says_why(kafka_broker,
                                                                       lines) -> None:
    region = Region(kafka_broker, lines.namespace, "us-east-1", "daemon", "daily/2013-02-02",
                    ["no-such-command-neli"])
    code, out, err = region.finish()
    assert code == 127, err
    assert "command not found: no-such-command-neli" in err
    with singleton(kafka_broker, lines.namespace, "reader") as reader:
        latest = reader.status("daemon", "daily/2013-02-02")
    assert latest.state is RunState.FAILED
    assert "command not found: no-such-command-neli" in latest.reason
