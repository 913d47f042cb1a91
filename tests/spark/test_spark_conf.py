"""The fencing token travels to the job as spark.neli.* conf; fence callbacks cancel Spark work."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from neli_orchestrate.claim import (
    ATTEMPT_CONF,
    DEPLOYMENT_CONF,
    ROLE_CONF,
    RUN_KEY_CONF,
    TOKEN_CONF,
    Claim,
)
from neli_orchestrate.errors import ConfigError
from neli_orchestrate.spark import cancel_on_fence, neli_spark_conf, read_neli_conf
from neli_orchestrate.spark.conf import (
    local_spark_conf,
    spark_home,
    spark_submit_env,
)


def test_package_imports_without_pyspark() -> None:
    code = (
        "import sys, neli_orchestrate.spark, neli_orchestrate.spark.dataframe;"
        "sys.exit(1 if 'pyspark' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_conf_round_trip_from_the_gates_xcom() -> None:
    xcom = {"token": 42, "run_key": "2013-01-05", "role": "daily_flights", "deployment": "eu"}

    conf = neli_spark_conf(**xcom)

    assert conf == {
        TOKEN_CONF: "42",
        RUN_KEY_CONF: "2013-01-05",
        ROLE_CONF: "daily_flights",
        DEPLOYMENT_CONF: "eu",
    }
    assert read_neli_conf(conf) == Claim(42, "2013-01-05", "daily_flights", "eu", 0)
    run = Claim(7, "k", "r", None, attempt=2)
    assert read_neli_conf(run.spark_conf()) == run
    assert run.spark_conf()[ATTEMPT_CONF] == "2"


class FakeSparkConf:
    """Mimics pyspark.SparkConf.get(key, default)."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def getAll(self) -> list[tuple[str, str]]:  # noqa: N802 - pyspark's name
        return list(self.values.items())


def test_read_from_spark_conf_like_objects() -> None:
    conf = FakeSparkConf({TOKEN_CONF: "9", RUN_KEY_CONF: "2013-02-08"})

    assert read_neli_conf(conf) == Claim(9, "2013-02-08")


@pytest.mark.parametrize(
    "values, match",
    [
        ({}, "spark.neli.token, spark.neli.run_key missing"),
        ({RUN_KEY_CONF: "2013-01-05"}, "spark.neli.token missing"),
        ({TOKEN_CONF: "abc", RUN_KEY_CONF: "k"}, "is not an integer"),
        ({TOKEN_CONF: "-3", RUN_KEY_CONF: "k"}, "must not be negative"),
        ({TOKEN_CONF: "3", RUN_KEY_CONF: "k", ATTEMPT_CONF: "x"}, "spark.neli.attempt"),
    ],
)
def test_missing_or_bad_conf_is_an_actionable_error(values: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        read_neli_conf(values)


@pytest.mark.parametrize(
    "kwargs",
    [{"token": -1, "run_key": "k"}, {"token": "1", "run_key": "k"}, {"token": 1, "run_key": ""}],
)
def test_building_conf_validates_the_token(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        neli_spark_conf(**kwargs)


class FakeSparkContext:
    """Records the job-group and job-tag calls a classic SparkContext would receive."""

    def __init__(self, fail_cancel: bool = False) -> None:
        self.calls: list[tuple] = []
        self.fail_cancel = fail_cancel

    def setJobGroup(self, group: str, description: str, interrupt: bool) -> None:  # noqa: N802
        self.calls.append(("setJobGroup", group, interrupt))

    def addJobTag(self, tag: str) -> None:  # noqa: N802
        self.calls.append(("addJobTag", tag))

    def removeJobTag(self, tag: str) -> None:  # noqa: N802
        self.calls.append(("removeJobTag", tag))

    def setLocalProperty(self, key: str, value: str | None) -> None:  # noqa: N802
        self.calls.append(("setLocalProperty", key, value))

    def cancelJobGroup(self, group: str) -> None:  # noqa: N802
        if self.fail_cancel:
            raise RuntimeError("context already stopped")
        self.calls.append(("cancelJobGroup", group, threading.current_thread().name))

    def cancelJobsWithTag(self, tag: str) -> None:  # noqa: N802
        self.calls.append(("cancelJobsWithTag", tag))


def test_fence_callback_cancels_the_job_group_from_the_watchdog_thread() -> None:
    sc = FakeSparkContext()

    with cancel_on_fence(sc, "daily_flights/2013-01-05,retry") as cancel:
        assert sc.calls == [
            ("setJobGroup", "daily_flights/2013-01-05,retry", True),
            ("addJobTag", "daily_flights/2013-01-05_retry"),  # Spark tags cannot hold commas
        ]
        watchdog = threading.Thread(target=cancel, args=("LeaderFenced",), name="watchdog")
        watchdog.start()
        watchdog.join(10)
        assert cancel.cancelled

    assert ("cancelJobGroup", "daily_flights/2013-01-05,retry", "watchdog") in sc.calls
    assert ("cancelJobsWithTag", "daily_flights/2013-01-05_retry") in sc.calls
    assert sc.calls[-4:] == [
        ("removeJobTag", "daily_flights/2013-01-05_retry"),
        ("setLocalProperty", "spark.jobGroup.id", None),
        ("setLocalProperty", "spark.job.description", None),
        ("setLocalProperty", "spark.job.interruptOnCancel", None),
    ]


def test_fence_callback_never_raises_into_the_watchdog(caplog: pytest.LogCaptureFixture) -> None:
    canceller = cancel_on_fence(FakeSparkContext(fail_cancel=True), "g")

    canceller()

    assert canceller.cancelled
    assert "could not cancel Spark jobs" in caplog.text


class FakeConnectSession:
    """A Spark Connect session: tags only, no SparkContext."""

    __module__ = "pyspark.sql.connect.session"

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def addTag(self, tag: str) -> None:  # noqa: N802
        self.calls.append(("addTag", tag))

    def removeTag(self, tag: str) -> None:  # noqa: N802
        self.calls.append(("removeTag", tag))

    def interruptTag(self, tag: str) -> list[str]:  # noqa: N802
        self.calls.append(("interruptTag", tag))
        return []


def test_spark_connect_sessions_are_cancelled_by_tag() -> None:
    session = FakeConnectSession()
    with cancel_on_fence(session, "role/key") as cancel:
        cancel()
    assert session.calls == [
        ("addTag", "role/key"),
        ("interruptTag", "role/key"),
        ("removeTag", "role/key"),
    ]


def test_spark_submit_env_points_at_a_full_pyspark() -> None:
    env = spark_submit_env()

    home = Path(env["SPARK_HOME"])
    assert home == spark_home()
    assert (home / "bin" / "spark-submit").exists()
    assert any(home.glob("jars/spark-core_*.jar"))
    assert env["PYSPARK_PYTHON"] == env["PYSPARK_DRIVER_PYTHON"] == sys.executable
    assert local_spark_conf(3)["spark.sql.shuffle.partitions"] == "3"
