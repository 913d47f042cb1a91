"""Project-wide test settings. The Kafka fixtures come from neli_orchestrate's pytest plugin,
which is opt-in (no ``pytest11`` entry point): this suite opts in here, as a user's would."""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["neli_orchestrate.testing.pytest_plugin"]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # In CI a skipped test hides a missing component (Kafka, Spark, Airflow): fail the run.
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if skipped and session.exitstatus == 0:
        reporter.write_line(f"CI=true: {skipped} skipped test(s) count as failures", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
