"""A real ``airflow scheduler`` announces its deployment's liveness; kill -9 makes it GONE.

The provider's plugin registers the listener and the announcer is on by default, so the
scheduler needs nothing but the ``neli`` connection (which may come later: the announcer child
retries). Asserted on what Kafka's coordinator says, with deadlines, never on sleeps.

The listener runs nothing in the scheduler: ``on_starting``, called from Airflow's own
``_run_scheduler_job`` as the scheduler does, starts no thread (a thread of ours alive while
the scheduler forks its executor workers hung a task in CI) and only spawns a child process.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from confluent_kafka.admin import NewTopic

from neli_orchestrate.liveness import Liveness, LivenessReader

pytestmark = [pytest.mark.airflow, pytest.mark.kafka]

REPO = Path(__file__).resolve().parents[2]


def wait_for(condition: Callable[[], bool], deadline_s: float, what: str,
             proc: subprocess.Popen[bytes] | None = None, log: Path | None = None) -> None:
    end = time.monotonic() + deadline_s
    while not condition():
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log else ""
            raise AssertionError(f"{what}: the scheduler exited ({proc.returncode}):\n{tail}")
        if time.monotonic() > end:
            tail = log.read_text()[-3000:] if log else ""
            raise AssertionError(f"{what}: not within {deadline_s} s\n{tail}")
        time.sleep(0.1)


def test_the_scheduler_keeps_its_deployment_alive_and_a_killed_one_is_gone_after_the_timeout(
    kafka_broker, kafka_admin, tmp_path: Path
) -> None:
    from cryptography.fernet import Fernet

    ns = "al" + uuid.uuid4().hex[:8]
    kafka_admin.create_topics([NewTopic(f"{ns}.neli", 1, 1)])[f"{ns}.neli"].result(30)
    home = tmp_path / "airflow"
    (home / "dags").mkdir(parents=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
    }
    env.pop("AIRFLOW__NELI__LIVENESS", None)  # the default: on
    env.pop("AIRFLOW_CONN_NELI_DEFAULT", None)
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    log = tmp_path / "scheduler.log"
    with open(log, "wb") as out:
        scheduler = subprocess.Popen([sys.executable, "-m", "airflow", "scheduler"], env=env,
                                     stdout=out, stderr=subprocess.STDOUT)
    reader = LivenessReader(kafka_admin, ns)
    announcers: list[psutil.Process] = []
    try:
        # No connection yet (as when it is created after the scheduler starts): the announcer
        # child says so and retries; the connection, added to the database, is then found.
        wait_for(lambda: "cannot read connection 'neli_default'" in log.read_text(), 180,
                 "the announcer child retrying the connection", scheduler, log)
        conn = {"conn_type": "neli", "host": kafka_broker,
                "extra": {"deployment": "eu-west-1", "namespace": ns}}
        subprocess.run([sys.executable, "-m", "airflow", "connections", "add", "neli_default",
                        "--conn-json", json.dumps(conn)], env=env, check=True,
                       stdout=subprocess.DEVNULL, timeout=120)
        wait_for(lambda: reader.read("eu-west-1").state is Liveness.ALIVE, 60,
                 "the scheduler's deployment alive", scheduler, log)
        wait_for(lambda: reader.read("eu-west-1", details=True).timeout is not None, 30,
                 "the announcement recorded", scheduler, log)
        seen = reader.read("eu-west-1", details=True)
        assert seen.members == 1 and seen.timeout == 10.0  # SingletonConfig.liveness_timeout
        announcers = [p for p in psutil.Process(scheduler.pid).children(recursive=True)
                      if "neli_orchestrate.liveness" in " ".join(p.cmdline())]
        assert len(announcers) == 1
    finally:
        # its processes now: after the crash init adopts them, and they are no child of ours
        try:
            family = psutil.Process(scheduler.pid).children(recursive=True)
        except psutil.NoSuchProcess:  # it exited already (wait_for reports that)
            family = []
        os.kill(scheduler.pid, signal.SIGKILL)  # a crash: no before_stopping
        scheduler.wait(30)
    # The announcer notices its parent is gone and exits; Kafka expires the member later.
    gone, alive = psutil.wait_procs(announcers, timeout=10)
    assert not alive, f"announcer left behind: {alive}"
    wait_for(lambda: reader.read("eu-west-1").gone, 10 + 20, "gone after the timeout")
    for proc in family:  # the scheduler's LocalExecutor workers, log server etc.
        if proc.pid not in {a.pid for a in announcers}:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                continue


class _Stop(Exception):
    """Raised by the stand-in job runner: the Job exists, the scheduler goes no further."""


def test_on_starting_in_the_scheduler_starts_no_thread_only_a_child_that_announces(
    kafka_broker: str, kafka_admin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Airflow's own ``_run_scheduler_job`` constructs the Job (and so calls the listener),
    as ``airflow scheduler`` does; only the job runner is a stand-in that stops there. No
    thread may be started (a fork while it holds a lock hangs the forked task), and the child
    alone reads the connection and joins Kafka; ``before_stopping`` stops it."""
    from airflow.cli.commands import scheduler_command
    from airflow.listeners.listener import get_listener_manager

    from neli_orchestrate.airflow import liveness as listener

    ns = "al" + uuid.uuid4().hex[:8]
    kafka_admin.create_topics([NewTopic(f"{ns}.neli", 1, 1)])[f"{ns}.neli"].result(30)
    monkeypatch.delenv("AIRFLOW__NELI__LIVENESS", raising=False)  # the default: on
    monkeypatch.setenv("AIRFLOW_CONN_NELI_DEFAULT", json.dumps(
        {"conn_type": "neli", "host": kafka_broker,
         "extra": {"deployment": "us-east-1", "namespace": ns}}))
    manager = get_listener_manager()
    assert manager.pm.is_registered(listener), "the provider's plugin registers the listener"

    class Runner:
        def __init__(self, job: object, **_: object) -> None:
            raise _Stop(job)

    monkeypatch.setattr(scheduler_command, "SchedulerJobRunner", Runner)
    monkeypatch.setattr(scheduler_command, "set_component_mp_start_method", lambda _: None)
    started: list[str] = []
    real_start = threading.Thread.start

    def recording_start(thread: threading.Thread) -> None:
        started.append(thread.name)
        real_start(thread)

    before = {t.ident for t in threading.enumerate()}
    monkeypatch.setattr(threading.Thread, "start", recording_start)
    with pytest.raises(_Stop) as stopped:
        scheduler_command._run_scheduler_job(
            argparse.Namespace(num_runs=-1, only_idle=False, skip_serve_logs=True))
    monkeypatch.setattr(threading.Thread, "start", real_start)
    assert started == [], f"on_starting started threads in the scheduler: {started}"
    assert [t.name for t in threading.enumerate() if t.ident not in before] == []
    job = stopped.value.args[0]
    children = list(listener._children)
    assert len(children) == 1
    child = children[0]
    assert psutil.Process(child.pid).ppid() == os.getpid()
    try:
        reader = LivenessReader(kafka_admin, ns)
        wait_for(lambda: reader.read("us-east-1").state is Liveness.ALIVE, 60,
                 "the child's announcement")
        # the child replaced itself by the plain announcer (no Airflow in memory), same pid
        assert "neli_orchestrate.liveness" in " ".join(psutil.Process(child.pid).cmdline())
    finally:
        manager.hook.before_stopping(component=job)
    assert child.poll() is not None and listener._children == []


def test_no_announcer_for_a_task_a_job_outside_the_cli_or_when_turned_off(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.cli.commands import scheduler_command
    from airflow.jobs.job import Job
    from airflow.sdk.execution_time.task_runner import TaskRunnerMarker

    from neli_orchestrate.airflow import liveness as listener

    listener.on_starting(TaskRunnerMarker())
    Job()  # constructed by a program, not by `airflow scheduler`
    assert listener._children == []

    class Runner:
        def __init__(self, job: object, **_: object) -> None:
            raise _Stop(job)

    monkeypatch.setattr(scheduler_command, "SchedulerJobRunner", Runner)
    monkeypatch.setattr(scheduler_command, "set_component_mp_start_method", lambda _: None)
    for off in ("False", "0", "off"):
        monkeypatch.setenv("AIRFLOW__NELI__LIVENESS", off)
        with pytest.raises(_Stop):
            scheduler_command._run_scheduler_job(
                argparse.Namespace(num_runs=-1, only_idle=False, skip_serve_logs=True))
        assert listener._children == []
    monkeypatch.setenv("AIRFLOW__NELI__LIVENESS", "True")
    monkeypatch.setenv("AIRFLOW__NELI__LIVENESS_COMPONENTS", "triggerer")
    with pytest.raises(_Stop):
        scheduler_command._run_scheduler_job(
            argparse.Namespace(num_runs=-1, only_idle=False, skip_serve_logs=True))
    assert listener._children == []
