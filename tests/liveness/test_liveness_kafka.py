"""Deployment liveness against the real broker: the coordinator's verdict, not a clock's."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest

from neli_orchestrate.liveness import (
    AnnouncerConfig,
    Liveness,
    LivenessAnnouncer,
    LivenessReader,
    liveness_group,
)

pytestmark = pytest.mark.kafka


def wait_for(condition: Callable[[], bool], deadline_s: float, what: str) -> float:
    """Seconds until ``condition()`` held; fails the test past ``deadline_s``."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < deadline_s, f"{what}: not within {deadline_s} s"
        time.sleep(0.05)
    return time.monotonic() - start


@pytest.fixture
def namespace(kafka_admin) -> str:
    from confluent_kafka.admin import NewTopic

    ns = "lv" + uuid.uuid4().hex[:8]
    kafka_admin.create_topics([NewTopic(f"{ns}.neli", 1, 1)])[f"{ns}.neli"].result(30)
    return ns


def announcer(kafka_broker: str, namespace: str, deployment: str,
              timeout: float = 1.0) -> LivenessAnnouncer:
    return LivenessAnnouncer(AnnouncerConfig(bootstrap_servers=kafka_broker,
                                             namespace=namespace, deployment=deployment,
                                             timeout=timeout, poll_interval=0.1,
                                             component="test"))


def test_a_deployment_is_alive_while_announcing_and_gone_after_its_timeout_unknown_never(
    kafka_broker, kafka_admin, namespace
) -> None:
    reader = LivenessReader(kafka_admin, namespace)
    assert reader.read("never-there").state is Liveness.UNKNOWN
    before = time.time()
    us = announcer(kafka_broker, namespace, "us-east-1", timeout=1.0).start()
    try:
        assert us.wait_joined(30)
        seen = reader.read("us-east-1", details=True)
        assert seen.state is Liveness.ALIVE and seen.members == 1
        assert seen.since is not None and before - 1 <= seen.since <= time.time()
        assert seen.timeout == 1.0
    finally:
        us.close()  # a static member does not leave: like a crash, it expires after 1 s
    assert reader.read("us-east-1").state is Liveness.ALIVE  # not gone before its timeout
    took = wait_for(lambda: reader.read("us-east-1").gone, 20, "gone after the timeout")
    assert took >= 0.5  # expired by the coordinator's session timeout, not by the close
    gone = reader.read("us-east-1", details=True)
    assert gone.state is Liveness.GONE and gone.timeout == 1.0
    assert [d.deployment for d in reader.read_all()] == ["us-east-1"]
    assert liveness_group(namespace, "us-east-1") == f"{namespace}.deployment.us-east-1"


def test_a_restart_within_the_timeout_is_never_seen_as_a_death(
    kafka_broker, kafka_admin, namespace
) -> None:
    reader = LivenessReader(kafka_admin, namespace)
    first = announcer(kafka_broker, namespace, "eu-west-1", timeout=3.0).start()
    assert first.wait_joined(30)
    first.close()
    second = announcer(kafka_broker, namespace, "eu-west-1", timeout=3.0).start()
    try:
        assert second.wait_joined(30)
        # sample across the first one's expiry: always alive
        end = time.monotonic() + 4.0
        while time.monotonic() < end:
            assert reader.read("eu-west-1").state is Liveness.ALIVE
            time.sleep(0.2)
    finally:
        second.close()


def test_the_sidecar_command_announces_until_sigterm_and_refuses_bad_input(
    kafka_broker, kafka_admin, namespace
) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    bad = subprocess.run([sys.executable, "-m", "neli_orchestrate.liveness",
                          "--bootstrap-servers", kafka_broker, "--deployment", "x"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--namespace" in bad.stderr
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "neli_orchestrate.liveness", "--bootstrap-servers", kafka_broker,
         "--namespace", namespace, "--deployment", "dagster-eu", "--timeout", "2"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    reader = LivenessReader(kafka_admin, namespace)
    try:
        wait_for(lambda: reader.read("dagster-eu").state is Liveness.ALIVE, 60, "sidecar alive")
    finally:
        sidecar.terminate()
        assert sidecar.wait(30) == 0
    wait_for(lambda: reader.read("dagster-eu").gone, 30, "gone after the sidecar stopped")
