"""A deployment paused mid-step loses the run to another and is fenced: step fails, Spark stops.

The east deployment materializes a partition whose PySpark job runs until released; the test
pauses east's step process (SIGSTOP) past the session timeout, so its NELI member is cut off
from the group, and takes the run over as the west deployment (a larger token, COMPLETED).
When east continues (SIGCONT), its watchdog fences the run: the Spark job group is cancelled,
and the step fails with ``dagster.Failure(allow_retries=False)`` carrying east's token,
deployment, role and run key. Nothing east did after the takeover reaches the ledger.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from dagster_harness import ledger_history, make_deployment, unique_namespace, work_log

from neli_orchestrate.core import NeliConfig
from neli_orchestrate.decision import Outcome
from neli_orchestrate.singleton import Singleton, SingletonConfig

pytestmark = [pytest.mark.dagster, pytest.mark.kafka, pytest.mark.spark]

PARTITION = "2013-03-01"
ROLE = "fenced_spark"
SESSION_TIMEOUT = 4.0


def _wait_for(condition, timeout: float, what: str, deployment=None) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if deployment is not None and deployment.process.poll() is not None:
            raise AssertionError(f"{deployment.name} exited while waiting for {what}:\n"
                                 f"{deployment.log_tail()}")
        if time.monotonic() > deadline:
            tail = deployment.log_tail() if deployment is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{tail}")
        time.sleep(0.05)


def test_step_paused_past_the_session_is_fenced_and_its_spark_job_cancelled(
    kafka_broker: str, tmp_path: Path
) -> None:
    namespace = unique_namespace()
    east = make_deployment(
        "east",
        tmp_path,
        kafka_broker,
        namespace,
        extra_env={"NELI_TEST_SESSION_TIMEOUT": str(SESSION_TIMEOUT)},
    )
    east.start("fenced_spark_job", "multiprocess", [PARTITION])
    try:
        started = tmp_path / "fenced_spark.json"
        _wait_for(
            lambda: started.exists() and len(list(tmp_path.glob("task-*.started"))) == 2,
            timeout=150,
            what="east's Spark tasks to run",
            deployment=east,
        )
        claim = json.loads(started.read_text())
        step_pid = claim["pid"]
        assert step_pid != east.process.pid, "the multiprocess executor runs the step apart"

        os.kill(step_pid, signal.SIGSTOP)
        try:
            west = Singleton(
                SingletonConfig(
                    neli=NeliConfig(
                        bootstrap_servers=kafka_broker,
                        profile="fast",
                        session_timeout=SESSION_TIMEOUT,
                    ),
                    deployment="west",
                    namespace=namespace,
                    acquire_timeout=60.0,
                    handoff_timeout=30.0,
                )
            )
            with west, west.claim(ROLE, PARTITION) as takeover:
                # east's record says RUNNING, but east no longer leads: west takes over.
                assert takeover.outcome is Outcome.TAKE_OVER
                assert takeover.token > claim["token"]
                west_token = takeover.token
        finally:
            os.kill(step_pid, signal.SIGCONT)

        result = east.wait(timeout=120)
    finally:
        east.stop()

    run = result["runs"][PARTITION]
    assert not run["success"]
    [failure] = run["step_failures"]
    assert failure["step"] == ROLE
    assert failure["error_class"] == "Failure"
    assert failure["metadata"] == {
        "token": claim["token"],
        "deployment": "east",
        "role": ROLE,
        "run_key": PARTITION,
    }
    assert "fenced" in failure["description"]
    # The Spark job itself reports that it was cancelled through the run's job group.
    job_group = f"neli/{ROLE}/{PARTITION}/{claim['token']}"
    assert any("cancel" in m and job_group in m for m in failure["errors"]), failure["errors"]
    assert not list(tmp_path.glob("task-*.finished")), "a Spark task of the fenced run finished"
    assert run["materialized"] == []
    assert work_log(tmp_path) == [], "the fenced step went on past its Spark job"

    records = [r for r in ledger_history(kafka_broker, f"{namespace}.ledger") if r.role == ROLE]
    states = [(r.state.value, r.deployment, r.token) for r in records]
    assert states == [
        ("RUNNING", "east", claim["token"]),
        ("RUNNING", "west", west_token),
        ("COMPLETED", "west", west_token),
    ]
