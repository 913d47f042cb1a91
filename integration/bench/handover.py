"""Benchmark NELI leadership hand-over on a real broker: graceful close, kill -9, pause.

Usage::

    python integration/bench/handover.py --trials 20                   # starts a LocalKafka
    python integration/bench/handover.py --bootstrap 127.0.0.1:9092 --protocols classic

Scenarios, each with two members in separate processes (leader L, settled follower F):

- ``close``: L calls ``close()``; latency = F's ``LeaderAcquired`` - the moment L began
  closing.
- ``kill``: L gets SIGKILL; latency = F's ``LeaderAcquired`` - the kill. ``over_session`` is
  that minus the session timeout: the failure detector's own delay is the session timeout,
  what remains is NELI's overhead (plus up to one group heartbeat interval, since the last
  heartbeat of L is not observable).
- ``pause``: L gets SIGSTOP until F leads, then SIGCONT; checks that L's lease ended
  (``LeaderFenced`` timestamp) before F's ``LeaderAcquired``: exclusive mode must hold in
  every trial.

Writes ``integration/bench/results/handover.json`` and ``handover.md`` (p50/p99 per group
protocol and scenario) and prints the markdown table. Timestamps are ``time.monotonic()``,
one clock for all processes of a Linux host.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
SETTLE = 1.5   # librdkafka rejoins at most once a second: let a new follower settle first
DEADLINE = 60.0


# -- the member process ---------------------------------------------------------------------------

def member_main(settings: dict[str, Any]) -> None:
    """Run one member: pulse, report events and close on 'close' from stdin."""
    from neli_orchestrate.core.config import NeliConfig
    from neli_orchestrate.core.events import LeaderEvent
    from neli_orchestrate.core.neli import Neli

    out = open(settings.pop("out"), "a", buffering=1)  # noqa: SIM115
    lock = threading.Lock()

    def write(kind: str, **fields: Any) -> None:
        fields.setdefault("ts", time.monotonic())
        with lock:
            out.write(json.dumps({"kind": kind, **fields}) + "\n")

    def barrier(event: LeaderEvent) -> None:
        write("event", type=type(event).__name__, ts=event.timestamp, reason=event.reason)

    neli = Neli(NeliConfig(**settings), barrier)
    write("ready")
    stop = threading.Event()

    def commands() -> None:
        for line in sys.stdin:
            if line.strip() == "close":
                break
        stop.set()

    threading.Thread(target=commands, daemon=True).start()
    while not stop.is_set():
        neli.pulse(0.02)
    write("close_called")
    neli.close()
    write("closed")


@dataclass
class Member:
    proc: subprocess.Popen[bytes]
    out: Path
    started: float = field(default_factory=time.monotonic)

    def lines(self) -> list[dict[str, Any]]:
        result = []
        if self.out.exists():
            for raw in self.out.read_text().splitlines():
                try:
                    result.append(json.loads(raw))
                except ValueError:
                    pass
        return result

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [x for x in self.lines() if x["kind"] == "event" and x["type"] == kind]

    def first(self, kind: str) -> dict[str, Any] | None:
        return next((x for x in self.lines() if x["kind"] == kind), None)

    def leading(self) -> bool:
        state = False
        for x in self.lines():
            if x["kind"] == "event":
                state = x["type"] == "LeaderAcquired"
        return state

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{command}\n".encode())
        self.proc.stdin.flush()

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(30)


def wait_for(what: str, condition: Any, timeout: float = DEADLINE) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.005)
    raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")


# -- the benchmark --------------------------------------------------------------------------------

class Bench:
    def __init__(self, bootstrap: str, protocol: str, settings: dict[str, Any], tmp: Path):
        self.bootstrap = bootstrap
        self.protocol = protocol
        self.settings = settings
        self.tmp = tmp
        self.group = f"bench.{protocol}.{uuid.uuid4().hex[:8]}"
        self.count = 0
        self.members: list[Member] = []

    def spawn(self) -> Member:
        self.count += 1
        out = self.tmp / f"{self.group}.{self.count}.jsonl"
        settings = {"bootstrap_servers": self.bootstrap, "group_id": self.group,
                    "group_protocol": self.protocol, "name": f"m{self.count}",
                    "out": str(out), **self.settings}
        with open(out.with_suffix(".stderr"), "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, __file__, "--member", json.dumps(settings)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err)
        member = Member(proc, out)
        self.members.append(member)
        return member

    def pair(self, leader: Member | None) -> tuple[Member, Member]:
        """A leader and a follower that has settled in the group."""
        if leader is None:
            leader = self.spawn()
            wait_for("a first leader", leader.leading)
        follower = self.spawn()
        ready = wait_for("the follower to join", lambda: follower.first("ready"))
        wait_for("the follower to settle", lambda: time.monotonic() > ready["ts"] + SETTLE)
        if not leader.leading() or follower.leading():
            raise RuntimeError("leadership moved while a follower joined")
        return leader, follower

    def close_trial(self, leader: Member | None) -> tuple[dict[str, Any], Member]:
        leader, follower = self.pair(leader)
        leader.send("close")
        wait_for("the successor", follower.leading)
        acquired = follower.events("LeaderAcquired")[-1]["ts"]
        began = wait_for("the close to be logged", lambda: leader.first("close_called"))["ts"]
        ended = leader.events("LeaderRevoked")[-1]["ts"]
        leader.proc.wait(30)
        return {"latency": acquired - began, "exclusive": ended <= acquired}, follower

    def kill_trial(self, leader: Member | None, session: float
                   ) -> tuple[dict[str, Any], Member]:
        leader, follower = self.pair(leader)
        killed = time.monotonic()
        leader.proc.send_signal(signal.SIGKILL)
        leader.proc.wait(30)
        wait_for("the successor", follower.leading)
        acquired = follower.events("LeaderAcquired")[-1]["ts"]
        latency = acquired - killed
        return {"latency": latency, "over_session": latency - session}, follower

    def pause_trial(self, leader: Member | None) -> tuple[dict[str, Any], Member]:
        leader, follower = self.pair(leader)
        stopped = time.monotonic()
        leader.proc.send_signal(signal.SIGSTOP)
        wait_for("the successor", follower.leading)
        leader.proc.send_signal(signal.SIGCONT)
        fenced = wait_for("the paused leader to report its fence",
                          lambda: [e for e in leader.events("LeaderFenced")])[-1]["ts"]
        acquired = follower.events("LeaderAcquired")[-1]["ts"]
        resumed_as_leader = any(e["ts"] > stopped for e in leader.events("LeaderAcquired"))
        leader.send("close")
        leader.proc.wait(30)
        return {"latency": acquired - stopped, "fence_margin": acquired - fenced,
                "exclusive": fenced <= acquired and not resumed_as_leader}, follower

    def close_all(self) -> None:
        for m in self.members:
            m.terminate()


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (with few trials, p99 is the maximum)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summarise(trials: list[dict[str, Any]]) -> dict[str, Any]:
    latencies = [t["latency"] for t in trials]
    summary: dict[str, Any] = {
        "n": len(trials),
        "p50_ms": round(percentile(latencies, 50) * 1000, 1),
        "p99_ms": round(percentile(latencies, 99) * 1000, 1),
        "min_ms": round(min(latencies) * 1000, 1),
        "max_ms": round(max(latencies) * 1000, 1),
        "samples_ms": [round(x * 1000, 1) for x in latencies],
    }
    if "over_session" in trials[0]:
        over = [t["over_session"] for t in trials]
        summary["over_session_p50_ms"] = round(percentile(over, 50) * 1000, 1)
        summary["over_session_p99_ms"] = round(percentile(over, 99) * 1000, 1)
    if "exclusive" in trials[0]:
        summary["exclusive_violations"] = sum(1 for t in trials if not t["exclusive"])
    if "fence_margin" in trials[0]:
        margins = [t["fence_margin"] for t in trials]
        summary["fence_margin_min_ms"] = round(min(margins) * 1000, 1)
    return summary


def run(args: argparse.Namespace) -> dict[str, Any]:
    from neli_orchestrate.core.config import NeliConfig

    settings: dict[str, Any] = {"profile": args.profile}
    if args.session_timeout is not None:
        settings["session_timeout"] = args.session_timeout
    resolved = NeliConfig(**settings).resolved
    load_before = os.getloadavg()[0]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="neli-bench-") as tmp:
        for protocol in args.protocols:
            bench = Bench(args.bootstrap, protocol, settings, Path(tmp))
            results[protocol] = {}
            try:
                leader: Member | None = None
                for scenario in args.scenarios:
                    trials = []
                    for i in range(args.trials):
                        if scenario == "close":
                            trial, leader = bench.close_trial(leader)
                        elif scenario == "kill":
                            trial, leader = bench.kill_trial(leader, resolved.session_timeout)
                        else:
                            trial, leader = bench.pause_trial(leader)
                        trials.append(trial)
                        print(f"{protocol:8} {scenario:5} trial {i + 1:3}: "
                              f"{trial['latency'] * 1000:8.1f} ms", flush=True)
                    results[protocol][scenario] = summarise(trials)
            finally:
                bench.close_all()
    return {
        "benchmark": "handover",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {"platform": platform.platform(), "python": platform.python_version(),
                 "cpus": os.cpu_count(),
                 # other work on the host inflates latencies: keep the context with them
                 "loadavg_1min_before": round(load_before, 2),
                 "loadavg_1min_after": round(os.getloadavg()[0], 2)},
        "profile": args.profile,
        "settings": {
            "session_timeout_s": resolved.session_timeout,
            "group_heartbeat_interval_s": resolved.group_heartbeat_interval,
            "heartbeat_timeout_s": resolved.heartbeat_timeout,
            "heartbeat_interval_s": resolved.heartbeat_interval,
            "min_poll_interval_s": resolved.min_poll_interval,
            "fetch_wait_max_s": resolved.fetch_wait_max,
        },
        "trials_per_scenario": args.trials,
        "results": results,
    }


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        f"# NELI hand-over benchmark ({report['when']})",
        "",
        f"Profile `{report['profile']}`: session {s['session_timeout_s']:g} s, group heartbeat "
        f"{s['group_heartbeat_interval_s'] * 1000:g} ms, heartbeat timeout "
        f"{s['heartbeat_timeout_s'] * 1000:.0f} ms, heartbeat every "
        f"{s['heartbeat_interval_s'] * 1000:g} ms; {report['trials_per_scenario']} trials per "
        f"scenario; {report['host']['cpus']} CPUs, {report['host']['platform']}; load "
        f"average {report['host']['loadavg_1min_before']} before, "
        f"{report['host']['loadavg_1min_after']} after.",
        "",
        "| protocol | scenario | n | p50 ms | p99 ms | min ms | max ms | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for protocol, scenarios in report["results"].items():
        for scenario, r in scenarios.items():
            notes = []
            if "over_session_p50_ms" in r:
                notes.append(f"after session timeout: p50 {r['over_session_p50_ms']} ms, "
                             f"p99 {r['over_session_p99_ms']} ms")
            if "exclusive_violations" in r:
                notes.append(f"exclusivity violations: {r['exclusive_violations']}")
            if "fence_margin_min_ms" in r:
                notes.append(f"old leader fenced >= {r['fence_margin_min_ms']} ms before "
                             f"successor led")
            lines.append(f"| {protocol} | {scenario} | {r['n']} | {r['p50_ms']} | "
                         f"{r['p99_ms']} | {r['min_ms']} | {r['max_ms']} | "
                         f"{'; '.join(notes)} |")
    lines += ["", "close: successor leads - leader began close(). kill: successor leads - "
              "SIGKILL. pause: successor leads - SIGSTOP (the paused leader is resumed after). "
              "p99 is nearest-rank: with few trials it is the maximum."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--member", help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help="bootstrap servers; default: start a LocalKafka")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--profile", default="fast")
    parser.add_argument("--session-timeout", type=float, default=None)
    parser.add_argument("--protocols", default="classic,consumer",
                        type=lambda s: [p for p in s.split(",") if p])
    parser.add_argument("--scenarios", default="close,kill,pause",
                        type=lambda s: [p for p in s.split(",") if p])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.member:
        member_main(json.loads(args.member))
        return 0
    kafka = None
    if not args.bootstrap:
        from neli_orchestrate.testing import LocalKafka

        kafka = LocalKafka().start()
        args.bootstrap = kafka.bootstrap_servers
    try:
        report = run(args)
    finally:
        if kafka is not None:
            kafka.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "handover.json").write_text(json.dumps(report, indent=2) + "\n")
    table = markdown(report)
    (args.out / "handover.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
