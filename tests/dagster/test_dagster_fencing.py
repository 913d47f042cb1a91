"""Two Dagster deployments: one paused mid-step loses the run to the other and is fenced.

The east deployment materializes a partition whose PySpark job runs until released. The test
pauses east's step process (SIGSTOP) past the session timeout, so east's NELI member drops out
of the role's group, and starts the west deployment (its own Dagster instance and home) on the
same partition: west takes the run over with a larger token and starts its own Spark job. When
east continues (SIGCONT), its watchdog fences the run: east's Spark job group is cancelled, the
fence is logged in east's event log, and east's step fails with
``dagster.Failure`` (retries allowed: a fence fails the try, not the run) carrying east's
token, deployment, role and run key.
West is then released and completes. Both deployments use the package's default group
protocol. Nothing east did after the takeover reaches the ledger.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from dagster_harness import Deployment, ledger_history, make_deployment, unique_namespace, work_log

pytestmark = [pytest.mark.dagster, pytest.mark.kafka, pytest.mark.spark]

PARTITION = "2013-03-01"
ROLE = "fenced_spark"
# Long enough that a step on a loaded two-core machine is not fenced by accident (observed
# with 4 s and 10 s at a load average of 35: "membership-unconfirmed" before any work); the
# pause (west starting up and starting Spark) lasts longer anyway.
SESSION_TIMEOUT = 20.0
STEP_TIMEOUT = 300.0


def _wait_for(condition, timeout: float, what: str, *deployments: Deployment) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        for deployment in deployments:
            if deployment.process is not None and deployment.process.poll() is not None:
                raise AssertionError(f"{deployment.name} exited while waiting for {what}:\n"
                                     f"{deployment.log_tail()}")
        if time.monotonic() > deadline:
            tails = "\n".join(d.log_tail() for d in deployments)
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{tails}")
        time.sleep(0.05)


def _spark_tasks(root: Path, deployment: str, phase: str) -> list[Path]:
    return sorted(root.glob(f"task-{deployment}-*.{phase}"))


def test_step_paused_past_the_session_is_fenced_by_the_other_deployment_and_its_spark_cancelled(
    kafka_broker: str, tmp_path: Path
) -> None:
    namespace = unique_namespace()
    env = {"NELI_TEST_SESSION_TIMEOUT": str(SESSION_TIMEOUT)}
    east = make_deployment("east", tmp_path, kafka_broker, namespace, extra_env=env)
    west = make_deployment("west", tmp_path, kafka_broker, namespace, extra_env=env)
    east_claim_file = tmp_path / "fenced_spark-east.json"
    west_claim_file = tmp_path / "fenced_spark-west.json"
    east.start("fenced_spark_job", "multiprocess", [PARTITION])
    try:
        _wait_for(
            lambda: east_claim_file.exists()
            and len(_spark_tasks(tmp_path, "east", "started")) == 2,
            STEP_TIMEOUT, "east's Spark tasks to run", east,
        )
        east_claim = json.loads(east_claim_file.read_text())
        step_pid = east_claim["pid"]
        assert step_pid != east.process.pid, "the multiprocess executor runs the step apart"

        os.kill(step_pid, signal.SIGSTOP)
        try:
            # West runs the same partition as its scheduler would; east's record says RUNNING,
            # but east's member is gone from the group once the session expires.
            west.start("fenced_spark_job", "in_process", [PARTITION])
            _wait_for(
                lambda: west_claim_file.exists()
                and len(_spark_tasks(tmp_path, "west", "started")) == 2,
                STEP_TIMEOUT, "west to take the run over and run its Spark tasks", west,
            )
        finally:
            os.kill(step_pid, signal.SIGCONT)
        west_claim = json.loads(west_claim_file.read_text())
        assert west_claim["token"] > east_claim["token"]

        east_result = east.wait(timeout=STEP_TIMEOUT)  # fenced: fails while west is still working
        assert not _spark_tasks(tmp_path, "west", "finished"), "west was released too early"
        (tmp_path / "release-west").touch()
        west_result = west.wait(timeout=STEP_TIMEOUT)
    finally:
        east.stop()
        west.stop()

    run = east_result["runs"][PARTITION]
    assert not run["success"]
    [failure] = run["step_failures"]
    assert failure["step"] == ROLE
    assert failure["error_class"] == "Failure"
    metadata = dict(failure["metadata"])
    assert isinstance(metadata.pop("started_at"), float)
    assert metadata.pop("neli_outcome") == "RUN"
    assert isinstance(metadata.pop("time_to_lead"), float)
    facet = metadata.pop("neli")  # the OpenLineage `neli` facet of the run that was fenced
    assert (facet["token"], facet["deployment"], facet["proxy"]) == (
        east_claim["token"], "east", False)
    assert metadata == {
        "token": east_claim["token"],
        "deployment": "east",
        "role": ROLE,
        "run_key": PARTITION,
    }
    assert "fenced" in failure["description"]
    assert run["step_retries"] == [], "the asset has no retry policy: one try, failed"
    # The fence is in east's event log (Dagster's logger), before the failure.
    fence_logs = [m for level, step, m in run["logs"] if level == "ERROR" and "fenced" in m]
    assert fence_logs and f"token {east_claim['token']}" in fence_logs[0], run["logs"]
    # The Spark job itself reports that it was cancelled through the run's job group.
    job_group = f"neli/{ROLE}/{PARTITION}/{east_claim['token']}"
    assert any("cancel" in m and job_group in m for m in failure["errors"]), failure["errors"]
    assert not _spark_tasks(tmp_path, "east", "finished"), "a Spark task of the fenced run finished"
    assert run["materialized"] == []

    west_run = west_result["runs"][PARTITION]
    assert west_run["success"], west_run
    [materialization] = west_run["materialized"]
    assert materialization["metadata"]["token"] == west_claim["token"]
    assert materialization["metadata"]["deployment"] == "west"
    assert materialization["metadata"]["neli_outcome"] == "TAKE_OVER"
    assert len(_spark_tasks(tmp_path, "west", "finished")) == 2

    assert work_log(tmp_path) == [(ROLE, PARTITION, "west", west_claim["token"])], (
        "only west's work may have finished"
    )
    records = [r for r in ledger_history(kafka_broker, f"{namespace}.ledger") if r.role == ROLE]
    states = [(r.state.value, r.deployment, r.token) for r in records]
    assert states == [
        ("RUNNING", "east", east_claim["token"]),
        ("RUNNING", "west", west_claim["token"]),
        ("COMPLETED", "west", west_claim["token"]),
    ]
