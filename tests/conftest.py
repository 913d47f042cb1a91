"""Project-wide test settings. The Kafka fixtures come from neli_orchestrate's pytest plugin,
which is opt-in (no ``pytest11`` entry point): this suite opts in here, as a user's would."""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["neli_orchestrate.testing.pytest_plugin"]

SIM = "tests/sim/"
MATRIX = "tests/compat/test_release_matrix.py::"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The release matrix's nested runs start with the simulation's tests (tests/sim/conftest.py,
    # pure Python) and run beside them; its tests, which wait for those runs, come right after.
    matrix = [item for item in items if item.nodeid.startswith(MATRIX)]
    sim = [i for i, item in enumerate(items) if item.nodeid.startswith(SIM)]
    if not matrix or not sim:
        return
    after = items[sim[-1]]
    rest = [item for item in items if not item.nodeid.startswith(MATRIX)]
    at = rest.index(after) + 1
    items[:] = rest[:at] + matrix + rest[at:]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # In CI a skipped test hides a missing component (Kafka, Spark, Airflow): fail the run.
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if skipped and session.exitstatus == 0:
        reporter.write_line(f"CI=true: {skipped} skipped test(s) count as failures", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
