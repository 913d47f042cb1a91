"""Helpers of the security tests."""

from __future__ import annotations

from typing import Any

import pytest


def logged(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records)




def materialize_a_day(resource: Any) -> tuple[Any, list[int]]:
    """Materialize a daily singleton asset for 2013-01-05 through ``resource`` (a
    ``NeliResource``); return Dagster's result and the fencing tokens the asset ran with."""
    import dagster as dg

    from neli_orchestrate.dagster import NeliRun, singleton_asset

    days = dg.DailyPartitionsDefinition(start_date="2013-01-01", end_date="2013-02-01")
    executed: list[int] = []

    @singleton_asset(partitions_def=days)
    def flights(context: dg.AssetExecutionContext, run: NeliRun) -> int:
        executed.append(run.token)
        return run.token

    result = dg.materialize([flights], resources={"neli": resource}, partition_key="2013-01-05")
    return result, executed
