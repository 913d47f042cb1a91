"""The cluster policy: the stock task directly after a gate runs fenced; other shapes fail import.

DAG files are loaded the way Airflow loads them (a DagBag, which applies cluster policies),
without Kafka. What a fenced stock task does at run time is in test_regions.py (real task
supervisor) and below with a fake singleton (the fence path, deterministically).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from neli_orchestrate.airflow.policy import is_fenced

pytestmark = pytest.mark.airflow

REPO = Path(__file__).resolve().parents[2]

HEADER = """
import pendulum
from airflow.sdk import DAG, task
from airflow.providers.standard.operators.bash import BashOperator
from airflow.providers.standard.operators.empty import EmptyOperator
from neli_orchestrate.airflow import LeaderGateOperator, fenced

with DAG("shape", schedule=None, start_date=pendulum.datetime(2013, 1, 1, tz="UTC")) as dag:
    gate = LeaderGateOperator(task_id="gate", role="stock_downstream", run_key="stock/{{ ds }}")
"""


def load(tmp_path: Path, body: str) -> Any:
    from airflow.dag_processing.dagbag import DagBag

    (tmp_path / "shape.py").write_text(HEADER + textwrap.indent(textwrap.dedent(body), "    "))
    return DagBag(dag_folder=str(tmp_path))


def test_issue_dag_stock_bash_operator_behind_the_gate_loads_fenced(tmp_path: Path) -> None:
    bag = load(
        tmp_path,
        """
        job = BashOperator(task_id="job", bash_command="echo stock job ran")
        gate >> job >> BashOperator(task_id="after", bash_command="true")
        """,
    )
    assert not bag.import_errors
    dag = bag.dags["shape"]
    assert is_fenced(dag.task_dict["job"])
    assert not is_fenced(dag.task_dict["after"])  # runs after the fenced work, unfenced
    assert type(dag.task_dict["job"]).__name__ == "BashOperator"  # same class in the UI


def test_stock_spark_submit_and_task_functions_behind_the_gate_load_fenced(
    tmp_path: Path,
) -> None:
    for name, body in {
        "spark": """
            from airflow.providers.apache.spark.operators.spark_submit import (
                SparkSubmitOperator,
            )
            gate >> SparkSubmitOperator(task_id="job", application="job.py")
            """,
        "task": """
            @task
            def job(neli_claim=None):
                return neli_claim
            gate >> job()
            """,
    }.items():
        folder = tmp_path / name
        folder.mkdir()
        bag = load(folder, body)
        assert not bag.import_errors, bag.import_errors
        assert is_fenced(bag.dags["shape"].task_dict["job"]), name


UNFENCEABLE = {
    "two children": (
        'gate >> [BashOperator(task_id="a", bash_command="true"), '
        'BashOperator(task_id="b", bash_command="true")]',
        "exactly one task runs under a claim",
    ),
    "mapped child": (
        'gate >> BashOperator.partial(task_id="a").expand(bash_command=["true", "false"])',
        "is mapped (.expand): its map indexes would share one claim",
    ),
    "mapped task function": (
        "@task\ndef work(x):\n    return x\ngate >> work.expand(x=[1, 2])",
        "is mapped (.expand)",
    ),
    "deferrable child": (
        "from airflow.providers.standard.sensors.time_delta import TimeDeltaSensor\n"
        "import datetime\n"
        'gate >> TimeDeltaSensor(task_id="a", delta=datetime.timedelta(1), deferrable=True)',
        "is deferrable: its work would run in the triggerer",
    ),
    "reschedule sensor": (
        "from airflow.providers.standard.sensors.bash import BashSensor\n"
        'gate >> BashSensor(task_id="a", bash_command="true", mode="reschedule")',
        "reschedule mode",
    ),
    "empty operator": (
        'gate >> EmptyOperator(task_id="a")',
        "the scheduler marks it done without running it",
    ),
    "explicit form not a direct child": (
        'b = BashOperator(task_id="b", bash_command="true")\n'
        'gate >> b >> fenced(BashOperator)(task_id="a", bash_command="true")',
        "is not directly downstream of a gate",
    ),
    "two gates": (
        'g2 = LeaderGateOperator(task_id="g2", role="other")\n'
        '[gate, g2] >> BashOperator(task_id="a", bash_command="true")',
        "also directly downstream of gate(s)",
    ),
    "spark-submit that returns at submission (YARN)": (
        "from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator\n"
        'gate >> SparkSubmitOperator(task_id="a", application="job.py", deploy_mode="cluster", '
        'conf={"spark.yarn.submit.waitAppCompletion": "false"})',
        "COMPLETED must mean the Spark application finished: "
        "spark.yarn.submit.waitAppCompletion=false",
    ),
    "spark-submit that returns at submission (Kubernetes)": (
        "from neli_orchestrate.airflow import FencedSparkSubmitOperator\n"
        'gate >> FencedSparkSubmitOperator(task_id="a", application="job.py", '
        'conf={"spark.kubernetes.submission.waitAppCompletion": "False"})',
        "pass track_driver_via_k8s_api=True",
    ),
    "spark-submit in cluster mode the provider does not track": (
        "from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator\n"
        'gate >> SparkSubmitOperator(task_id="a", application="job.py", '
        'conf={"spark.submit.deployMode": "cluster"})',
        "Pass deploy_mode='cluster' to the operator",
    ),
    "mapped gate": (
        'LeaderGateOperator.partial(task_id="g2", role="r").expand(run_key=["a", "b"])',
        "a LeaderGateOperator cannot be mapped",
    ),
}


@pytest.mark.parametrize("shape", sorted(UNFENCEABLE))
def test_a_shape_that_cannot_be_fenced_fails_to_import_saying_what_to_do(
    tmp_path: Path, shape: str
) -> None:
    body, message = UNFENCEABLE[shape]
    bag = load(tmp_path, body)
    assert "shape" not in bag.dags
    (error,) = bag.import_errors.values()
    assert "AirflowClusterPolicyViolation" in error and message in error, error


def test_without_the_policy_nothing_is_fenced_and_the_gate_refuses_to_claim(
    tmp_path: Path, fencing_policy: Any
) -> None:
    """The mutation check: with the policy unregistered the stock child is not fenced, and
    the gate fails before claiming rather than let it run unfenced."""
    from airflow import settings

    manager = settings.get_policy_plugin_manager()
    manager.unregister(fencing_policy)
    try:
        bag = load(tmp_path, 'gate >> BashOperator(task_id="job", bash_command="true")')
        dag = bag.dags["shape"]
        assert not is_fenced(dag.task_dict["job"])
        with pytest.raises(AirflowFailException, match="cluster policy is not loaded"):
            dag.task_dict["gate"].poke({})
    finally:
        manager.register(fencing_policy)


def test_fencing_a_bash_operator_needs_no_spark_provider(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys

        class NoSpark:
            def find_spec(self, name, path=None, target=None):
                if name.startswith("airflow.providers.apache.spark.operators") or (
                    name == "pyspark" or name.startswith("pyspark.")
                ):
                    raise ImportError(f"blocked: {name}")
                return None

        sys.meta_path.insert(0, NoSpark())
        import pendulum
        from airflow.sdk import DAG
        from airflow.providers.standard.operators.bash import BashOperator
        from neli_orchestrate.airflow import LeaderGateOperator, fenced
        from neli_orchestrate.airflow.policy import fence_downstream, is_fenced

        with DAG("d", schedule=None, start_date=pendulum.datetime(2013, 1, 1)) as dag:
            gate = LeaderGateOperator(task_id="gate", role="r")
            gate >> BashOperator(task_id="job", bash_command="true")
        fence_downstream(dag)
        assert is_fenced(dag.task_dict["job"])
        fenced(BashOperator)
        assert not any(m.startswith("airflow.providers.apache.spark.operators")
                       for m in sys.modules)
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "AIRFLOW_HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


# -- a fenced stock BashOperator at run time, with a fake singleton ----------------------------


class FakeSingleton:
    """Singleton.execute as far as a fenced task sees it; ``fence()`` acts as the watchdog."""

    def __init__(self) -> None:
        self.on_fence: Any = None
        self.calls: list[tuple[str, str, int]] = []
        self.failed_with: list[BaseException] = []
        #: what each failed try said of its retry (Run.expect_retry)
        self.retry_promises: list[float | None] = []

    def execute(self, claim, work, *, on_fence=None):  # the claim travels whole
        role, run_key, token = claim.role, claim.run_key, claim.token
        from types import SimpleNamespace

        from neli_orchestrate.errors import FencedError

        self.calls.append((role, run_key, token))
        self.on_fence = on_fence
        try:
            return work(SimpleNamespace(token=token, reason="",
                                        expect_retry=self.retry_promises.append))
        except BaseException as exc:
            self.failed_with.append(exc)
            if self.when_failed is not None:
                self.when_failed()  # what the real singleton would do now: record FAILED
            if self.fenced:
                raise FencedError("fenced: leadership lost", role=role, token=token) from exc
            raise

    fenced = False
    when_failed: Any = None

    def fence(self) -> None:
        self.fenced = True
        self.on_fence("leadership lost")

    def close(self) -> None:
        pass


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeSingleton:
    from neli_orchestrate.airflow.hooks.neli import NeliHook

    monkeypatch.setenv(
        "AIRFLOW_CONN_NELI_DEFAULT",
        '{"conn_type": "neli", "host": "127.0.0.1:9", '
        '"extra": {"deployment": "us-east-1", "namespace": "acme"}}',
    )
    singleton = FakeSingleton()
    monkeypatch.setattr(NeliHook, "get_singleton", lambda self: singleton)
    return singleton


class ClaimTI:
    try_number = 1
    max_tries = 1  # a retry is left: only a SIGTERM makes a failed try promise none

    def __init__(self, task: Any) -> None:
        self.task = task

    def xcom_pull(self, task_ids: str) -> Any:
        return {"token": 7, "run_key": "stock/2013-01-01", "role": "stock_downstream",
                "deployment": "us-east-1"}


def stock_bash(tmp_path: Path, command: str) -> Any:
    bag = load(tmp_path, f'gate >> BashOperator(task_id="job", bash_command={command!r})')
    task = bag.dags["shape"].task_dict["job"]
    task.render_template_fields({"ds": "2013-01-01"})
    return task


def test_stock_bash_gets_the_token_as_environment_variables(tmp_path: Path, fake: Any) -> None:
    out = tmp_path / "env.txt"
    task = stock_bash(tmp_path, f'echo "$NELI_TOKEN $NELI_RUN_KEY $NELI_ROLE" > {out}')
    context: dict[str, Any] = {"ti": ClaimTI(task), "dag": task.dag}
    task.execute(context)
    assert out.read_text().split() == ["7", "stock/2013-01-01", "stock_downstream"]
    assert fake.calls == [("stock_downstream", "stock/2013-01-01", 7)]
    assert context["neli_claim"]["token"] == 7
    assert "NELI_TOKEN" not in os.environ  # restored after the work


def test_a_fence_kills_the_stock_bash_processes_and_fails_the_task(
    tmp_path: Path, fake: Any
) -> None:
    import psutil

    pid_file = tmp_path / "pid"
    task = stock_bash(tmp_path, f"sleep 600 & echo $! > {pid_file}; wait")

    def watchdog() -> None:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        fake.fence()

    thread = threading.Thread(target=watchdog)
    thread.start()
    try:
        with pytest.raises(AirflowException, match="Fenced:.*leadership lost") as failed:
            task.execute({"ti": ClaimTI(task), "dag": task.dag})
        assert not isinstance(failed.value, AirflowFailException), "a fence fails one try"
    finally:
        thread.join()
    sleeper = int(pid_file.read_text())

    def gone() -> bool:
        try:
            return psutil.Process(sleeper).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    # the kill is a signal: under load the process can still show as running a moment after
    # the task has failed (seen once in CI); it must be gone within seconds
    deadline = time.monotonic() + 10
    while not gone():
        assert time.monotonic() < deadline, f"pid {sleeper} survived the fence"
        time.sleep(0.05)


def _gone(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_sigterm_stops_the_stock_bash_work_before_the_singleton_records_failed(
    tmp_path: Path, fake: Any
) -> None:
    # Airflow 3's task runner handles SIGTERM by calling on_kill() only
    # (docs/internals/airflow-development.md); a fenced task chains to that handler, then fails
    # the work, and everything the work started is gone before the singleton hears of the failure.
    import signal

    pid_file = tmp_path / "pid"
    task = stock_bash(tmp_path, f"trap '' TERM; sleep 600 & echo $! > {pid_file}; wait")
    airflow_calls: list[str] = []

    def airflow_handler(signum: int, frame: Any) -> None:
        airflow_calls.append("on_kill")
        task.on_kill()

    seen: list[bool] = []
    fake.when_failed = lambda: seen.append(_gone(int(pid_file.read_text())))

    def terminate() -> None:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, airflow_handler)
    thread = threading.Thread(target=terminate)
    thread.start()
    try:
        with pytest.raises(AirflowException, match="SIGTERM"):
            task.execute({"ti": ClaimTI(task), "dag": task.dag})
    finally:
        thread.join()
        restored = signal.signal(signal.SIGTERM, previous)
    assert airflow_calls == ["on_kill"]
    assert seen == [True], "the work still ran when the failure reached the singleton"
    # a try stopped by SIGTERM promises no retry: other regions may take the run over at once
    assert fake.retry_promises == [None]
    assert restored is airflow_handler  # the fenced run put Airflow's handler back


def test_a_task_function_gets_the_claim_as_its_neli_claim_parameter(
    tmp_path: Path, fake: Any
) -> None:
    bag = load(
        tmp_path,
        """
        @task
        def job(neli_claim=None):
            return {"token": neli_claim["token"], "run_key": neli_claim["run_key"]}
        gate >> job()
        """,
    )
    task = bag.dags["shape"].task_dict["job"]
    result = task.execute({"ti": ClaimTI(task), "dag": task.dag})
    assert result == {"token": 7, "run_key": "stock/2013-01-01"}
