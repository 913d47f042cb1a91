"""A real ``airflow scheduler`` announces its deployment's liveness; kill -9 makes it GONE.

The provider's plugin registers the listener, so the scheduler needs nothing but the ``neli``
connection. Asserted on what Kafka's coordinator says, with deadlines, never on sleeps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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
        "AIRFLOW__NELI__LIVENESS": "True",  # opt-in (docs/guarantees.md)
        "AIRFLOW_CONN_NELI_DEFAULT": (
            f'{{"conn_type": "neli", "host": "{kafka_broker}", '
            f'"extra": {{"deployment": "eu-west-1", "namespace": "{ns}"}}}}'),
    }
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    log = tmp_path / "scheduler.log"
    with open(log, "wb") as out:
        scheduler = subprocess.Popen([sys.executable, "-m", "airflow", "scheduler"], env=env,
                                     stdout=out, stderr=subprocess.STDOUT)
    reader = LivenessReader(kafka_admin, ns)
    announcers: list[psutil.Process] = []
    try:
        wait_for(lambda: reader.read("eu-west-1").state is Liveness.ALIVE, 180,
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
