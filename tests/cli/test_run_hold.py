"""`neli-orchestrate run --hold`: a long-running command alive only where the role's leader is.

Two holders (real processes) run the same line against the real broker; a sampler thread reads
/proc every 20 ms and counts the commands alive. The commands log their start and SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_helpers import new_namespace
from test_run import COMMAND, Region, alive, events, wait_for

pytestmark = pytest.mark.kafka

SESSION = 3.0  # TIMING's session timeout


class Sampler:
    """Counts the logged commands alive every 20 ms; remembers the most seen at once."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.most = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def alive_now(self) -> list[int]:
        pids = {e["pid"] for e in events(self.log) if e["event"] == "start"}
        return [pid for pid in pids if alive(pid)]

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.most = max(self.most, len(self.alive_now()))
            self.samples += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def holders(kafka_broker: str, tmp_path: Path) -> Iterator[Callable[[str], Region]]:
    namespace = new_namespace()
    log = tmp_path / "log"
    started: list[Region] = []

    def start(deployment: str) -> Region:
        command = [sys.executable, "-c", COMMAND, str(log), "100000"]
        region = Region(kafka_broker, namespace, deployment, "daemon", "", command, "--hold",
                        "--restart-delay", "0.5")
        started.append(region)
        return region

    start.log = log  # type: ignore[attr-defined]
    yield start
    for region in started:
        if region.proc.poll() is None:
            os.kill(region.proc.pid, signal.SIGCONT)
            region.proc.terminate()
            try:
                region.proc.communicate(timeout=30)
            except Exception:  # noqa: BLE001 - then kill it
                region.kill()
    # every command is gone once its holder is (stopped or its guard fired)
    wait_for(lambda: not [e for e in starts(log) if alive(e["pid"])], 30,
             "every held command to stop")


def starts(log: Path) -> list[dict]:
    return [e for e in events(log) if e["event"] == "start"]


def test_one_command_alive_and_kill_9_of_the_leader_starts_the_other(holders) -> None:
    sampler = Sampler(holders.log)
    east = holders("us-east-1")
    west = holders("eu-west-1")
    first = wait_for(lambda: starts(holders.log), 60, "a holder to start the command")[0]
    time.sleep(2 * SESSION)  # both hold the line; only the leader's command runs
    assert len(starts(holders.log)) == 1 and alive(first["pid"])
    leader, other = (east, west) if first["deployment"] == "us-east-1" else (west, east)
    killed_at = time.monotonic()
    leader.proc.kill()  # kill -9 of the leading holder
    second = wait_for(lambda: starts(holders.log)[1:], 60, "the other holder's command")[0]
    took = second["t"] - killed_at
    assert second["deployment"] == other.deployment
    assert int(second["token"]) > int(first["token"])
    # within the session timeout plus the follower's poll, join, claim and command start-up
    assert took < SESSION + 5.0, took
    assert not alive(first["pid"])
    term = [e for e in events(holders.log) if e["event"] == "sigterm"]
    assert term and term[0]["pid"] == first["pid"] and term[0]["t"] < second["t"]
    time.sleep(1.0)
    sampler.stop()
    assert sampler.samples > 100
    assert sampler.most == 1, "two commands were alive at once"
    assert other.proc.poll() is None  # still holding


def test_a_frozen_leader_loses_the_command_and_leads_again_only_after_the_other(holders) -> None:
    sampler = Sampler(holders.log)
    east = holders("us-east-1")
    first = wait_for(lambda: starts(holders.log), 60, "east's command")[0]
    west = holders("eu-west-1")
    time.sleep(1.0)
    os.kill(east.proc.pid, signal.SIGSTOP)  # past the session: west takes over
    second = wait_for(lambda: starts(holders.log)[1:], 60, "west's command")[0]
    assert second["deployment"] == "eu-west-1" and not alive(first["pid"])
    os.kill(east.proc.pid, signal.SIGCONT)  # east finds itself fenced and contends again
    time.sleep(2 * SESSION)
    assert len(starts(holders.log)) == 2 and alive(second["pid"])
    # west stops gracefully (SIGTERM): its command goes first, then east leads and restarts
    west.proc.terminate()
    code = west.proc.wait(timeout=60)
    assert code == 128 + signal.SIGTERM  # as one-shot run: 128 + the signal
    assert not alive(second["pid"])
    third = wait_for(lambda: starts(holders.log)[2:], 60, "east to lead again")[0]
    assert third["deployment"] == "us-east-1"
    assert int(third["token"]) > int(second["token"])
    sampler.stop()
    assert sampler.most == 1, "two commands were alive at once"
