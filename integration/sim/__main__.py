"""``python -m integration.sim``: run seeded schedules, or replay one with its trace."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from integration.sim.config import MUTATIONS, SimConfig
from integration.sim.runner import run_seed, run_seeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m integration.sim",
        description="Deterministic simulation of the exactly-once protocol (invariants S1-S5, L1).",
    )
    parser.add_argument("--seeds", type=int, default=1000, help="number of seeds to run")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--seed", type=int, help="replay this one seed")
    parser.add_argument("--trace", action="store_true", help="print the trace of --seed")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: CPUs)")
    parser.add_argument(
        "--mutation", choices=sorted(MUTATIONS), help="run a deliberately broken protocol"
    )
    parser.add_argument("--json", metavar="FILE", help="also write the summary as JSON")
    args = parser.parse_args(argv)
    config = SimConfig(mutation=args.mutation)

    if args.seed is not None:
        result = run_seed(args.seed, config)
        if args.trace or not result.ok:
            print(result.report())
        else:
            print(f"seed {args.seed}: ok ({result.stats.events} events)")
        return 0 if result.ok else 1

    summary = run_seeds(range(args.start, args.start + args.seeds), config, workers=args.workers)
    print(summary.text())
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(
                {"config": dataclasses.asdict(config), "summary": summary.as_dict()}, out, indent=2
            )
    if summary.failures:
        first = summary.failures[0][0]
        print(f"\nfirst failing seed {first}, replayed with its trace:\n")
        print(run_seed(first, config).report())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
