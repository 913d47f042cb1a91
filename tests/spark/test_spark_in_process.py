"""PySpark in one process (the Dagster case): fenced Parquet writes and cancelling on fence."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from neli_orchestrate.errors import StaleTokenError
from neli_orchestrate.spark import cancel_on_fence, write_parquet_fenced
from neli_orchestrate.spark.conf import local_spark_conf

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark() -> Iterator:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName("neli_orchestrate-tests")
    for key, value in local_spark_conf().items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    yield session
    session.stop()


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def test_fenced_parquet_is_readable_as_a_partition_and_stale_writes_are_refused(
    spark, tmp_path: Path
) -> None:
    day = dt.date(2013, 1, 5)
    rows = [(day, "UA", "EWR", 120), (day, "B6", "JFK", 95)]
    frame = spark.createDataFrame(rows, "date date, carrier string, origin string, flights long")

    marker = write_parquet_fenced(
        frame, tmp_path, "2013-01-05", 7, role="daily_flights", partition_column="date"
    )

    assert marker.token == 7 and marker.path == tmp_path / "date=2013-01-05"
    read_back = spark.read.parquet(tmp_path.as_uri())  # the guard's _neli area is invisible
    assert sorted(tuple(r) for r in read_back.select("date", "carrier", "flights").collect()) == [
        (day, "B6", 95),
        (day, "UA", 120),
    ]
    files_before = sorted(p.name for p in marker.path.iterdir())

    stale_frame = spark.createDataFrame([(day, "AA", "LGA", 1)], frame.schema)
    with pytest.raises(StaleTokenError) as caught:
        write_parquet_fenced(
            stale_frame, tmp_path, "2013-01-05", 6, role="daily_flights", partition_column="date"
        )

    assert (caught.value.token, caught.value.committed) == (6, 7)
    assert sorted(p.name for p in marker.path.iterdir()) == files_before
    assert spark.read.parquet(tmp_path.as_uri()).count() == 2
    assert list(tmp_path.glob("_neli/staging/*/*")) == []


def test_fence_callback_cancels_running_spark_work(spark) -> None:
    group = "daily_flights/2013-01-05"
    entered = threading.Event()
    outcome: dict[str, object] = {}
    holder: dict[str, object] = {}

    def work() -> None:
        with cancel_on_fence(spark, group) as cancel:
            holder["cancel"] = cancel
            entered.set()
            try:  # hours of work at this size: only cancellation ends it in time
                spark.range(0, 10**13, numPartitions=2).selectExpr("sum(id)").collect()
                outcome["result"] = "finished"
            except Exception as exc:  # noqa: BLE001 - py4j/pyspark error types vary
                outcome["error"] = exc
        outcome["group_after"] = spark.sparkContext.getLocalProperty("spark.jobGroup.id")

    runner = threading.Thread(target=work, name="singleton-work")
    runner.start()
    assert entered.wait(60)
    tracker = spark.sparkContext.statusTracker()
    wait_until(lambda: tracker.getJobIdsForGroup(group), 60, "the job to start in its group")
    started = time.monotonic()

    watchdog = threading.Thread(target=holder["cancel"], args=("LeaderFenced",), name="watchdog")
    watchdog.start()  # what the singleton's watchdog does when leadership is fenced
    watchdog.join(30)
    runner.join(60)

    assert not runner.is_alive(), "the Spark action did not return after cancellation"
    assert "result" not in outcome
    assert "cancel" in str(outcome["error"]).lower()
    assert outcome["group_after"] is None  # later jobs of this thread are not in the group
    wait_until(lambda: not tracker.getActiveStageIds(), 60, "running tasks to stop")
    assert time.monotonic() - started < 60
    assert spark.range(10).count() == 10  # the session stays usable
