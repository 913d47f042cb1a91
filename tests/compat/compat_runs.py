"""The release matrix's nested pytest runs (``test_release_matrix.py``): one per release in
``selection.VERSIONS``, each with its own broker, started once per session.

``tests/sim/conftest.py`` starts them when the simulation's tests begin (pure Python on one
core, no component: the nested runs' brokers get the other), and ``tests/conftest.py`` orders
the matrix's tests right after the simulation's, so the two overlap instead of the test
command waiting on the matrix alone. Run on its own, the matrix starts them itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import selection

ROOT = Path(__file__).resolve().parents[2]
MATRIX = "tests/compat/test_release_matrix.py::"

Runs = dict[str, tuple["subprocess.Popen[bytes]", Path]]
_runs: Runs | None = None


def wanted(session: pytest.Session) -> bool:
    """Whether this session runs the matrix (and not inside a nested run of it)."""
    return any(item.nodeid.startswith(MATRIX) for item in session.items)


def start(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Start every release's nested run (once; later calls return the same runs)."""
    global _runs
    if _runs is not None:
        return _runs
    runs: Runs = {}
    for version in selection.VERSIONS:
        tmp = tmp_path_factory.mktemp(f"kafka-{version}")
        env = {**os.environ, "NELI_TEST_KAFKA_VERSION": version}
        env.pop("NELI_TEST_BOOTSTRAP_SERVERS", None)  # this release's own broker, never a given one
        log = tmp / f"kafka-{version}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(
                # its own basetemp: the nested session must not rotate this session's tmp dirs
                [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                 "--durations=0", f"--basetemp={tmp / 'nested'}", *selection.node_ids(version)],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        runs[version] = (proc, log)
    _runs = runs
    config.add_cleanup(stop)  # an interrupted session leaves no nested run behind
    return runs


def stop() -> None:
    """Kill the nested runs still going (the matrix's tests waited for theirs)."""
    for proc, _ in (_runs or {}).values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()
