"""Where a NELI member's start goes: construction of ``Neli`` to contending, phase by phase.

Usage::

    python integration/bench/member_start.py --trials 20               # starts a LocalKafka
    python integration/bench/member_start.py --bootstrap 127.0.0.1:9092 --trials 20
    # side by side with another version of the library, interleaved in the same run:
    git archive f1c9a3f neli_orchestrate | (mkdir -p /tmp/start-base && tar -x -C /tmp/start-base)
    python integration/bench/member_start.py --trials 20 --code base-f1c9a3f=/tmp/start-base

"Member start" is what ``integration/bench/peers.py`` reports: inside the member process,
from constructing the client (``NeliConfig`` and ``Neli``) until it contends (``Neli``
returned: checks done, clients created, subscribed); imports are excluded. Every trial is a
new process, as in ``peers.py`` (a member is created per claim, and per-process caches start
empty). Each variant (classic / KIP-848, ``default`` / ``fast`` profile, ``session_timeout=3``
as in ``peers.py``) has its own group; a first, uncounted member per variant creates the
leader topic and writes the KIP-848 group settings, so the trials measure the steady state a
member meets on a running deployment (its cold start is reported separately). Trials are
interleaved: each round starts one member of every variant in a shuffled order.

Inside the member every start-up step is timed where the library calls Kafka (admin calls,
client constructors, subscribe): each phase is reported with its start (ms after the
construction began) and its duration, p50 over the trials. Phases that overlap ran
concurrently. The member is closed after the measurement; anything it writes to stderr
(raw librdkafka output, a leaked handle) is counted.

Writes ``integration/bench/results/member_start.json`` (every sample) and ``.md`` (tables).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib import broker, percentile

RESULTS = Path(__file__).resolve().parent / "results"
TIMEOUT = 3.0          # session timeout of every variant, as in peers.py
VARIANTS = ["classic-default", "consumer-default", "classic-fast", "consumer-fast"]
LABELS = {"classic-default": "NELI classic default", "consumer-default": "NELI KIP-848 default",
          "classic-fast": "NELI classic fast", "consumer-fast": "NELI KIP-848 fast"}

# (where, attribute, phase label): the library's calls into Kafka during start. Attributes
# missing in the code under test (another version of the library) are skipped.
PROBES = [
    ("neli_orchestrate.core.confluent:ConfluentKafka", "admin", "admin client"),
    ("neli_orchestrate.core.confluent:_ConfluentAdmin", "partition_count", "topic metadata"),
    ("neli_orchestrate.core.confluent:_ConfluentAdmin", "create_topic", "topic create"),
    ("neli_orchestrate.core.confluent:_ConfluentAdmin", "topic_config", "topic config"),
    ("neli_orchestrate.core.confluent:_ConfluentAdmin", "broker_config", "broker config"),
    ("neli_orchestrate.core.confluent:_ConfluentAdmin", "group_config", "group config read"),
    ("neli_orchestrate.core.confluent:_ConfluentAdmin", "alter_group_config", "group config write"),
    ("neli_orchestrate.core.confluent:_ConfluentAdmin", "close", "admin close"),
    ("neli_orchestrate.core.confluent:ConfluentKafka", "producer", "producer"),
    ("neli_orchestrate.core.confluent:ConfluentKafka", "consumer", "consumer"),
    ("neli_orchestrate.core.confluent:ConfluentKafka", "watcher", "watcher"),
    ("neli_orchestrate.core.confluent:_ConfluentConsumer", "subscribe", "subscribe"),
]


# -- the member process ------------------------------------------------------------------------

def child(settings: dict[str, Any]) -> None:
    import importlib
    import logging
    import threading

    logging.basicConfig(level=logging.WARNING, format="%(created).4f %(threadName)s %(message)s")
    # Imports are not part of "start" (as in peers.py): the library imports its Kafka client
    # lazily, so import it here, and the library modules too.
    import confluent_kafka  # noqa: F401
    import confluent_kafka.admin  # noqa: F401

    from neli_orchestrate.core.config import NeliConfig
    from neli_orchestrate.core.neli import Neli

    spans: list[list[Any]] = []
    lock = threading.Lock()
    origin = [0.0]

    def probe(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            begin = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                end = time.perf_counter()
                with lock:   # [phase, start ms after construction began, duration ms]
                    spans.append([label, (begin - origin[0]) * 1000,
                                  (end - begin) * 1000])
        return timed

    for where, attr, label in PROBES:
        module_name, cls_name = where.split(":")
        cls = getattr(importlib.import_module(module_name), cls_name, None)
        if cls is not None and hasattr(cls, attr):
            setattr(cls, attr, probe(getattr(cls, attr), label))

    origin[0] = time.perf_counter()
    config = NeliConfig(**settings)
    neli = Neli(config)
    total = (time.perf_counter() - origin[0]) * 1000
    protocol = neli.resolved.group_protocol
    with lock:
        measured = [s for s in spans if s[1] <= total]
    neli.close()
    print(json.dumps({"total_ms": total, "spans": measured, "protocol": protocol}),
          flush=True)


# -- the driver --------------------------------------------------------------------------------

def start_member(settings: dict[str, Any], code: Path | None) -> dict[str, Any]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if code is not None:
        env["PYTHONPATH"] = str(code)
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(settings)],
                          capture_output=True, text=True, timeout=120, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"member failed ({proc.returncode}): {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    result["stderr_lines"] = len(proc.stderr.splitlines())
    if proc.stderr.strip():
        result["stderr_tail"] = proc.stderr[-500:]
    return result


def summarise(samples: list[dict[str, Any]]) -> dict[str, Any]:
    totals = [s["total_ms"] for s in samples]
    phases: dict[str, dict[str, list[float]]] = {}
    for s in samples:
        seen: dict[str, dict[str, float]] = {}
        for phase, start_ms, ms in s["spans"]:
            # a phase that runs more than once in one start (e.g. a metadata retry): its first
            # start and its summed duration
            entry = seen.setdefault(phase, {"start_ms": start_ms, "ms": 0.0})
            entry["ms"] += ms
        for phase, entry in seen.items():
            stat = phases.setdefault(phase, {"start_ms": [], "ms": []})
            stat["start_ms"].append(entry["start_ms"])
            stat["ms"].append(entry["ms"])
    return {
        "n": len(samples),
        "p50_ms": round(statistics.median(totals), 1),
        "p90_ms": round(percentile(totals, 0.9), 1),
        "min_ms": round(min(totals), 1),
        "phases": {phase: {"n": len(v["ms"]),
                           "start_p50_ms": round(statistics.median(v["start_ms"]), 1),
                           "p50_ms": round(statistics.median(v["ms"]), 1)}
                   for phase, v in sorted(phases.items(),
                                          key=lambda kv: statistics.median(kv[1]["start_ms"]))},
        "stderr_lines": sum(s["stderr_lines"] for s in samples),
    }


def run(bootstrap: str, trials: int, variants: list[str],
        codes: dict[str, Path | None]) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    cells = [(code, v) for code in codes for v in variants]
    settings = {}
    for code, v in cells:
        protocol, profile = v.split("-")
        settings[code, v] = {"bootstrap_servers": bootstrap, "group_protocol": protocol,
                             "group_id": f"start.{tag}.{len(settings)}.{v}",
                             "profile": profile, "session_timeout": TIMEOUT,
                             "name": f"start-{v}"}
    cold = {cell: start_member(settings[cell], codes[cell[0]]) for cell in cells}
    samples: dict[tuple[str, str], list[dict[str, Any]]] = {cell: [] for cell in cells}
    loads = [os.getloadavg()[0]]
    order = list(cells)
    for i in range(trials):
        random.shuffle(order)
        for cell in order:
            samples[cell].append(start_member(settings[cell], codes[cell[0]]))
        loads.append(os.getloadavg()[0])
        print(f"round {i + 1}/{trials}: " + ", ".join(
            f"{'/'.join(cell)} {samples[cell][-1]['total_ms']:.1f} ms" for cell in cells),
            flush=True)
    return {"code": {code: str(path or "this checkout") for code, path in codes.items()},
            "runs": {code: {v: {"summary": summarise(samples[code, v]),
                                "cold_start_ms": round(cold[code, v]["total_ms"], 1),
                                "samples": samples[code, v]} for v in variants}
                     for code in codes},
            "load_avg_1min": {"min": min(loads), "mean": statistics.mean(loads),
                              "max": max(loads), "samples": loads}}


def table(data: dict[str, Any]) -> str:
    codes = list(data["runs"])
    variants = list(data["runs"][codes[0]])
    head = "| | " + " | ".join(LABELS.get(v, v) for v in variants) + " |"
    rule = "|---|" + "---|" * len(variants)
    out = []
    if len(codes) > 1:
        rows = [head.replace("| |", "| member start p50 (p90) |", 1), rule]
        for code in codes:
            rows.append(f"| {code} | " + " | ".join(
                "{p50_ms} ms ({p90_ms})".format(**data["runs"][code][v]["summary"])
                for v in variants) + " |")
        out.append("\n".join(rows) + "\n")
    for code in codes:
        runs = data["runs"][code]
        summaries = {v: runs[v]["summary"] for v in variants}
        rows = [head if len(codes) == 1 else head.replace("| |", f"| {code} |", 1), rule]
        rows.append("| **member start p50** | " + " | ".join(
            f"**{summaries[v]['p50_ms']} ms**" for v in variants) + " |")
        rows.append("| member start p90 / min | " + " | ".join(
            f"{summaries[v]['p90_ms']} / {summaries[v]['min_ms']} ms" for v in variants) + " |")
        rows.append("| first member (creates topic, writes group settings) | " + " | ".join(
            f"{runs[v]['cold_start_ms']} ms" for v in variants) + " |")
        phases: list[str] = []
        for v in variants:
            for phase in summaries[v]["phases"]:
                if phase not in phases:
                    phases.append(phase)
        for phase in phases:
            cells = []
            for v in variants:
                p, n = summaries[v]["phases"].get(phase), summaries[v]["n"]
                cells.append("–" if p is None else
                             f"{p['p50_ms']} ms at +{p['start_p50_ms']}"
                             + ("" if p["n"] == n else f" (in {p['n']}/{n})"))
            rows.append(f"| {phase} | " + " | ".join(cells) + " |")
        rows.append("| stderr lines (all trials) | " + " | ".join(
            str(summaries[v]["stderr_lines"]) for v in variants) + " |")
        out.append("\n".join(rows) + "\n")
    return "\n".join(out)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="existing cluster (default: start a LocalKafka)")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="directory for member_start.json and .md")
    parser.add_argument("--code", action="append", default=[], metavar="NAME=DIR",
                        help="also time the library found in DIR (e.g. `git archive <commit> "
                             "neli_orchestrate | tar -x -C DIR`), interleaved; repeatable")
    args = parser.parse_args()
    codes: dict[str, Path | None] = {"this checkout": None}
    for item in args.code:
        name, _, path = item.partition("=")
        codes[name] = Path(path).resolve()
    with broker(args.bootstrap) as (bootstrap, _):
        data = run(bootstrap, args.trials, args.variants, codes)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip()
    command = " ".join(["python integration/bench/member_start.py", f"--trials {args.trials}"]
                       + ([] if args.variants == VARIANTS else ["--variants", *args.variants])
                       + [f"--code {item}" for item in args.code])
    data["meta"] = {"machine": platform.platform(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "commit": commit,
                    "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "command": command, "load_avg": os.getloadavg(),
                    "session_timeout": TIMEOUT}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "member_start.json").write_text(json.dumps(data, indent=1))
    load = data["load_avg_1min"]
    text = table(data)
    (args.out / "member_start.md").write_text(
        f"# Member start, phase by phase\n\n`{command}` at commit {commit}"
        f" ({data['meta']['when']}); {os.cpu_count()} cores, load average (1 min) min"
        f" {load['min']:.1f} / mean {load['mean']:.1f} / max {load['max']:.1f}.\n\n"
        "Each phase: p50 duration, and p50 start in ms after construction began (phases"
        " that overlap ran concurrently).\n\n" + text)
    print(text)


if __name__ == "__main__":
    main()
