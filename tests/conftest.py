"""Project-wide test settings. The Kafka fixtures come from neli_orchestrate's pytest plugin,
which is opt-in (no ``pytest11`` entry point): this suite opts in here, as a user's would."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pytest

pytest_plugins = ["neli_orchestrate.testing.pytest_plugin"]

SIM = "tests/sim/"
MATRIX = "tests/compat/test_release_matrix.py::"

#: The test command runs on two pytest-xdist workers (``addopts`` in pyproject.toml), and a test
#: file is the unit a worker takes whole, so that a module's fixture (a Spark cluster, an Airflow
#: world of three regions) starts once. The simulation and the release matrix are one unit: the
#: matrix's nested runs start with the simulation's tests and are waited for right after them.
SIM_AND_MATRIX = "tests/sim+release-matrix"

#: The longest units first (longest-processing-time-first), so that the two workers finish
#: close together instead of one starting a seven-minute file when the other is done. The
#: order comes from ``--durations=0`` of a whole run (docs/internals/development.md); a file not
#: named here runs after these, in collection order.
LONGEST_FIRST = (
    SIM_AND_MATRIX,
    "tests/spark/test_spark_cluster.py",
    "tests/regions/test_demo.py",
    "tests/airflow/test_regions.py",
    "tests/regions/test_chaos.py",
    "tests/airflow/test_assets_by_proxy.py",
    "tests/spark/test_delta_sink.py",
    "tests/regions/test_broker_crash_ride_through.py",
    "tests/ledger/test_ledger_leader_kill_cluster.py",
    "tests/dagster/test_dagster_two_deployments.py",
    "tests/regions/test_chaos_hold.py",
    "tests/cli/test_run_dagster_daemon.py",
    "tests/regions/test_region_connections.py",
    "tests/spark/test_spark_sinks_on_s3.py",
    "tests/cli/test_run_supervise.py",
    "tests/airflow/test_fenced.py",
    "tests/singleton/test_singleton_kafka.py",
)


def unit_of(nodeid: str) -> str:
    """The unit of work an xdist worker takes whole: the test's file, or the simulation's."""
    if nodeid.startswith((SIM, MATRIX)):
        return SIM_AND_MATRIX
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The release matrix's nested runs start with the simulation's tests (tests/sim/conftest.py,
    # pure Python) and run beside them; its tests, which wait for those runs, come right after.
    matrix = [item for item in items if item.nodeid.startswith(MATRIX)]
    sim = [i for i, item in enumerate(items) if item.nodeid.startswith(SIM)]
    if matrix and sim:
        after = items[sim[-1]]
        rest = [item for item in items if not item.nodeid.startswith(MATRIX)]
        at = rest.index(after) + 1
        items[:] = rest[:at] + matrix + rest[at:]
    rank = {unit: i for i, unit in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(unit_of(item.nodeid), len(rank)))  # stable


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's scope scheduling with :func:`unit_of` as the scope, in collection order (the
    order above). Its own ``loadgroup`` does not group on pytest 9.2: it renames a test by an
    attribute pytest no longer reads."""
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return ByUnit(config, log)  # type: ignore[arg-type]


def reserve_until_claimed(singleton: Any, role: str, run_key: str, timeout: float = 60.0) -> Any:
    """Reserve until this deployment holds the claim (a loaded machine may answer WAIT first:
    the member can lose its lease while deciding). Test set-up, not what a gate does."""
    deadline = time.monotonic() + timeout
    while True:
        reservation = singleton.reserve(role, run_key)
        if reservation.should_run:
            return reservation
        assert time.monotonic() < deadline, f"never claimed {run_key!r}: {reservation}"
        time.sleep(0.2)


@pytest.fixture
def claim_now() -> Callable[..., Any]:
    """``claim_now(singleton, role, run_key)``: reserve until the claim is held."""
    return reserve_until_claimed


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # In CI a skipped test hides a missing component (Kafka, Spark, Airflow): fail the run.
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if skipped and session.exitstatus == 0:
        reporter.write_line(f"CI=true: {skipped} skipped test(s) count as failures", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
