"""A JVM application in cluster deploy mode on a real Spark standalone cluster, behind the gate.

Real components: the session's Spark standalone cluster (``spark_cluster``: master + worker from
the pyspark wheel, REST submission server on), the session's Kafka broker, and Airflow 3.3
(``airflow dags test``: the Task SDK's task runner) running a stock ``SparkSubmitOperator`` with
``deploy_mode="cluster"`` behind a ``LeaderGateOperator``. The driver is a small Java main,
compiled here with ``javac``, that the worker runs as a cluster-mode driver (no SparkContext:
what matters is where the driver runs and when it ends).

- COMPLETED only after the driver finished: the ledger's COMPLETED record is later than the
  driver's own last write (causal order, not a timing guess), and the master shows FINISHED.
- A fence mid-job (the task process frozen past its session, another deployment takes over)
  kills the driver on the cluster: the master shows it KILLED, the try fails as fenced and its
  log shows the kill confirmed by the master.
- The same fence while the master's REST server is unreachable from the task: the try fails
  naming the driver as possibly still running (and the master shows it still RUNNING), and
  Airflow's metrics count it (``neli.spark_unconfirmed_kill``).
- The PySpark nycflights job (dags/nycflights_daily.py itself) with ``--master spark://…`` in
  client mode: executors on the worker, the master lists the application FINISHED, COMPLETED
  recorded under the token of the published output, after it was published.
- Reset + clear of a completed date (same DAG run, so the resumable job's stored driver id is
  still there): a new driver under the new, larger token, COMPLETED under that token.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dagtest_runner import run_dag, start_dag  # noqa: E402

from neli_orchestrate.ledger.record import RunState  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.airflow, pytest.mark.kafka]

JAVA_MAIN = """
import java.nio.file.*;

/** A cluster-mode driver: announce, work for N seconds, write the finish time, exit. */
public class NeliClusterDriver {
    public static void main(String[] args) throws Exception {
        Path dir = Paths.get(args[0]);
        long seconds = Long.parseLong(args[1]);
        String token = System.getProperty("spark.neli.token", "none");
        Files.createDirectories(dir);
        Files.write(dir.resolve(token + ".started"), "started".getBytes());
        long end = System.currentTimeMillis() + seconds * 1000;
        while (System.currentTimeMillis() < end) {
            Thread.sleep(100);
        }
        Files.write(dir.resolve(token + ".finished"),
                    Long.toString(System.currentTimeMillis()).getBytes());
    }
}
"""

DAG = """
import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG

from neli_orchestrate.airflow import LeaderGateOperator

with DAG("{dag_id}", schedule=None, start_date=pendulum.datetime(2013, 1, 1, tz="UTC")):
    gate = LeaderGateOperator(task_id="gate", role="{role}", poke_interval=1,
                              acquire_timeout=30, run_acquire_timeout=30)
    gate >> SparkSubmitOperator(
        task_id="job", conn_id="spark_cluster", application="{jar}",
        java_class="NeliClusterDriver", deploy_mode="cluster", driver_memory="512m",
        # spark-submit submits through the master's REST server only when told to
        conf={{"spark.master.rest.enabled": "true"}},
        application_args=["{out}", "{seconds}"], status_poll_interval=1, retries=0)
"""

RUN_KEY = "{dag_id}/2013-01-01T00:00:00+00:00"


@pytest.fixture(scope="module")
def driver_jar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("java")
    (src / "NeliClusterDriver.java").write_text(JAVA_MAIN)
    subprocess.run(["javac", "--release", "17", "NeliClusterDriver.java"], cwd=src, check=True)
    subprocess.run(["jar", "cf", "neli-cluster-driver.jar", "NeliClusterDriver.class"], cwd=src,
                   check=True)
    return src / "neli-cluster-driver.jar"


def neli_connection(bootstrap: str, namespace: str, deployment: str) -> dict[str, Any]:
    return {"conn_type": "neli", "host": bootstrap, "extra": {
        # a 3 s lease, not the fast profile's 1 s: a Spark driver JVM and Airflow share the
        # two cores with a second test worker, and a lapsed lease fences the task before its
        # job starts (membership-unconfirmed)
        "deployment": deployment, "namespace": namespace, "profile": "fast",
        "session_timeout": 9, "heartbeat_timeout": 3, "acquire_timeout": 15,
        "handoff_timeout": 10}}


def spark_connection(rest_port: int) -> dict[str, Any]:
    return {"conn_type": "spark", "host": f"spark://127.0.0.1:{rest_port}",
            "extra": {"deploy-mode": "cluster", "rest-port": rest_port}}


def singleton(connection: dict[str, Any]) -> Any:
    from airflow.sdk import Connection

    from neli_orchestrate.airflow.hooks.neli import NeliHook

    conn = Connection(conn_id="neli_test", conn_type="neli", host=connection["host"],
                      extra=json.dumps(connection["extra"]))
    return NeliHook("neli_test", connection=conn).get_singleton()


@pytest.fixture
def namespace(kafka_broker: str, claim_now: Callable[..., Any]) -> str:
    # a claim warms the broker's group and transaction coordinators (see tests/airflow)
    ns = f"sc{uuid.uuid4().hex[:8]}"
    with singleton(neli_connection(kafka_broker, ns, "warmup")) as s:
        reservation = claim_now(s, "warmup", "warmup", timeout=120)
        s.execute(reservation.claim, lambda run: None)
    return ns


def dag_source(dag_id: str, jar: Path, out: Path, seconds: int) -> str:
    return DAG.format(dag_id=dag_id, role=dag_id, jar=jar, out=out, seconds=seconds)


def spark_env() -> dict[str, str]:
    from neli_orchestrate.spark.conf import spark_home

    return {"SPARK_HOME": str(spark_home())}


def failure(output: str) -> str:
    """The lines of a dags test output that say what went wrong."""
    keep = [line for line in output.splitlines()
            if any(w in line for w in ("error", "Error", "Exception", "Fenced", "driver-"))]
    return "\n".join(keep[-60:])


def driver_ids(output: str) -> list[str]:
    return sorted(set(re.findall(r"driver-\d{14}-\d{4}", output)))


def test_cluster_mode_job_is_completed_only_after_its_driver_finished(
    tmp_path: Path, spark_cluster: Any, kafka_broker: str, namespace: str, driver_jar: Path
) -> None:
    out = tmp_path / "out"
    result = run_dag(
        tmp_path, dag_source("cluster_done", driver_jar, out, 4), "cluster_done",
        connections={"neli_default": neli_connection(kafka_broker, namespace, "us-east-1"),
                     "spark_cluster": spark_connection(spark_cluster.rest_port)},
        env=spark_env())
    assert result.returncode == 0, failure(result.output)
    (driver,) = driver_ids(result.output)
    assert spark_cluster.driver_state(driver) == "FINISHED"
    (finished,) = out.glob("*.finished")
    finished_at = int(finished.read_text()) / 1000
    with singleton(neli_connection(kafka_broker, namespace, "us-east-1")) as s:
        record = s.status("cluster_done", RUN_KEY.format(dag_id="cluster_done"))
    assert record is not None and record.state is RunState.COMPLETED, record
    assert finished.name == f"{record.token}.finished"  # the driver ran under this claim
    assert record.at > finished_at, (record.at, finished_at)


def wait_for(path: Path, pattern: str, proc: subprocess.Popen[str], log: Path,
             timeout: float = 180) -> Path:
    deadline = time.monotonic() + timeout
    while True:
        found = list(path.glob(pattern))
        if found:
            return found[0]
        assert proc.poll() is None, log.read_text()[-5000:]
        assert time.monotonic() < deadline, log.read_text()[-5000:]
        time.sleep(0.2)


def take_over(kafka_broker: str, namespace: str, role: str, token: int,
              proc: subprocess.Popen[str]) -> int:
    """Freeze the task process past its session; another deployment takes the run over."""
    proc.send_signal(signal.SIGSTOP)
    try:
        with singleton(neli_connection(kafka_broker, namespace, "eu-west-1")) as other:
            deadline = time.monotonic() + 120
            while True:
                assert time.monotonic() < deadline, "eu-west-1 never took the run over"
                reservation = other.reserve(role, RUN_KEY.format(dag_id=role))
                if reservation.should_run:
                    break
                time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGCONT)
    assert reservation.token > token
    return int(reservation.token)


def test_a_fence_kills_the_driver_on_the_cluster_and_confirms_it(
    tmp_path: Path, spark_cluster: Any, kafka_broker: str, namespace: str, driver_jar: Path
) -> None:
    out = tmp_path / "out"
    proc = start_dag(
        tmp_path, dag_source("cluster_fence", driver_jar, out, 600), "cluster_fence",
        connections={"neli_default": neli_connection(kafka_broker, namespace, "us-east-1"),
                     "spark_cluster": spark_connection(spark_cluster.rest_port)},
        env=spark_env())
    log = tmp_path / "dags_test.log"
    try:
        started = wait_for(out, "*.started", proc, log)
        token = int(started.name.split(".")[0])
        (driver,) = driver_ids(log.read_text())
        assert spark_cluster.driver_state(driver) == "RUNNING"
        take_over(kafka_broker, namespace, "cluster_fence", token, proc)
        proc.wait(180)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert "Fenced" in output, output[-5000:]
    assert spark_cluster.driver_state(driver) == "KILLED"
    assert f"standalone application {driver} on" in output and "reports KILLED" in output
    assert not list(out.glob("*.finished"))


class CuttableProxy:
    """A TCP proxy to the master's REST port that can be cut (connections refused after)."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.cut = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.cut.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if self.cut.is_set():
                client.close()
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        """From now on the master is unreachable through this port (connection refused)."""
        self.cut.set()
        self.server.close()


class Statsd:
    """A StatsD server on loopback UDP: every line Airflow's ``Stats`` sent (a reader thread,
    so a burst of datagrams never overflows the socket's buffer)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.lines: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._receive, daemon=True)
        self.thread.start()

    def _receive(self) -> None:
        while not self.stop.is_set():
            try:
                self.lines += self.sock.recv(65535).decode(errors="replace").splitlines()
            except TimeoutError:
                continue

    def env(self) -> dict[str, str]:
        return {"AIRFLOW__METRICS__STATSD_ON": "True",
                "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                "AIRFLOW__METRICS__STATSD_PORT": str(self.sock.getsockname()[1]),
                "AIRFLOW__METRICS__STATSD_PREFIX": "airflow"}

    def count(self, name: str, deadline: float = 10.0) -> int:
        """The counter ``name``'s total, once it was seen (or after ``deadline`` seconds)."""
        end = time.monotonic() + deadline
        while True:
            total = sum(int(line.split(":", 1)[1].split("|", 1)[0]) for line in list(self.lines)
                        if line.split(":", 1)[0] == name and line.endswith("|c"))
            if total or time.monotonic() > end:
                return total
            time.sleep(0.1)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def statsd() -> Iterator[Statsd]:
    receiver = Statsd()
    yield receiver
    receiver.close()


@pytest.fixture
def rest_proxy(spark_cluster: Any) -> Iterator[CuttableProxy]:
    proxy = CuttableProxy(spark_cluster.rest_port)
    yield proxy
    proxy.close()


def test_a_fence_that_cannot_reach_the_master_says_the_driver_may_still_run(
    tmp_path: Path, spark_cluster: Any, kafka_broker: str, namespace: str, driver_jar: Path,
    rest_proxy: CuttableProxy, statsd: Statsd
) -> None:
    out = tmp_path / "out"
    proc = start_dag(
        tmp_path, dag_source("cluster_cut", driver_jar, out, 600), "cluster_cut",
        connections={"neli_default": neli_connection(kafka_broker, namespace, "us-east-1"),
                     "spark_cluster": spark_connection(rest_proxy.port)},
        env={**spark_env(), **statsd.env(), "NELI_SPARK_KILL_CONFIRM_TIMEOUT": "5"})
    log = tmp_path / "dags_test.log"
    driver = None
    try:
        started = wait_for(out, "*.started", proc, log)
        token = int(started.name.split(".")[0])
        (driver,) = driver_ids(log.read_text())
        rest_proxy.close()  # the region is cut off from the cluster manager
        take_over(kafka_broker, namespace, "cluster_cut", token, proc)
        proc.wait(240)
        output = log.read_text()
        assert "Fenced" in output, output[-5000:]
        assert f"could not confirm that standalone application {driver}" in output, \
            output[-5000:]
        assert "may still be running" in output
        # the report is true: the driver still runs on the cluster
        assert spark_cluster.driver_state(driver) == "RUNNING"
        # and it is counted where the deployment's metrics go: the fenced member can no longer
        # write the ledger (the successor's transactional producer fenced it)
        assert statsd.count("airflow.neli.spark_unconfirmed_kill") == 1, statsd.lines[-40:]
    finally:
        if proc.poll() is None:
            proc.kill()
        if driver is not None:
            spark_cluster.kill_driver(driver)


def wait_for_record(kafka_broker: str, namespace: str, role: str,
                    check: Any, timeout: float = 60) -> Any:
    with singleton(neli_connection(kafka_broker, namespace, "observer")) as s:
        deadline = time.monotonic() + timeout
        while True:
            record = s.status(role, RUN_KEY.format(dag_id=role))
            if record is not None and check(record):
                return record
            assert time.monotonic() < deadline, record
            time.sleep(0.3)


def test_a_successor_stops_the_driver_a_frozen_region_left_running_before_it_submits(
    tmp_path: Path, spark_cluster: Any, kafka_broker: str, namespace: str, driver_jar: Path
) -> None:
    """us-east-1 submits a cluster-mode driver and names it in the ledger, then freezes past
    its session (it can stop nothing, as if cut off); eu-west-1's try inherits the driver,
    kills it on the cluster and confirms it, and only then submits its own."""
    out = tmp_path / "out"
    east = tmp_path / "east"
    east.mkdir()
    role = "cluster_successor"
    proc = start_dag(
        east, dag_source(role, driver_jar, out, 600), role,
        connections={"neli_default": neli_connection(kafka_broker, namespace, "us-east-1"),
                     "spark_cluster": spark_connection(spark_cluster.rest_port)},
        env=spark_env())
    log = east / "dags_test.log"
    old = None
    try:
        started = wait_for(out, "*.started", proc, log)
        token = int(started.name.split(".")[0])
        (old,) = driver_ids(log.read_text())
        named = wait_for_record(kafka_broker, namespace, role,
                                lambda r: old in r.application)
        assert named.state is RunState.RUNNING and named.token == token
        proc.send_signal(signal.SIGSTOP)  # us-east-1 stops nothing from now on
        result = run_dag(
            tmp_path / "west", dag_source(role, driver_jar, out, 2), role,
            connections={"neli_default": neli_connection(kafka_broker, namespace, "eu-west-1"),
                         "spark_cluster": spark_connection(spark_cluster.rest_port)},
            env=spark_env())
        assert result.returncode == 0, failure(result.output)
        # the earlier token's driver was killed on the cluster, and confirmed, before the
        # successor submitted its own
        assert spark_cluster.driver_state(old) == "KILLED"
        output = result.output
        stopped = output.index(f"standalone application {old} on")
        (new,) = [d for d in driver_ids(output) if d != old]
        assert "started under an earlier token, is stopped (KILLED)" in output, \
            failure(output)
        assert stopped < output.index(new), "submitted before the earlier driver was stopped"
        record = wait_for_record(kafka_broker, namespace, role,
                                 lambda r: r.state is RunState.COMPLETED)
        assert record.token > token and record.unstopped == () and new in record.application
        assert (out / f"{record.token}.finished").exists()
        assert not (out / f"{token}.finished").exists()
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait(30)
        if old is not None:
            spark_cluster.kill_driver(old)


TIMEOUT_PROBE = """
import json
import urllib.request
from pathlib import Path

from neli_orchestrate.ledger.kafka import KafkaLedgerWriter

_write = KafkaLedgerWriter.write


def write(self, record):
    # At the moment a record is written, what does the master say about every driver?
    with urllib.request.urlopen("{json_url}", timeout=10) as response:
        state = json.loads(response.read().decode())
    drivers = {{d["id"]: d["state"]
               for d in state["activedrivers"] + state["completeddrivers"]}}
    with Path("{probe}").open("a") as probe:
        probe.write(json.dumps({{"record": str(record.state), "drivers": drivers}}) + "\\n")
    return _write(self, record)


KafkaLedgerWriter.write = write
"""


def test_an_execution_timeout_kills_the_driver_before_failed_is_recorded(
    tmp_path: Path, spark_cluster: Any, kafka_broker: str, namespace: str, driver_jar: Path
) -> None:
    out, probe = tmp_path / "out", tmp_path / "probe.jsonl"
    source = dag_source("cluster_timeout", driver_jar, out, 600).replace(
        "retries=0)", "retries=0, execution_timeout=__import__('datetime').timedelta(seconds=45))")
    source += TIMEOUT_PROBE.format(json_url=spark_cluster.json_url, probe=probe)
    result = run_dag(
        tmp_path, source, "cluster_timeout",
        connections={"neli_default": neli_connection(kafka_broker, namespace, "us-east-1"),
                     "spark_cluster": spark_connection(spark_cluster.rest_port)},
        env=spark_env())
    assert "AirflowTaskTimeout" in result.output, failure(result.output)
    assert list(out.glob("*.started")), "the driver never started before the timeout"
    (driver,) = driver_ids(result.output)
    notes = [json.loads(line) for line in probe.read_text().splitlines()]
    failed = [n for n in notes if n["record"] == "FAILED"]
    assert failed, notes
    # Whenever FAILED was written, the master already showed the driver killed.
    assert all(n["drivers"][driver] == "KILLED" for n in failed), failed
    assert not list(out.glob("*.finished"))


def airflow(environ: dict[str, str], *args: str, timeout: float = 300) -> str:
    """Run ``airflow ARGS`` in the home ``environ`` names; its output (fails the test on error)."""
    from integration.regions.regions import AIRFLOW

    result = subprocess.run([AIRFLOW, *args], env=environ, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=timeout)
    assert result.returncode == 0, failure(result.stdout) or result.stdout[-5000:]
    return result.stdout


def test_reset_and_clear_of_a_completed_date_submits_a_new_application_with_the_new_token(
    tmp_path: Path, spark_cluster: Any, kafka_broker: str, namespace: str, driver_jar: Path
) -> None:
    # What docs/guide/airflow.md tells users to do to run a completed date again: reset the run key
    # (neli-orchestrate ledger reset), then clear the gate and the task in the same DAG run. The
    # stock SparkSubmitOperator is a resumable job that keeps its driver id in the DAG run's
    # task_state_store across a clear; the new claim must not resume it (nor return at once for
    # the old, FINISHED driver) but submit a new driver that carries the new token.
    from dagtest_runner import dag_command

    dag_id = "cluster_reset"
    out = tmp_path / "out"
    cmd, environ = dag_command(
        tmp_path, dag_source(dag_id, driver_jar, out, 1), dag_id,
        connections={"neli_default": neli_connection(kafka_broker, namespace, "us-east-1"),
                     "spark_cluster": spark_connection(spark_cluster.rest_port)},
        env=spark_env())
    first = airflow(environ, *cmd[1:])
    (first_driver,) = driver_ids(first)
    run_key = RUN_KEY.format(dag_id=dag_id)
    with singleton(neli_connection(kafka_broker, namespace, "us-east-1")) as s:
        done = s.status(dag_id, run_key)
    assert done is not None and done.state is RunState.COMPLETED, done
    assert (out / f"{done.token}.finished").exists()

    reset = subprocess.run(
        [sys.executable, "-m", "neli_orchestrate.cli", "ledger", "reset", dag_id, run_key,
         "-b", kafka_broker, "-n", namespace, "--profile", "fast", "--deployment", "us-east-1",
         "--reason", "test: run the date again", "--json"],
        capture_output=True, text=True, timeout=120)
    assert reset.returncode == 0, reset.stderr
    assert json.loads(reset.stdout)["token"] > done.token
    airflow(environ, "tasks", "clear", "--yes", "--task-regex", "^(gate|job)$", dag_id)
    airflow(environ, "tasks", "test", dag_id, "gate", "2013-01-01")
    second = airflow(environ, "tasks", "test", dag_id, "job", "2013-01-01")

    with singleton(neli_connection(kafka_broker, namespace, "us-east-1")) as s:
        again = s.status(dag_id, run_key)
    assert again is not None and again.state is RunState.COMPLETED, again
    assert again.token > json.loads(reset.stdout)["token"] > done.token
    (second_driver,) = driver_ids(second)
    assert second_driver != first_driver  # a new application, not the resumed old one
    assert spark_cluster.driver_state(second_driver) == "FINISHED"
    # the new driver ran under the new claim's token (spark.neli.token), and finished
    assert (out / f"{again.token}.finished").exists(), sorted(p.name for p in out.iterdir())


NYCFLIGHTS_DAG = Path(__file__).resolve().parents[2] / "dags" / "nycflights_daily.py"


def test_the_pyspark_nycflights_job_runs_on_the_cluster_in_client_mode_behind_the_gate(
    tmp_path: Path, spark_cluster: Any, kafka_broker: str, namespace: str
) -> None:
    # The example DAG itself (dags/nycflights_daily.py: deferrable gate, stock
    # SparkSubmitOperator) with spark_default = the cluster's master: the driver runs in the
    # task's spark-submit, the executors on the worker.
    from neli_orchestrate.spark import TokenCommitGuard
    from neli_orchestrate.spark.commit import MARKER_NAME

    out = tmp_path / "nycflights"
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "jobs").symlink_to(NYCFLIGHTS_DAG.parent / "jobs")
    result = run_dag(
        tmp_path, NYCFLIGHTS_DAG.read_text(), "nycflights_daily",
        connections={"neli_default": neli_connection(kafka_broker, namespace, "us-east-1"),
                     "spark_default": {"conn_type": "spark", "host": spark_cluster.master_url}},
        env={**spark_env(), "AIRFLOW_VAR_NYCFLIGHTS_OUTPUT": str(out)}, timeout=600)
    assert result.returncode == 0, failure(result.output)
    with singleton(neli_connection(kafka_broker, namespace, "us-east-1")) as s:
        record = s.status("nycflights_daily/2013-01-01",
                          RUN_KEY.format(dag_id="nycflights_daily"))
    assert record is not None and record.state is RunState.COMPLETED, record
    marker = TokenCommitGuard(out, partition_column="date").committed("2013-01-01")
    assert marker is not None and marker.token == record.token
    published = Path(marker.path)
    assert list(published.glob("*.parquet"))
    # COMPLETED was recorded after the output was published (marker written, then renamed in)
    assert record.at > max((published / MARKER_NAME).stat().st_mtime, published.stat().st_ctime)
    # the application ran on the cluster: the master lists it finished, with executors there;
    # one application per try of the Spark task (a try that fails, for one fenced when its
    # lease lapses on a loaded machine, is retried by Airflow and submits again), and the
    # output published above is the one of the claim recorded COMPLETED
    with sqlite3.connect(tmp_path / "airflow_home" / "airflow.db") as db:
        ((tries,),) = db.execute("SELECT try_number FROM task_instance "
                                 "WHERE task_id = 'daily_performance'").fetchall()
    apps = [a for a in spark_cluster.state().get("completedapps", [])
            if a.get("name") == "nycflights_daily 2013-01-01"]  # the job's appName
    assert [a["state"] for a in apps] == ["FINISHED"] * tries, \
        (spark_cluster.state(), failure(result.output))
    # ... and its executors ran on the worker (their directory in the worker's work dir)
    assert list((spark_cluster.workdir / "work" / apps[-1]["id"]).glob("*/stderr"))
    assert "nycflights 2013-01-01" in result.output  # the report task read the output back
