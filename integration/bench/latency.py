"""Benchmark a claim across regions: reserve latency at 0, 30, 60 and 120 ms of round trip.

Usage::

    python integration/bench/latency.py --trials 10                  # starts a LocalKafka
    python integration/bench/latency.py --rtt 0 --rtt 60 --profile fast

The broker gets a second client listener that it advertises at a delaying TCP proxy
(``integration/regions/delay_proxy.py``; this kernel has no netem), so every request of the
measured ``Singleton`` crosses the proxy: ``rtt / 2`` each way, the deployment in one region
and the broker in another. The broker's own traffic (its controller, its transaction markers)
stays on the undelayed listener. Each trial is one ``Singleton.reserve(role, run_key)`` of a
fresh run key of an uncontended role, as in ``claim.py``: join the role's group, lead, begin
the role's transactional ledger writer (``init_transactions()``), replay, decide, commit
CLAIMED, leave. The round-trip counts all run side by side in one process, in rounds (each
round one trial at every round trip, in a shuffled order), so machine load spreads evenly.

Two numbers per claim:
- **round trips on the critical path**: the slope of the p50 latency against the round trip
  (least squares over the round trips measured): what one more millisecond between regions
  costs, in round trips;
- **requests per reserve**: every Kafka request the deployment's clients sent through the
  proxy during one reserve, by API (background heartbeats and fetches included: they overlap).

The goal of issue #31: at most 4 round trips + 20 ms. Writes
``integration/bench/results/latency.json`` and ``latency.md`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from benchlib import percentile

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from integration.regions.delay_proxy import (  # noqa: E402
    KAFKA_API_NAMES,
    DelayProxy,
    broker_behind_proxies,
)

RESULTS = Path(__file__).resolve().parent / "results"


def _slope(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of y against x."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return slope, my - slope * mx


def run(rtts: list[float], trials: int, profile: str) -> dict[str, Any]:
    from neli_orchestrate import NeliConfig, Outcome, Singleton, SingletonConfig
    from neli_orchestrate.testing.local_kafka import free_port

    remote_port = free_port()
    with DelayProxy(("127.0.0.1", remote_port)) as proxy:
        kafka = broker_behind_proxies({"remote": proxy.port}, {"remote": remote_port}).start()
        try:
            bootstrap = f"127.0.0.1:{proxy.port}"
            singletons = {}
            for rtt in rtts:
                neli = NeliConfig(bootstrap_servers=bootstrap, profile=profile)
                singletons[rtt] = Singleton(SingletonConfig(
                    neli=neli, namespace=f"lat{uuid.uuid4().hex[:6]}", deployment="far"))
                proxy.set_delay(rtt / 2000)
                singletons[rtt].reserve("warm-up", "0")  # topics, coordinators, connections
            samples: dict[float, list[float]] = {rtt: [] for rtt in rtts}
            requests: dict[float, Counter[int]] = {rtt: Counter() for rtt in rtts}
            order = list(rtts)
            for i in range(trials):
                random.shuffle(order)
                for rtt in order:
                    proxy.set_delay(rtt / 2000)
                    proxy.reset_counts()
                    started = time.perf_counter()
                    reservation = singletons[rtt].reserve("measured", f"k{i}")
                    samples[rtt].append((time.perf_counter() - started) * 1000)
                    requests[rtt].update(proxy.requests)
                    if reservation.outcome is not Outcome.RUN:
                        raise RuntimeError(f"uncontended reserve answered "
                                           f"{reservation.outcome}: {reservation.reason}")
            for singleton in singletons.values():
                singleton.close()
        finally:
            kafka.stop()
    rows = {}
    for rtt in rtts:
        per = {KAFKA_API_NAMES.get(k, str(k)): round(v / trials, 1)
               for k, v in sorted(requests[rtt].items())}
        rows[str(rtt)] = {
            "rtt_ms": rtt, "trials": trials,
            "p50_ms": round(statistics.median(samples[rtt]), 1),
            "p99_ms": round(percentile(samples[rtt], 0.99), 1),
            "min_ms": round(min(samples[rtt]), 1),
            "requests_per_reserve": round(sum(requests[rtt].values()) / trials, 1),
            "requests_by_api": per,
            "samples_ms": [round(s, 1) for s in samples[rtt]],
        }
    slope, intercept = _slope([(rtt, rows[str(rtt)]["p50_ms"]) for rtt in rtts])
    return {"profile": profile, "rows": rows, "round_trips": round(slope, 2),
            "intercept_ms": round(intercept, 1)}


def table(result: dict[str, Any], command: str, load: str) -> str:
    lines = [
        "# Claim latency across regions",
        "",
        f"`{command}`; profile `{result['profile']}`; load average {load} on "
        f"{os.cpu_count()} cores. The deployment reaches the broker through a delaying TCP "
        "proxy (half the round trip each way).",
        "",
        "| round trip ms | trials | reserve p50 ms | p99 ms | min ms | requests per reserve |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["rows"].values():
        lines.append(f"| {row['rtt_ms']:g} | {row['trials']} | {row['p50_ms']} | "
                     f"{row['p99_ms']} | {row['min_ms']} | {row['requests_per_reserve']} |")
    first = next(iter(result["rows"].values()))
    lines += [
        "",
        f"Round trips on the critical path (slope of p50 against the round trip): "
        f"**{result['round_trips']}**, intercept {result['intercept_ms']} ms; the goal is at "
        "most 4 round trips + 20 ms.",
        "",
        f"Requests per reserve by API at {first['rtt_ms']:g} ms (all clients, background "
        "heartbeats and fetches included): "
        + ", ".join(f"{k} {v}" for k, v in first["requests_by_api"].items()) + ".",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--rtt", type=float, action="append",
                        help="round trip in ms (repeatable; default 0, 30, 60, 120)")
    parser.add_argument("--profile", default="default", help="timing profile (default: default)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rtts = args.rtt or [0.0, 30.0, 60.0, 120.0]
    result = run(rtts, args.trials, args.profile)
    load = f"{os.getloadavg()[0]:.1f}"
    result.update(machine=platform.machine(), cores=os.cpu_count(), load_average=load)
    command = "python integration/bench/latency.py " + " ".join(argv or sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latency.json").write_text(json.dumps(result, indent=2))
    text = table(result, command.strip(), load)
    (args.out / "latency.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
