"""Every table of docs/internals/performance.md, one benchmark after the other (about 20 minutes).

Usage::

    python integration/bench/all.py            # as root: the peers' net-cut trials need it
    python integration/bench/all.py --skip-build --only peers,roles

Runs, each in its own process and on its own broker, so that one cannot slow the next:

- ``peers.py``: side by side with ZooKeeper, etcd, PostgreSQL and goNELI (hand-over, crash,
  pause, net cut, idle CPU, start);
- ``claim.py --phases``: an uncontended ``reserve``, phase by phase, both group protocols;
- ``member_start.py``: member start, phase by phase, beside the code before the start-up work
  (``--base``; skipped when that commit cannot be archived);
- ``roles.py``: 100 and 1,000 roles with two deployments each;
- ``claim.py --ledger-records 1000000``: ``reserve`` on an empty and a 1,000,000-record ledger.

Results go to ``integration/bench/results/`` (JSON, markdown, plots). Run it on a quiet
machine: every figure is a latency or a CPU share.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BASE = "f1c9a3f"  # the commit before issue 12's start-up work (member_start.py's comparison)


def steps(args: argparse.Namespace, base_dir: Path | None) -> dict[str, list[str]]:
    peers = ["peers.py", "--trials", "9", "--crash-trials", "3", "--idle-window", "15"]
    start = ["member_start.py", "--trials", "20"]
    if base_dir is not None:
        start += ["--code", f"base-{args.base}={base_dir}"]
    return {
        "peers": peers + (["--skip-build"] if args.skip_build else []),
        "phases": ["claim.py", "--phases", "--trials", "20"],
        "start": start,
        "roles": ["roles.py"],
        "ledger": ["claim.py", "--ledger-records", "1000000", "--roles", "1000", "--trials",
                   "20", "--full-replays", "3"],
    }


def archive(commit: str, into: Path) -> Path | None:
    """The library as it was at ``commit``, or None if git cannot produce it."""
    git = subprocess.run(["git", "archive", commit, "neli_orchestrate"], cwd=ROOT,
                         capture_output=True)
    if git.returncode != 0:
        print(f"member start: no side-by-side ({git.stderr.decode().strip()})", flush=True)
        return None
    subprocess.run(["tar", "-x", "-C", str(into)], input=git.stdout, check=True)
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated: peers, phases, start, roles, ledger")
    parser.add_argument("--skip-build", action="store_true", help="peers.py: reuse goNELI")
    parser.add_argument("--base", default=BASE, help="member_start.py's comparison commit")
    args = parser.parse_args()
    failed = []
    with tempfile.TemporaryDirectory(prefix="neli-bench-base-") as tmp:
        plan = steps(args, None)
        chosen = args.only.split(",") if args.only else list(plan)
        unknown = set(chosen) - set(plan)
        if unknown:
            parser.error(f"unknown step(s) {sorted(unknown)}; choose from {list(plan)}")
        base_dir = archive(args.base, Path(tmp)) if "start" in chosen else None
        plan = steps(args, base_dir)
        for name in chosen:
            command = [sys.executable, str(HERE / plan[name][0]), *plan[name][1:]]
            print(f"== {name}: {' '.join(command[1:])}", flush=True)
            begin = time.monotonic()
            code = subprocess.run(command, cwd=ROOT).returncode
            print(f"== {name}: exit {code} after {time.monotonic() - begin:.0f} s", flush=True)
            if code != 0:
                failed.append(name)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")
    print(f"tables in {HERE / 'results'}")


if __name__ == "__main__":
    main()
