"""`neli-orchestrate run`: two "regions" (processes) running the same line, against a real broker.

Each region is a real ``neli-orchestrate run`` process; COMMAND is a small Python script that
appends what happened to it (start, SIGTERM, end) to a shared log with its pid, token and a
monotonic timestamp, so the tests assert on what ran, where, in which order.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_helpers import new_namespace, singleton

from neli_orchestrate.cli.run import EXIT_FENCED, EXIT_WAIT_TIMEOUT
from neli_orchestrate.ledger.record import RunState

pytestmark = pytest.mark.kafka

# session 3 s: the guard's ping deadline (heartbeat timeout, 1 s) and grace (1 s) leave room for
# a loaded CI machine; the broker allows sessions down to 100 ms.
TIMING = ["--profile", "fast", "--session-timeout", "3"]

COMMAND = textwrap.dedent("""
    import json, os, signal, sys, time
    log, seconds = sys.argv[1], float(sys.argv[2])
    def note(event):
        with open(log, "a") as f:
            f.write(json.dumps({"event": event, "pid": os.getpid(), "t": time.monotonic(),
                                "token": os.environ.get("NELI_TOKEN"),
                                "run_key": os.environ.get("NELI_RUN_KEY"),
                                "role": os.environ.get("NELI_ROLE"),
                                "deployment": os.environ.get("NELI_DEPLOYMENT"),
                                "namespace": os.environ.get("NELI_NAMESPACE")}) + "\\n")
    def on_term(signum, frame):
        note("sigterm")
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    note("start")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.02)
    note("end")
    sys.exit(int(sys.argv[3]) if len(sys.argv) > 3 else 0)
""")


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def events(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


#: How a region starts the CLI (a test may swap in a deliberately broken runner).
RUNNER = ["-m", "neli_orchestrate.cli"]


class Region:
    """One ``neli-orchestrate run`` process (a region's cron line)."""

    def __init__(self, kafka_broker: str, namespace: str, deployment: str, role: str,
                 run_key: str, command: list[str], *extra: str) -> None:
        env = {**os.environ, "NELI_DEPLOYMENT": deployment, "NELI_NAMESPACE": namespace,
               "NELI_BOOTSTRAP_SERVERS": kafka_broker}
        args = [sys.executable, *RUNNER, "-v", "run", "--role", role,
                *(["--run-key", run_key] if run_key else []), *TIMING, "--json", *extra,
                "--", *command]
        self.deployment = deployment
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def finish(self, timeout: float = 90) -> tuple[int, dict | None, str]:
        out, err = self.proc.communicate(timeout=timeout)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        return self.proc.returncode, (json.loads(lines[-1]) if lines else None), err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=30)


@pytest.fixture
def regions(kafka_broker: str, tmp_path: Path) -> Iterator[Callable[..., Region]]:
    started: list[Region] = []
    namespace = new_namespace()

    def start(deployment: str, run_key: str, seconds: float, *extra: str,
              role: str = "export", status: int = 0) -> Region:
        command = [sys.executable, "-c", COMMAND, str(tmp_path / "log"), str(seconds),
                   str(status)]
        region = Region(kafka_broker, namespace, deployment, role, run_key, command, *extra)
        started.append(region)
        return region

    start.namespace = namespace  # type: ignore[attr-defined]
    start.log = tmp_path / "log"  # type: ignore[attr-defined]
    yield start
    for region in started:
        with_stopped = region.proc.poll() is None
        if with_stopped:
            os.kill(region.proc.pid, signal.SIGCONT)
        region.kill()


def ledger_latest(kafka_broker: str, namespace: str, role: str, run_key: str):  # type: ignore[no-untyped-def]
    with singleton(kafka_broker, namespace, "reader") as reader:
        return reader.status(role, run_key)


def test_two_regions_running_the_same_line_run_the_command_once(kafka_broker, regions) -> None:
    east = regions("us-east-1", "daily/2013-01-05", 2.0)
    west = regions("eu-west-1", "daily/2013-01-05", 2.0)
    (east_code, east_out, east_err), (west_code, west_out, west_err) = east.finish(), west.finish()
    assert east_code == 0 and west_code == 0, (east_err, west_err)
    starts = [e for e in events(regions.log) if e["event"] == "start"]
    assert len(starts) == 1, starts
    ran = starts[0]
    results = {east_out["result"], west_out["result"]}
    assert results == {"ran", "done"}, (east_out, west_out)
    runner, other = (east_out, west_out) if east_out["result"] == "ran" else (west_out, east_out)
    assert ran["deployment"] == runner["deployment"] == other["ran_in"]
    # the token and run key reached the command; the other region names the same token
    assert ran["token"] == str(runner["token"]) == str(other["token"])
    assert (ran["run_key"], ran["role"], ran["namespace"]) == (
        "daily/2013-01-05", "export", regions.namespace)
    latest = ledger_latest(kafka_broker, regions.namespace, "export", "daily/2013-01-05")
    assert latest.state is RunState.COMPLETED and latest.token == runner["token"]
    assert latest.deployment == runner["deployment"]
    # a line run later (the next cron tick of a late region) prints where it was done
    late = regions("ap-south-1", "daily/2013-01-05", 2.0, "--json")
    code, out, _ = late.finish()
    assert code == 0 and out["result"] == "done" and out["ran_in"] == runner["deployment"]


def test_done_elsewhere_prints_one_line_and_exit_status_is_the_commands(kafka_broker,
                                                                        regions) -> None:
    failing = regions("us-east-1", "daily/2013-01-06", 0.0, role="fails", status=3)
    code, out, err = failing.finish()
    assert code == 3, err
    latest = ledger_latest(kafka_broker, regions.namespace, "fails", "daily/2013-01-06")
    assert latest.state is RunState.FAILED and "status 3" in latest.reason

    ok = regions("us-east-1", "daily/2013-01-07", 0.0)
    assert ok.finish()[0] == 0
    env = {**os.environ, "NELI_DEPLOYMENT": "eu-west-1", "NELI_NAMESPACE": regions.namespace,
           "NELI_BOOTSTRAP_SERVERS": kafka_broker}
    text = subprocess.run([sys.executable, "-m", "neli_orchestrate.cli", "run", "--role",
                           "export", "--run-key", "daily/2013-01-07", *TIMING, "--", "false"],
                          env=env, capture_output=True, text=True, timeout=90)
    assert text.returncode == 0, text.stderr
    assert text.stdout.strip().splitlines() == [
        f"done in us-east-1 (token {ok_token(kafka_broker, regions.namespace)})"]


def ok_token(kafka_broker: str, namespace: str) -> int:
    return ledger_latest(kafka_broker, namespace, "export", "daily/2013-01-07").token


def test_waiting_past_wait_timeout_exits_with_its_own_status(kafka_broker, regions) -> None:
    east = regions("us-east-1", "daily/2013-01-08", 30.0)
    wait_for(lambda: [e for e in events(regions.log) if e["event"] == "start"], 60,
             "east's command to start")
    west = regions("eu-west-1", "daily/2013-01-08", 30.0, "--wait-timeout", "2")
    code, out, err = west.finish()
    assert code == EXIT_WAIT_TIMEOUT, err
    assert out["result"] == "wait_timeout"
    assert len([e for e in events(regions.log) if e["event"] == "start"]) == 1
    east.kill()


def test_kill_9_of_the_running_region_is_taken_over(kafka_broker, regions) -> None:
    east = regions("us-east-1", "daily/2013-01-09", 60.0)
    first = wait_for(lambda: [e for e in events(regions.log) if e["event"] == "start"], 60,
                     "east's command to start")[0]
    west = regions("eu-west-1", "daily/2013-01-09", 2.0)
    time.sleep(0.5)  # west is waiting (the role's group is busy); nothing of it has run
    assert len([e for e in events(regions.log) if e["event"] == "start"]) == 1
    east.proc.kill()  # kill -9 mid-command
    east.proc.wait(timeout=10)
    code, out, err = west.finish()
    assert code == 0 and out["result"] == "ran", err
    log = events(regions.log)
    second = [e for e in log if e["event"] == "start"][1]
    assert second["deployment"] == "eu-west-1"
    assert int(second["token"]) > int(first["token"])
    # the dead runner's command was stopped (its guard saw the runner die) before west started
    term = [e for e in log if e["event"] == "sigterm" and e["pid"] == first["pid"]]
    assert term and term[0]["t"] < second["t"], log
    assert not alive(first["pid"])
    latest = ledger_latest(kafka_broker, regions.namespace, "export", "daily/2013-01-09")
    assert latest.state is RunState.COMPLETED and latest.deployment == "eu-west-1"
    assert latest.token == out["token"] == int(second["token"])


def test_sigstop_past_the_session_fences_the_runner_and_stops_its_command(kafka_broker,
                                                                          regions) -> None:
    east = regions("us-east-1", "daily/2013-01-10", 60.0)
    first = wait_for(lambda: [e for e in events(regions.log) if e["event"] == "start"], 60,
                     "east's command to start")[0]
    west = regions("eu-west-1", "daily/2013-01-10", 2.0)
    time.sleep(0.5)
    os.kill(east.proc.pid, signal.SIGSTOP)  # frozen past the 3 s session
    second = wait_for(lambda: [e for e in events(regions.log) if e["event"] == "start"][1:], 60,
                      "west to take over")[0]
    log = events(regions.log)
    # the frozen runner's command was stopped by its guard before west's command started
    term = [e for e in log if e["event"] == "sigterm" and e["pid"] == first["pid"]]
    assert term and term[0]["t"] < second["t"], log
    assert not alive(first["pid"])
    assert int(second["token"]) > int(first["token"])
    os.kill(east.proc.pid, signal.SIGCONT)
    east_code, east_out, east_err = east.finish()
    assert east_code == EXIT_FENCED, east_err
    assert east_out["result"] == "fenced"
    west_code, west_out, west_err = west.finish()
    assert west_code == 0 and west_out["result"] == "ran", west_err
    latest = ledger_latest(kafka_broker, regions.namespace, "export", "daily/2013-01-10")
    assert latest.state is RunState.COMPLETED and latest.deployment == "eu-west-1"
    assert latest.token == int(second["token"])
    # nothing of east's was recorded as completed: its command never ended
    assert [e for e in log if e["event"] == "end" and e["pid"] == first["pid"]] == []
