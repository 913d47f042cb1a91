"""A work that skips itself ends its run key for good: COMPLETED, "skipped by the task".

Real Airflow 3.3 operators (a stock ``BashOperator`` with ``skip_on_exit_code`` fenced behind a
``LeaderGateOperator`` by the cluster policy's ``fence_downstream``) against the real broker.
Before, the skip was recorded FAILED: Airflow does not retry a skipped task, so the other
region took the run key over after ``handoff_timeout``, skipped again, and it never ended.
"""

from __future__ import annotations

from typing import Any

import pendulum
import pytest
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowSkipException

from neli_orchestrate.airflow.hooks.neli import NeliHook
from neli_orchestrate.airflow.operators.gate import LeaderGateOperator
from neli_orchestrate.airflow.policy import fence_downstream, is_fenced
from neli_orchestrate.decision import Outcome, skipped_by_work
from neli_orchestrate.ledger.record import RunState

pytestmark = [pytest.mark.airflow, pytest.mark.kafka]

A, B = "us-east-1", "eu-west-1"
ROLE = "skipping_job"
RUN_KEY = "skip_dag/2013-01-08"


class XComTI:
    try_number = 1
    map_index = -1

    def __init__(self, claim: dict[str, Any], task: Any) -> None:
        self.claim = claim
        self.task = task  # the task runner's task (FencedExecute runs ti.task)

    def xcom_pull(self, task_ids: str) -> Any:
        assert task_ids == "gate"
        return self.claim


def bash_behind_gate(conn_id: str, command: str) -> Any:
    with DAG("skip_dag", schedule=None, start_date=pendulum.datetime(2013, 1, 1, tz="UTC")) as dag:
        gate = LeaderGateOperator(task_id="gate", role=ROLE, run_key=RUN_KEY,
                                  neli_conn_id=conn_id)
        job = BashOperator(task_id="job", bash_command=command, skip_on_exit_code=99)
        gate >> job
    fence_downstream(dag)
    assert is_fenced(job)
    return job


def test_a_bash_skip_on_exit_code_is_terminal_and_no_region_takes_it_over(
    neli_env, claim_now
) -> None:
    conn_a, conn_b = neli_env(A), neli_env(B)
    with NeliHook(conn_a).get_singleton() as mine:
        reservation = claim_now(mine, ROLE, RUN_KEY)
    claim = {"token": reservation.token, "run_key": RUN_KEY, "role": ROLE, "deployment": A}

    job = bash_behind_gate(conn_a, "echo nothing to do today; exit 99")
    with pytest.raises(AirflowSkipException, match="99"):  # Airflow sees the task's own skip
        job.execute({"ti": XComTI(claim, job), "dag": job.dag})

    with NeliHook(conn_b).get_singleton() as theirs:
        done = theirs.status(ROLE, RUN_KEY)
        assert done is not None
        assert (done.state, done.deployment, done.token) == (
            RunState.COMPLETED, A, reservation.token)
        assert skipped_by_work(done) and done.reason.startswith("skipped by the task")
        # The other region's gate, at once and long after any handoff window: done, skip.
        again = theirs.reserve(ROLE, RUN_KEY)
    assert again.outcome is Outcome.SKIP_DONE and not again.should_run
    assert "skipped by its task" in again.reason

    # A re-run of the same task in region A (cleared) finds it done: skipped, bash not run.
    rerun = bash_behind_gate(conn_a, "exit 1")
    with pytest.raises(AirflowSkipException, match="skipped by its task|completed"):
        rerun.execute({"ti": XComTI(claim, rerun), "dag": rerun.dag})
    with NeliHook(conn_a).get_singleton() as mine:
        assert mine.status(ROLE, RUN_KEY) == done  # nothing written after the skip
