"""Benchmark the deterministic simulation: how long 10,000 seeded schedules take here.

Usage::

    python integration/bench/simulation.py --seeds 10000

Target (issue 4): 10,000 seeds in under a minute on 2 cores. Reports wall time and CPU time
per seed (CPU time does not depend on other load on the machine) and writes
``integration/bench/results/simulation.json`` and ``simulation.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# the repository root: integration.sim is not installed with the package
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from integration.sim.runner import run_seeds  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=None, help="default: CPU count")
    args = parser.parse_args()
    summary = run_seeds(range(args.seeds), workers=args.workers)
    result = {
        "seeds": summary.seeds, "failures": len(summary.failures), "workers": summary.workers,
        "wall_s": round(summary.seconds, 2), "cpu_s": round(summary.cpu_seconds, 2),
        "cpu_ms_per_seed": round(1000 * summary.cpu_seconds / max(1, summary.seeds), 2),
        "events": summary.events, "faults": summary.faults,
        "load_avg": os.getloadavg(), "when": time.time(),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "simulation.json").write_text(json.dumps(result, indent=2))
    table = ("| seeds | workers | failures | wall s | CPU s | CPU ms/seed | events |\n"
             "|---|---|---|---|---|---|---|\n"
             f"| {result['seeds']} | {result['workers']} | {result['failures']} |"
             f" {result['wall_s']} | {result['cpu_s']} | {result['cpu_ms_per_seed']} |"
             f" {result['events']} |\n")
    (RESULTS / "simulation.md").write_text(
        f"# Simulation throughput\n\n`python integration/bench/simulation.py --seeds "
        f"{args.seeds}`; load average {result['load_avg'][0]:.1f} on {os.cpu_count()}"
        f" cores.\n\n" + table)
    print(table)
    if summary.failures:
        raise SystemExit(f"{len(summary.failures)} seeds failed, first: {summary.failures[0]}")


if __name__ == "__main__":
    main()
