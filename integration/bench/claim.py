"""Benchmark an uncontended claim on a real broker: join → leader → fence → replay → CLAIMED.

Usage::

    python integration/bench/claim.py --trials 20                      # starts a LocalKafka
    python integration/bench/claim.py --bootstrap 127.0.0.1:9092

Each trial calls ``Singleton.reserve(role, run_key)`` for a fresh run key of a role nobody else
contends for, and times it end to end: the member joins the role's group, leads, begins the
role's transactional ledger writer (``init_transactions()``), replays the ledger, decides,
commits the CLAIMED record and leaves the group. ``claim`` (``Singleton.claim`` with empty
work: RUNNING + COMPLETED) is timed the same way. Both group protocols, side by side in one
run. Target (issue 4): reserve p50 < 500 ms on this machine.

Writes ``integration/bench/results/claim.json`` and ``claim.md`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def run(bootstrap: str, trials: int, protocols: list[str]) -> dict[str, Any]:
    from neli_orchestrate import NeliConfig, Outcome, Singleton, SingletonConfig

    results: dict[str, Any] = {}
    for protocol in protocols:
        ns = f"bench{uuid.uuid4().hex[:6]}"
        neli = NeliConfig(bootstrap_servers=bootstrap, profile="fast", group_protocol=protocol)
        singleton = Singleton(SingletonConfig(neli=neli, namespace=ns, deployment="bench"))
        # one untimed claim: creates the leader and ledger topics and loads the coordinators
        singleton.reserve("warm-up", "0")
        for kind in ("reserve", "claim"):
            samples = []
            for i in range(trials):
                start = time.perf_counter()
                if kind == "reserve":
                    reservation = singleton.reserve(f"role-{kind}", f"k{i}")
                    outcome, reason = reservation.outcome, reservation.reason
                else:
                    with singleton.claim(f"role-{kind}", f"k{i}") as r:
                        outcome, reason = r.outcome, r.reason
                samples.append((time.perf_counter() - start) * 1000)
                if outcome is not Outcome.RUN:
                    raise RuntimeError(f"uncontended {kind} answered {outcome}: {reason}")
            results[f"{protocol}/{kind}"] = {
                "trials": trials, "p50_ms": round(statistics.median(samples), 1),
                "p99_ms": round(percentile(samples, 0.99), 1),
                "min_ms": round(min(samples), 1), "samples_ms": [round(s, 1) for s in samples],
            }
        singleton.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="existing cluster (default: start a LocalKafka)")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--protocols", nargs="+", default=["classic", "consumer"])
    args = parser.parse_args()
    kafka = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        from neli_orchestrate.testing import LocalKafka

        kafka = LocalKafka().start()
        bootstrap = kafka.bootstrap_servers
    try:
        results = run(bootstrap, args.trials, args.protocols)
    finally:
        if kafka is not None:
            kafka.stop()
    meta = {"machine": platform.machine(), "cpus": os.cpu_count(),
            "load_avg": os.getloadavg(), "profile": "fast", "when": time.time()}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "claim.json").write_text(json.dumps({"meta": meta, "results": results},
                                                   indent=2))
    rows = ["| protocol / call | trials | p50 ms | p99 ms | min ms |", "|---|---|---|---|---|"]
    for name, r in results.items():
        rows.append(f"| {name} | {r['trials']} | {r['p50_ms']} | {r['p99_ms']} | {r['min_ms']} |")
    table = "\n".join(rows) + "\n"
    (RESULTS / "claim.md").write_text(
        f"# Uncontended claim latency\n\n`python integration/bench/claim.py --trials "
        f"{args.trials}`; load average {meta['load_avg'][0]:.1f} on {meta['cpus']} cores.\n\n"
        + table)
    print(table)


if __name__ == "__main__":
    main()
