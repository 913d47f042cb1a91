"""Airflow conventions: deferrable from [operators] default_deferrable, a sensor timeout that
counts the whole wait across deferrals, an example DAG that imports with the airflow extra
alone."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pendulum
import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowSensorTimeout, TaskDeferred

from neli_orchestrate.airflow.operators.gate import LeaderGateOperator
from neli_orchestrate.airflow.sensors.leader import NeliLeaderSensor

pytestmark = pytest.mark.airflow

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("setting", ["True", "False"])
def test_deferrable_defaults_from_operators_default_deferrable(
    monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", setting)
    with DAG("d", schedule=None, start_date=pendulum.datetime(2013, 1, 1)):
        gate = LeaderGateOperator(task_id="gate", role="r")
        sensor = NeliLeaderSensor(task_id="sensor", role="r")
        explicit = LeaderGateOperator(task_id="explicit", role="r", deferrable=False)
    assert gate.deferrable is sensor.deferrable is (setting == "True")
    assert explicit.deferrable is False


def waiting_gate(timeout: float) -> LeaderGateOperator:
    with DAG("d", schedule=None, start_date=pendulum.datetime(2013, 1, 1)):
        gate = LeaderGateOperator(
            task_id="gate", role="r", deferrable=True, timeout=timeout, poke_interval=5
        )
    gate.poke = lambda context: False  # type: ignore[method-assign]  # never our turn
    return gate


def test_each_deferral_gets_only_what_is_left_of_the_sensor_timeout() -> None:
    gate = waiting_gate(timeout=600)
    with pytest.raises(TaskDeferred) as first:
        gate.execute({})
    started = first.value.trigger.wait_started_at
    assert first.value.timeout.total_seconds() == pytest.approx(600, abs=5)

    # resumed 500 s into the wait (the trigger echoes when the wait began): 100 s are left
    event = {"status": "leader", "wait_started_at": started - 500}
    with pytest.raises(TaskDeferred) as second:
        gate.execute_complete({}, event=event)
    assert second.value.timeout.total_seconds() == pytest.approx(100, abs=5)
    assert second.value.trigger.wait_started_at == started - 500


def test_a_wait_past_the_sensor_timeout_fails_instead_of_deferring_again() -> None:
    gate = waiting_gate(timeout=600)
    with pytest.raises(AirflowSensorTimeout, match="counted across deferrals"):
        gate.execute_complete({}, event={"status": "leader", "wait_started_at": time.time() - 601})


def test_example_dag_imports_with_the_airflow_extra_alone(tmp_path: Path) -> None:
    """No PySpark (the `spark` extra): the DAG imports; the task fails at run time naming the
    fix (rendering env_vars calls spark_home())."""
    script = textwrap.dedent(
        f"""
        import sys

        class NoPySpark:
            def find_spec(self, name, path=None, target=None):
                if name == "pyspark" or name.startswith("pyspark."):
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, NoPySpark())
        import importlib.util
        real_find_spec = importlib.util.find_spec
        importlib.util.find_spec = (
            lambda name, *a: None if name.split(".")[0] == "pyspark" else real_find_spec(name, *a)
        )
        from airflow.dag_processing.dagbag import DagBag
        bag = DagBag(dag_folder={str(REPO / "dags" / "nycflights_daily.py")!r})
        assert not bag.import_errors, bag.import_errors
        task = bag.dags["nycflights_daily"].task_dict["daily_performance"]
        from neli_orchestrate.errors import ConfigError
        try:
            task.render_template_fields({{"ds": "2013-01-01", "ds_nodash": "20130101",
                                          "var": {{"value": {{}}}}}})
        except ConfigError as exc:
            print("runtime error:", exc)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "AIRFLOW_HOME": str(tmp_path),
           # the job's scratch path names the deployment of the gate's connection
           "AIRFLOW_CONN_NELI_DEFAULT": '{"conn_type": "neli", "host": "127.0.0.1:9", "extra": '
                                        '{"deployment": "us-east-1", "namespace": "acme"}}'}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "runtime error:" in result.stdout and "pip install pyspark" in result.stdout, (
        result.stdout[-2000:]
    )




def test_example_dag_scratch_is_one_path_per_deployment_for_job_and_clean_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two regions on one host: each region's clean_scratch removes exactly the directory its
    own job used, never the other region's (a chaos run lost a run to a shared path)."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags" / "nycflights_daily.py"))
    assert not bag.import_errors, bag.import_errors
    dag = bag.dags["nycflights_daily"]
    used: dict[str, tuple[str, str]] = {}
    for deployment in ("us-east-1", "eu-west-1"):
        monkeypatch.setenv(
            "AIRFLOW_CONN_NELI_DEFAULT",
            '{"conn_type": "neli", "host": "127.0.0.1:9", '
            f'"extra": {{"deployment": "{deployment}", "namespace": "acme"}}}}')
        context = {"ds": "2013-01-01", "ds_nodash": "20130101", "var": {"value": {}}}
        job = dag.task_dict["daily_performance"].prepare_for_execution()
        clean = dag.task_dict["clean_scratch"].prepare_for_execution()
        job.render_template_fields(dict(context))
        clean.render_template_fields(dict(context))
        (cleaned,) = clean.op_args
        used[deployment] = (job.conf["spark.local.dir"], cleaned)
    for deployment, (scratch, cleaned) in used.items():
        assert scratch == cleaned, (deployment, scratch, cleaned)  # one derivation, two uses
        assert f"/acme/{deployment}/" in scratch and scratch.endswith("/20130101"), scratch
    assert used["us-east-1"][0] != used["eu-west-1"][0], used
