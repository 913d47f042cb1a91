"""``local_table_session`` after the driver JVM of an earlier session died: a fresh one.

pyspark keeps its gateway for the life of the process; once that JVM is gone every later
session of the process failed with ``ConnectionRefusedError`` (seen in CI: one JVM's death
turned a dozen table-sink tests into errors). The helper now replaces a JVM that no longer
answers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from neli_orchestrate.testing.table_jars import local_table_session

pytestmark = [pytest.mark.spark]


def test_a_dead_driver_jvm_is_replaced_by_the_next_session(tmp_path: Path) -> None:
    from pyspark import SparkContext

    first = local_table_session(tmp_path / "warehouse", app_name="first")
    jvm = SparkContext._gateway.proc
    first.stop()
    jvm.kill()                      # this process's own driver JVM, gone under the gateway
    jvm.wait(30)

    second = local_table_session(tmp_path / "warehouse", app_name="second")
    try:
        assert SparkContext._gateway.proc.pid != jvm.pid
        assert second.range(3).count() == 3
    finally:
        second.stop()
