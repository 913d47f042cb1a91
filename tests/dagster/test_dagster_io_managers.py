"""The token-checked IO managers (NeliDeltaIOManager on delta-rs, NeliIcebergIOManager on
pyiceberg) under @singleton_asset, with scripted members (no Kafka) and real tables on disk:
the output lands under the step's token, a stale or fenced write records no materialization,
and the failure says what was and was not written."""

from __future__ import annotations

import time
from typing import Any

import dagster as dg
import pyarrow as pa
import pytest
import test_dagster_outcomes as world
from deltalake import DeltaTable
from pyiceberg.catalog.sql import SqlCatalog
from test_dagster_outcomes import DAY, DAYS, _events, fresh_world, neli  # noqa: F401

from neli_orchestrate.dagster import NeliRun, singleton_asset
from neli_orchestrate.dagster.delta import NeliDeltaIOManager, write_deltalake_fenced
from neli_orchestrate.dagster.iceberg import NeliIcebergIOManager
from neli_orchestrate.ledger.record import RunState
from neli_orchestrate.sinks import delta as delta_sink

pytestmark = [pytest.mark.dagster]


def rows(writer: str, n: int) -> pa.Table:
    return pa.table({"date": [DAY] * n, "carrier": [f"C{i}" for i in range(n)],
                     "writer": [writer] * n})


@singleton_asset(partitions_def=DAYS, io_manager_key="lake")
def daily(context: dg.AssetExecutionContext, run: NeliRun) -> pa.Table:
    return rows(f"token-{run.token}", 2)


LOADED: list[Any] = []


@dg.asset(partitions_def=DAYS)
def daily_report(daily: pa.Table) -> None:
    """Downstream: loads the partition through the upstream's IO manager."""
    LOADED.append(daily)


def materialize(lake: Any, *, downstream: bool = False) -> dg.ExecuteInProcessResult:
    assets = [daily, daily_report] if downstream else [daily]
    return dg.materialize(assets, partition_key=DAY, resources={"neli": neli(), "lake": lake},
                          raise_on_error=False, instance=world.INSTANCE)


def writers(uri: str) -> set[str]:
    return {r["writer"] for r in DeltaTable(uri).to_pyarrow_table().to_pylist()}


def failure(result: dg.ExecuteInProcessResult) -> str:
    [event] = _events(result, "STEP_FAILURE")
    data = event.step_failure_data
    return (data.user_failure_data.description if data.user_failure_data
            else data.error.message)


def test_delta_output_lands_under_the_steps_token(tmp_path: Any) -> None:
    LOADED.clear()
    result = materialize(NeliDeltaIOManager(root_uri=str(tmp_path)), downstream=True)
    assert result.success
    [event] = [e for e in _events(result, "ASSET_MATERIALIZATION") if e.step_key == "daily"]
    metadata = {k: v.value for k, v in
                event.step_materialization_data.materialization.metadata.items()}
    token = metadata["token"]
    assert metadata["committed"] is True and metadata["uri"] == f"{tmp_path}/daily"
    assert writers(f"{tmp_path}/daily") == {f"token-{token}"}
    [loaded] = LOADED
    assert {r["writer"] for r in loaded.to_pylist()} == {f"token-{token}"}
    assert world.WORLD.ledger.history("daily", DAY)[-1] == RunState.COMPLETED


def test_a_stale_delta_write_is_refused_before_any_byte_and_records_no_materialization(
        tmp_path: Any) -> None:
    uri = f"{tmp_path}/daily"
    write_deltalake_fenced(rows("newer", 1), uri, DAY, 10**6, role="daily")  # a newer token
    version = DeltaTable(uri).version()

    result = materialize(NeliDeltaIOManager(root_uri=str(tmp_path)))

    assert not result.success
    assert _events(result, "ASSET_MATERIALIZATION") == []
    message = failure(result)
    assert "refused token" in message and "Nothing was written" in message
    assert "no materialization is recorded" in message
    assert DeltaTable(uri).version() == version and writers(uri) == {"newer"}
    # no gc.collect(): the IO manager ended the block before the step failed
    record = world.WORLD.ledger.latest("daily", DAY)
    assert record is not None and record.state == RunState.FAILED
    assert "refused token" in record.reason  # the IO manager's reason, not "GeneratorExit"


def test_a_fence_during_the_delta_write_fails_the_step_and_says_the_rows_landed(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[NeliRun] = []

    @singleton_asset(partitions_def=DAYS, io_manager_key="lake", name="daily")
    def fenced_daily(context: dg.AssetExecutionContext, run: NeliRun) -> pa.Table:
        runs.append(run)
        return rows("fenced", 2)

    def fence_now(stage: str, uri: str) -> None:
        if stage == "write":
            world.WORLD.members[-1].fence()  # the region is cut off as its commit goes out
            deadline = time.monotonic() + 10
            while not runs[0].fenced and time.monotonic() < deadline:
                time.sleep(0.01)

    monkeypatch.setattr(delta_sink, "_before_commit", fence_now)
    result = dg.materialize([fenced_daily], partition_key=DAY, instance=world.INSTANCE,
                            resources={"neli": neli(), "lake": NeliDeltaIOManager(
                                root_uri=str(tmp_path))}, raise_on_error=False)

    assert not result.success
    assert _events(result, "ASSET_MATERIALIZATION") == []
    message = failure(result)
    assert "fenced while the IO manager wrote" in message and "were committed" in message
    assert RunState.COMPLETED not in world.WORLD.ledger.history("daily", DAY)


def test_an_asset_without_a_claim_cannot_use_the_io_manager(tmp_path: Any) -> None:
    @dg.asset(partitions_def=DAYS, io_manager_key="lake")
    def plain() -> pa.Table:
        return rows("plain", 1)

    result = dg.materialize([plain], partition_key=DAY, raise_on_error=False,
                            resources={"lake": NeliDeltaIOManager(root_uri=str(tmp_path))},
                            instance=world.INSTANCE)
    assert not result.success and "holds no NELI claim" in failure(result)
    assert not (tmp_path / "plain").exists()


def test_iceberg_output_lands_and_a_stale_one_is_refused(tmp_path: Any) -> None:
    properties = {"uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": tmp_path.as_uri()}
    catalog = SqlCatalog("lake", **properties)
    catalog.create_namespace("flights")
    catalog.create_table("flights.daily", schema=rows("x", 1).schema)
    lake = NeliIcebergIOManager(catalog_name="lake", catalog_properties=properties,
                                namespace="flights")

    first = materialize(lake)
    assert first.success
    [event] = _events(first, "ASSET_MATERIALIZATION")
    token = event.step_materialization_data.materialization.metadata["token"].value
    data = catalog.load_table("flights.daily").scan().to_arrow().to_pylist()
    assert {r["writer"] for r in data} == {f"token-{token}"}

    # A newer token commits the partition; this deployment's next try is then stale.
    from neli_orchestrate.dagster.iceberg import write_pyiceberg_fenced

    write_pyiceberg_fenced(rows("newer", 1), catalog, "flights.daily", DAY, 10**6, role="daily")
    world.WORLD.ledger = type(world.WORLD.ledger)()  # a fresh ledger: the run key is open again
    second = materialize(lake)
    assert not second.success and _events(second, "ASSET_MATERIALIZATION") == []
    assert "Nothing was written" in failure(second)
    data = catalog.load_table("flights.daily").scan().to_arrow().to_pylist()
    assert {r["writer"] for r in data} == {"newer"}
