"""Shared pieces of the Delta and Iceberg sink tests: a session with the real jars, rows that
say who wrote them, and a gate that holds a writer inside its Spark job until released."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCHEMA = "date string, carrier string, flights long, writer string"
DATE = "2013-01-05"
OTHER_DATE = "2013-01-06"


def rows(writer: str, n: int, date: str = DATE) -> list[tuple[str, str, int, str]]:
    """``n`` rows for ``date`` that name their ``writer`` (so content, not just counts, is
    compared)."""
    return [(date, f"C{i}", 100 * (i + 1) + len(writer), writer) for i in range(n)]


def frame(spark: Any, data: list[tuple[str, str, int, str]]) -> Any:
    return spark.createDataFrame(data, SCHEMA).coalesce(1)


class Gate:
    """Holds a DataFrame's Spark job at a Python UDF until :meth:`release`.

    The UDF runs in a Python worker process, so the two sides meet through files: the worker
    touches ``started`` when the job reaches it and waits (with a deadline) for ``released``.
    """

    def __init__(self, root: Path, name: str) -> None:
        self.started = root / f"{name}-{uuid.uuid4().hex}.started"
        self.released = root / f"{name}-{uuid.uuid4().hex}.released"

    def hold(self, df: Any) -> Any:
        from pyspark.sql import functions as F

        started, released = str(self.started), str(self.released)

        def wait(value):  # no annotations: pyspark would read them as a pandas UDF hint
            import os
            import time as _time

            open(started, "a").close()
            deadline = _time.monotonic() + 120
            while not os.path.exists(released):
                if _time.monotonic() > deadline:
                    raise RuntimeError("gate was never released")
                _time.sleep(0.05)
            return value

        return df.withColumn("writer", F.udf(wait, "string")(F.col("writer")))  # type: ignore

    def wait_started(self, writer: Background, timeout: float = 120.0) -> None:
        """Wait until the held job reaches the gate; fail at once if ``writer`` ended first."""
        deadline = time.monotonic() + timeout
        while not self.started.exists():
            if writer.done:
                raise AssertionError(f"the held writer ended before its job reached the gate: "
                                     f"{writer.error!r} {writer.error}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the held writer's job did not start within {timeout} s")
            time.sleep(0.05)

    def release(self) -> None:
        self.released.touch()


class Background:
    """Runs ``fn`` in a thread and keeps its result or exception for the test to assert on."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.error = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float = 180.0) -> None:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"the background writer did not finish within {timeout} s")
