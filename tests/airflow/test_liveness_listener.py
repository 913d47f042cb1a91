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


class StatsdListener:
    """A UDP socket standing in for the StatsD server of Airflow's ``[metrics]``."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []

    def read(self) -> list[str]:
        while True:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return self.lines
            self.lines += data.decode(errors="replace").splitlines()


def gauges(statsd: StatsdListener) -> list[int]:
    """The values of ``neli.liveness_announcer_up`` received so far, in order."""
    return [int(float(line.split(":", 1)[1].split("|", 1)[0])) for line in statsd.read()
            if line.split(":", 1)[0].endswith("neli.liveness_announcer_up")]


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
    statsd = StatsdListener()
    env.update({"AIRFLOW__METRICS__STATSD_ON": "True",
                "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                "AIRFLOW__METRICS__STATSD_PORT": str(statsd.port)})
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
        wait_for(lambda: gauges(statsd) and gauges(statsd)[-1] == 1, 60,
                 "neli.liveness_announcer_up = 1 sent to StatsD", scheduler, log)

        # The announcer dies while the scheduler lives: the supervisor starts it again, says
        # so in the scheduler's log, and the gauge goes 0, then 1 again.
        first = announcers[0]
        first.kill()
        first.wait(10)
        wait_for(lambda: "no announcer runs for deployment 'eu-west-1'" in log.read_text(), 30,
                 "an ERROR about the dead announcer", scheduler, log)

        def restarted() -> list[psutil.Process]:
            return [p for p in psutil.Process(scheduler.pid).children(recursive=True)
                    if "neli_orchestrate.liveness" in " ".join(p.cmdline())
                    and p.pid != first.pid]

        wait_for(lambda: len(restarted()) == 1, 30, "the announcer started again", scheduler,
                 log)
        announcers = restarted()
        wait_for(lambda: reader.read("eu-west-1").state is Liveness.ALIVE
                 and reader.read("eu-west-1").members == 1, 60,
                 "the deployment alive through the new announcer", scheduler, log)
        assert "started again" in log.read_text()
        wait_for(lambda: gauges(statsd)[-1:] == [1] and 0 in gauges(statsd), 30,
                 "the gauge 0 while it was dead, then 1", scheduler, log)
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
        # the child supervises the plain announcer (no Airflow in memory), its own child
        [announcer] = [p for p in psutil.Process(child.pid).children()
                       if "neli_orchestrate.liveness" in " ".join(p.cmdline())]
    finally:
        manager.hook.before_stopping(component=job)
    assert child.poll() is not None and listener._children == []
    gone, alive = psutil.wait_procs([announcer], timeout=10)  # stopped with its supervisor
    assert not alive, alive


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


class _Child:
    """A stand-in announcer process: alive until ``dies_at`` on the fake clock."""

    def __init__(self, clock: list[float], lives: float) -> None:
        self.clock, self.dies_at, self.returncode = clock, clock[0] + lives, None
        self.pid = 4242

    def poll(self) -> int | None:
        if self.returncode is None and self.clock[0] >= self.dies_at:
            self.returncode = 1
        return self.returncode

    def terminate(self) -> None:
        self.returncode = -15

    def wait(self, timeout: float | None = None) -> int | None:
        return self.returncode


def test_an_announcer_that_cannot_run_is_restarted_with_backoff_an_error_each_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Deterministic (fake clock): every announcer dies at once (Kafka refuses it, say). The
    supervisor starts it again with backoff 1, 2, 4, ... 30 s, logs an ERROR at once and then
    once a minute, and the gauge says 0 while none runs."""
    import logging

    from neli_orchestrate.airflow.liveness import AnnouncerSupervisor
    from neli_orchestrate.liveness import AnnouncerConfig

    clock = [0.0]
    starts: list[float] = []
    sent: list[tuple[float, float]] = []
    config = AnnouncerConfig(bootstrap_servers="127.0.0.1:9", namespace="acme",
                             deployment="us-east-1", component="scheduler")

    def start() -> _Child:
        starts.append(clock[0])
        return _Child(clock, lives=0.2)

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    supervisor = AnnouncerSupervisor(
        config, parent=1, start=start, gauge=lambda v: sent.append((clock[0], v)),
        clock=lambda: clock[0], sleep=sleep, parent_alive=lambda: clock[0] < 300)
    with caplog.at_level(logging.WARNING, logger="neli_orchestrate.airflow.liveness"):
        supervisor.run()
    pauses = [int(r.getMessage().split("again in ")[1].split(" s")[0]) for r in caplog.records
              if "starting it again in" in r.getMessage()]
    assert pauses[:7] == [1, 2, 4, 8, 16, 30, 30], pauses
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert all(pause <= gap <= pause + 1 for pause, gap in zip(pauses, gaps, strict=False)), gaps
    errors = [r for r in caplog.records if "no announcer runs" in r.getMessage()]
    times = [float(r.getMessage().split("down since ")[1].split(" s")[0]) for r in errors]
    assert len(errors) == 5, [r.getMessage() for r in errors]  # at once, then every minute
    assert all("us-east-1" in r.getMessage() for r in errors)
    assert times == [0, 60, 120, 180, 240], times
    assert sent[-1][1] == 0.0  # stopped: 0
    assert {v for _, v in sent} == {0.0, 1.0}
