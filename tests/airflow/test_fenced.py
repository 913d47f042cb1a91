"""Fenced execution: the claim is re-verified, handed to the work, and a fence fails the task.

The first tests drive the operator logic with a fake singleton (to reach the signal path
deterministically); the last ones run against the real ledger on Kafka. The fence of a real
spark-submit under the real task supervisor is in test_regions.py.
"""

from __future__ import annotations

import signal
import threading
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pendulum
import pytest
from airflow.providers.apache.spark.hooks import spark_submit as provider_hook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG, BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from neli_orchestrate.airflow.hooks.neli import NeliHook
from neli_orchestrate.airflow.operators.fenced import FencedExecutionMixin, fenced
from neli_orchestrate.airflow.operators.gate import LeaderGateOperator
from neli_orchestrate.airflow.operators.spark_submit import FencedSparkSubmitOperator
from neli_orchestrate.airflow.policy import fence_downstream
from neli_orchestrate.errors import AcquireTimeoutError, FencedError, SkippedRun
from neli_orchestrate.ledger.record import RunState

pytestmark = pytest.mark.airflow

A, B = "us-east-1", "eu-west-1"
ROLE = "daily_flights"
LOGICAL = pendulum.datetime(2013, 1, 7, tz="UTC")
RUN_KEY = f"fenced_dag/{LOGICAL.isoformat()}"


class Recorder(BaseOperator):
    """An operator that records its execution (what a fenced operator wraps)."""

    def __init__(self, *, block: threading.Event | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.block = block
        self.executed = 0
        self.killed = 0

    def execute(self, context: Any) -> str:
        self.executed += 1
        if self.block is not None:
            deadline = time.monotonic() + 20
            while not self.block.is_set():
                assert time.monotonic() < deadline, "the fence never interrupted the work"
                time.sleep(0.02)
        return "result"

    def on_kill(self) -> None:
        self.killed += 1


FencedRecorder = fenced(Recorder)


class XComTI:
    """A task instance whose XCom holds the gate's claim."""

    try_number = 1
    map_index = -1
    stats_tags: dict[str, str] = {}  # noqa: RUF012 - read by the resumable job

    def __init__(self, claim: Any) -> None:
        self.claim = claim

    def xcom_pull(self, task_ids: str) -> Any:
        assert task_ids == "claim_run"
        return self.claim


class FakeSingleton:
    """Stands in for Singleton.execute: records the call, runs the work, mimics fencing."""

    def __init__(self, *, run_token: int | None = None, error: Exception | None = None) -> None:
        self.run_token = run_token
        self.error = error
        self.calls: list[tuple[str, str, int]] = []
        self.fenced: str | None = None
        self.config = SimpleNamespace(deployment=A)
        #: what an earlier token left running (the claim's inherited ``unstopped``)
        self.unstopped: tuple[str, ...] = ()
        self.stopped: list[str] = []
        #: what the ledger answers the next writes naming an application (then it takes them);
        #: ``naming_fails_for_good``: it never takes one
        self.naming_errors: list[Exception] = []
        self.naming_fails_for_good = False
        self.naming_attempts = 0

    def execute(self, claim, work, *, on_fence=None):  # the claim travels whole
        role, run_key, token = claim.role, claim.run_key, claim.token
        self.calls.append((role, run_key, token))
        if self.error is not None:
            raise self.error
        self.applications: list[str] = []
        run = SimpleNamespace(token=self.run_token or token, reason="re-claimed", role=role,
                              expect_retry=lambda seconds: None, unstopped=self.unstopped,
                              record_application=self._record_application,
                              record_stopped=self.stopped.append)

        def fence(reason: str) -> None:
            self.fenced = reason
            on_fence(reason)

        self.fence = fence
        try:
            return work(run)
        except BaseException as exc:
            if self.fenced is not None:  # as Singleton does: a fenced run raises FencedError
                raise FencedError(f"fenced: {self.fenced}", role=role, token=token) from exc
            raise

    def _record_application(self, application: str) -> None:
        self.naming_attempts += 1
        if self.naming_fails_for_good:
            raise RuntimeError("the ledger's transaction timed out")
        if self.naming_errors:
            raise self.naming_errors.pop(0)
        self.applications.append(application)

    def close(self) -> None:
        pass


@pytest.fixture
def fake(monkeypatch, neli_env_offline) -> FakeSingleton:
    singleton = FakeSingleton()
    monkeypatch.setattr(NeliHook, "get_singleton", lambda self: singleton)
    return singleton


@pytest.fixture
def neli_env_offline(monkeypatch) -> str:
    """A neli_default connection (never contacted by the fake singleton)."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_NELI_DEFAULT",
        '{"conn_type": "neli", "host": "127.0.0.1:9", '
        '"extra": {"deployment": "us-east-1", "namespace": "acme"}}',
    )
    return "neli_default"


def dag_with(task_factory, *, gate: bool = True, conn_id: str = "neli_default") -> Any:
    with DAG("fenced_dag", schedule=None, start_date=LOGICAL):
        task = task_factory()
        if gate:
            LeaderGateOperator(task_id="claim_run", role=ROLE, neli_conn_id=conn_id) >> task
    return task


def claim(token: int = 5) -> dict[str, Any]:
    return {"token": token, "run_key": RUN_KEY, "role": ROLE, "deployment": A}


def context_for(task: Any, value: Any) -> dict[str, Any]:
    return {"ti": XComTI(value), "dag": task.dag}


def runner_context(task: Any) -> dict[str, Any]:
    """What the task runner hands a stock task: the gate's claim (token 5), ``ti.task``."""
    context = context_for(task, claim(5))
    context["ti"].task = task
    return context


def stock_spark_on_a_cluster(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A stock SparkSubmitOperator after the gate, deploy mode cluster on a standalone master,
    fenced as the cluster policy fences it when Airflow loads the file."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_CLUSTER",
        '{"conn_type": "spark", "host": "spark://127.0.0.1:7077", '
        '"extra": {"deploy-mode": "cluster"}}',
    )
    task = dag_with(lambda: SparkSubmitOperator(task_id="job", application="job.py",
                                                conn_id="spark_cluster"))
    fence_downstream(task.dag)
    return task


def test_fenced_operator_runs_the_wrapped_execute_under_the_gates_claim(fake) -> None:
    task = dag_with(lambda: FencedRecorder(task_id="job"))
    before = signal.getsignal(signal.SIGUSR1)
    assert task.execute(context_for(task, claim(5))) == "result"
    assert fake.calls == [(ROLE, RUN_KEY, 5)]
    assert task.executed == 1
    assert signal.getsignal(signal.SIGUSR1) == before  # the fence handler is removed again


def test_spark_job_gets_the_token_of_the_current_claim_as_spark_conf(fake, monkeypatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(SparkSubmitOperator, "execute", lambda self, ctx: seen.update(self.conf))
    fake.run_token = 12  # a retry re-claimed the run: the work must use the new token
    task = dag_with(
        lambda: FencedSparkSubmitOperator(
            task_id="job", application="job.py", conf={"spark.sql.shuffle.partitions": "2"}
        )
    )
    task.execute(context_for(task, claim(5)))
    assert seen == {
        "spark.sql.shuffle.partitions": "2",
        "spark.neli.token": "12",
        "spark.neli.run_key": RUN_KEY,
        "spark.neli.role": ROLE,
        "spark.neli.deployment": A,
        "spark.neli.attempt": "1",
    }


class StateStore:
    """Airflow 3.3's task state store as the resumable job sees it (get/set by key)."""

    def __init__(self, **values: Any) -> None:
        self.values = dict(values)

    def get(self, key: str) -> Any:
        return self.values.get(key)

    def set(self, key: str, value: Any) -> None:
        self.values[key] = value


def test_a_new_claim_submits_a_new_application_instead_of_resuming_an_earlier_tries(
    fake, monkeypatch
) -> None:
    # Standalone cluster mode: the stock operator is a resumable job (durable=True). An earlier
    # try stored its driver id; that driver FINISHED under an older token. Resuming it would
    # record COMPLETED under token 12 although nothing ran under it.
    calls: list[str] = []
    monkeypatch.setattr(SparkSubmitOperator, "get_job_status",
                        lambda self, external_id, ctx: calls.append(f"status {external_id}")
                        or "FINISHED")
    monkeypatch.setattr(SparkSubmitOperator, "submit_job",
                        lambda self, ctx: calls.append(f"submit {self.conf['spark.neli.token']}")
                        or "driver-new")
    monkeypatch.setattr(SparkSubmitOperator, "poll_until_complete",
                        lambda self, external_id, ctx: calls.append(f"poll {external_id}"))
    fake.run_token = 12
    task = stock_spark_on_a_cluster(monkeypatch)
    assert task.durable is True  # the provider's default
    context = runner_context(task)
    context["task_state_store"] = StateStore(spark_job_id="driver-old")
    task.execute(context)
    assert calls == ["submit 12", "poll driver-new"]
    assert task.durable is False


def test_a_submission_that_would_return_early_fails_before_anything_is_claimed(
    fake, monkeypatch
) -> None:
    # The connection (not the DAG file) makes it YARN cluster mode: refused at run time, from
    # the provider's own parsing, before the singleton runs anything.
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_YARN",
        '{"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster"}}',
    )
    task = dag_with(lambda: SparkSubmitOperator(
        task_id="job", application="job.py", conn_id="spark_yarn", durable=False,
        conf={"spark.yarn.submit.waitAppCompletion": "{{ 'false' }}"}))
    fence_downstream(task.dag)  # templated: not refused at import
    task.render_template_fields({})
    context = runner_context(task)
    with pytest.raises(AirflowFailException, match="yarn_track_via_rm_api=True"):
        task.execute(context)
    assert fake.calls == []


def test_completed_elsewhere_skips_the_task(fake) -> None:
    fake.error = SkippedRun("run is already completed by eu-west-1 with token 9")
    task = dag_with(lambda: FencedRecorder(task_id="job"))
    with pytest.raises(AirflowSkipException, match="completed by eu-west-1"):
        task.execute(context_for(task, claim()))
    assert task.executed == 0


def completed_by(deployment: str, token: int = 9) -> Any:
    from neli_orchestrate.ledger.record import LedgerRecord

    return LedgerRecord(role=ROLE, run_key=RUN_KEY, state=RunState.COMPLETED, token=token,
                        deployment=deployment, member=f"{deployment}/m", attempt=2,
                        at=1_700_000_000.0)


class PushTI(XComTI):
    def __init__(self, claim: Any) -> None:
        super().__init__(claim)
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def taken_over_dag(*, outlets: list[Any], singleton_tasks: list[str]) -> Any:
    with DAG("fenced_dag", schedule=None, start_date=LOGICAL):
        gate = LeaderGateOperator(task_id="claim_run", role=ROLE, singleton_tasks=singleton_tasks)
        task = FencedRecorder(task_id="job", outlets=outlets)
        gate >> task >> [BashOperator(task_id="cleanup", bash_command="true",
                                      trigger_rule="all_done"),
                         BashOperator(task_id="report", bash_command="true",
                                      trigger_rule="none_failed")]
    return task


def test_a_retry_that_finds_the_run_taken_over_ends_as_the_gate_would_have(fake) -> None:
    from airflow.sdk import Asset
    from airflow.sdk.exceptions import DownstreamTasksSkipped
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from neli_orchestrate.airflow.assets import EXTRA_KEY

    record = completed_by(B)
    fake.error = SkippedRun("run is already completed by eu-west-1", record=record)
    table = Asset("daily_table")
    task = taken_over_dag(outlets=[table], singleton_tasks=["cleanup"])
    ti, events = PushTI(claim()), OutletEventAccessors()
    with pytest.raises(DownstreamTasksSkipped) as skipped:
        task.execute({"ti": ti, "dag": task.dag, "outlet_events": events})
    assert task.executed == 0
    assert skipped.value.tasks == ["cleanup"]  # the rest of the singleton; report runs
    neli = events[table].extra[EXTRA_KEY]
    assert (neli["deployment"], neli["token"], neli["proxy"], neli["recorded_by"]) == (
        B, 9, True, A)
    done = ti.pushed["neli_done"]
    assert (done["deployment"], done["token"], done["skipped"]) == (B, 9, ["cleanup"])

    # outlets but no singleton_tasks: succeeds (returns) with the event by proxy
    task = taken_over_dag(outlets=[table], singleton_tasks=[])
    events = OutletEventAccessors()
    assert task.execute({"ti": PushTI(claim()), "dag": task.dag, "outlet_events": events}) is None
    assert events[table].extra[EXTRA_KEY]["deployment"] == B


@pytest.mark.parametrize("deployment, outlets", [(A, True), (B, False)])
def test_completed_here_or_nothing_to_do_as_the_gate_the_retry_is_skipped(
        fake, deployment, outlets) -> None:
    from airflow.sdk import Asset

    fake.error = SkippedRun("run is already completed", record=completed_by(deployment))
    task = taken_over_dag(outlets=[Asset("daily_table")] if outlets else [], singleton_tasks=[])
    with pytest.raises(AirflowSkipException, match="completed"):
        task.execute({"ti": PushTI(claim()), "dag": task.dag})
    assert task.executed == 0


@pytest.mark.parametrize(
    ("try_number", "max_tries", "task_args", "error", "terminated", "expected"),
    [
        (1, 1, {"retry_delay": timedelta(seconds=10)}, RuntimeError(), False, 10.0),
        (2, 1, {"retry_delay": timedelta(seconds=10)}, RuntimeError(), False, None),  # last try
        (1, 1, {}, RuntimeError(), True, None),  # SIGTERM: the deployment is stopping
        (1, 1, {}, AirflowFailException("no"), False, None),  # fails for good
        (3, 5, {"retry_delay": timedelta(seconds=10), "retry_exponential_backoff": 2.0,
                "max_retry_delay": timedelta(seconds=60)}, RuntimeError(), False, 60.0),
        (1, 5, {"retry_delay": timedelta(seconds=10), "retry_exponential_backoff": 2.0},
         RuntimeError(), False, 20.0),  # Airflow's upper bound: 2 x delay x 2**(try - 1)
    ],
)
def test_a_failed_try_says_when_its_retry_comes_or_that_none_will(
        try_number, max_tries, task_args, error, terminated, expected) -> None:
    from neli_orchestrate.airflow.operators.fenced import _FencedExecution

    task = dag_with(lambda: Recorder(task_id="job", **task_args))
    ti = SimpleNamespace(try_number=try_number, max_tries=max_tries)
    execution = _FencedExecution(task, None, {"ti": ti}, lambda: None, None)  # type: ignore[arg-type]
    execution.terminated = terminated
    assert execution._retry_in(error) == expected


def test_a_waiting_try_asks_again_when_the_window_ends_not_a_whole_poke_later(
        fake, monkeypatch) -> None:
    import neli_orchestrate.airflow.operators.fenced as fenced_module

    answers = [AcquireTimeoutError("held by eu-west-1", wait_until=time.time() + 1.0),
               AcquireTimeoutError("another member leads the role"), None]
    pauses: list[float] = []
    execute = fake.execute

    def held_then_free(*args: Any, **kwargs: Any) -> Any:
        fake.error = answers.pop(0)
        return execute(*args, **kwargs)

    monkeypatch.setattr(fake, "execute", held_then_free)
    monkeypatch.setattr(fenced_module.time, "sleep", pauses.append)
    with DAG("fenced_dag", schedule=None, start_date=LOGICAL):
        task = FencedRecorder(task_id="job")
        LeaderGateOperator(task_id="claim_run", role=ROLE, poke_interval=60, timeout=600) >> task
    assert task.execute(context_for(task, claim())) == "result"
    assert task.executed == 1 and len(fake.calls) == 3
    assert 0.5 <= pauses[0] <= 1.6, pauses  # just after the window, not the 60 s poke
    assert pauses[1] == 60, pauses  # no window known: the gate's poke_interval


def test_sigterm_ends_a_waiting_try_at_once_after_airflows_handler(fake, monkeypatch) -> None:
    import os

    import neli_orchestrate.airflow.operators.fenced as fenced_module

    answers = [AcquireTimeoutError("held by eu-west-1"), None]  # then free: the work would run
    execute = fake.execute

    def held_then_free(*args: Any, **kwargs: Any) -> Any:
        fake.error = answers.pop(0)
        return execute(*args, **kwargs)

    monkeypatch.setattr(fake, "execute", held_then_free)
    airflow_calls: list[int] = []

    def airflow_handler(signum: int, frame: Any) -> None:  # Airflow's: on_kill, nothing more
        airflow_calls.append(signum)

    previous = signal.signal(signal.SIGTERM, airflow_handler)
    monkeypatch.setattr(fenced_module.time, "sleep",
                        lambda seconds: os.kill(os.getpid(), signal.SIGTERM))
    try:
        with DAG("fenced_dag", schedule=None, start_date=LOGICAL):
            task = FencedRecorder(task_id="job")
            LeaderGateOperator(task_id="claim_run", role=ROLE, poke_interval=60,
                               timeout=600) >> task
        with pytest.raises(AirflowException, match="SIGTERM.*while waiting"):
            task.execute(context_for(task, claim()))
        assert airflow_calls == [signal.SIGTERM]  # Airflow's handler (on_kill) ran first
        assert signal.getsignal(signal.SIGTERM) is airflow_handler  # and is back
        assert task.executed == 0 and len(fake.calls) == 1  # never asked again, never ran
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_superseded_claim_fails_the_try_naming_the_new_owner_and_token(fake) -> None:
    fake.error = FencedError(
        "claim 5 of run 'x' is no longer ours: superseded by token 9 of eu-west-1 (CLAIMED)",
        role=ROLE,
        token=5,
    )
    task = dag_with(lambda: FencedRecorder(task_id="job"))
    with pytest.raises(AirflowException, match="superseded by token 9 of eu-west-1") as failed:
        task.execute(context_for(task, claim()))
    assert task.executed == 0
    # Not final: a retry decides again from the ledger (skip, wait, or take over).
    assert not isinstance(failed.value, AirflowFailException)


def test_a_final_fence_fails_the_task_for_good(fake) -> None:
    fake.error = FencedError(
        "run 'x' may not run again: GIVE_UP: attempt 3 of 3", role=ROLE, token=5, final=True
    )
    task = dag_with(lambda: FencedRecorder(task_id="job"))
    with pytest.raises(AirflowFailException, match="GIVE_UP"):
        task.execute(context_for(task, claim()))
    assert task.executed == 0


def test_a_fence_from_the_watchdog_thread_kills_the_work_and_fails_the_task(fake) -> None:
    release = threading.Event()
    task = dag_with(lambda: FencedRecorder(task_id="job", block=release))

    def watchdog() -> None:
        while task.executed == 0:
            time.sleep(0.01)
        fake.fence("leadership lost (own heartbeat missing or partition lost)")

    thread = threading.Thread(target=watchdog)
    thread.start()
    try:
        with pytest.raises(AirflowException, match="Fenced.*leadership lost") as failed:
            task.execute(context_for(task, claim(5)))
    finally:
        release.set()
        thread.join()
    # A fence fails the try, not the run: retryable, so a later try decides again.
    assert not isinstance(failed.value, AirflowFailException)
    assert task.killed == 1  # on_kill ran in the main thread, inside the signal handler
    assert "token 5" in str(failed.value)


class Chatty(Recorder):
    """Work that logs line after line, as the Spark provider's hook logs spark-submit's output."""

    def execute(self, context: Any) -> str:
        self.executed += 1
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            self.log.info("spark-submit: %s", "a line of the job's output")
        raise AssertionError("the fence never interrupted the work")

    def on_kill(self) -> None:
        self.log.info("Sending kill signal to spark-submit")  # as the provider's hook does
        super().on_kill()


class ChannelToSupervisor:
    """The task process's log channel: structlog's ``BytesLogger`` writes each line here while
    holding its one ``threading.Lock``. The first line of the work holds the channel (a full
    pipe to the supervisor) until the fence's signal interrupts it: the fence lands while the
    work is inside a log call, as it did in the chaos run of 2026-11-28."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.work_is_writing = threading.Event()
        self.interrupted = False

    def write(self, data: bytes) -> int:
        self.lines.append(data)
        if b"spark-submit:" in data and not self.work_is_writing.is_set():
            self.work_is_writing.set()
            deadline = time.monotonic() + 10
            try:
                while time.monotonic() < deadline:
                    time.sleep(0.01)  # the signal interrupts this sleep: its handler runs here
            except BaseException:
                self.interrupted = True
                raise
        return len(data)

    def flush(self) -> None:
        pass


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stop", ["fence", "SIGTERM"])
def test_a_fence_or_sigterm_that_lands_inside_a_log_call_still_stops_the_work(fake,
                                                                               stop) -> None:
    """The handler only raises; the stop, which logs (and so do ``on_kill()`` and Airflow's
    SIGTERM handler, which calls it), runs once the work has unwound and let go of the log's
    lock. A handler that stopped the work itself (logging from signal context) waits forever
    for the lock the interrupted log call holds: the work outlives its fence."""
    import logging
    import os

    import structlog

    channel = ChannelToSupervisor()
    output = structlog.BytesLogger(channel)  # type: ignore[arg-type]
    task = dag_with(lambda: fenced(Chatty)(task_id="job"))
    task._cached_logger = structlog.wrap_logger(
        output, wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        processors=[lambda _, level, event: f"{level} {event['event']}".encode()])
    deadlocked: list[bool] = []

    def watchdog() -> None:
        assert channel.work_is_writing.wait(20), "the work never logged"
        if stop == "fence":
            fake.fence("leadership lost (own heartbeat missing or partition lost)")
        else:
            os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 15
        while task.killed == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if task.killed == 0:  # stuck on the log's lock: free the main thread to fail the test
            deadlocked.append(True)
            output._lock.release()

    # Airflow's task runner's SIGTERM handler: on_kill(), nothing more
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: task.on_kill())
    thread = threading.Thread(target=watchdog)
    thread.start()
    try:
        with pytest.raises(BaseException) as failed:
            task.execute(context_for(task, claim(5)))
    finally:
        thread.join()
        signal.signal(signal.SIGTERM, previous)
    assert not deadlocked, "the stop waited for the log lock the interrupted work held"
    assert channel.interrupted, f"the {stop} did not land inside the log call"
    assert isinstance(failed.value, AirflowException), failed.value
    assert not isinstance(failed.value, AirflowFailException)  # retryable
    stopping = [line for line in channel.lines if b"Stopping the work" in line]
    if stop == "fence":
        assert "Fenced" in str(failed.value) and "token 5" in str(failed.value)
        assert task.killed == 1  # on_kill ran, on the main thread, after the work unwound
        assert stopping and b"fenced: leadership lost" in stopping[0], channel.lines[-5:]
    else:
        assert "SIGTERM" in str(failed.value)
        assert task.killed == 2  # Airflow's handler, then the try's stop: both on the main thread
        assert stopping and b"SIGTERM" in stopping[0], channel.lines[-5:]


def test_stray_sigusr1_does_not_disturb_the_work(fake) -> None:
    release = threading.Event()
    task = dag_with(lambda: FencedRecorder(task_id="job", block=release))

    def poke() -> None:
        while task.executed == 0:
            time.sleep(0.01)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
        time.sleep(0.2)
        release.set()

    thread = threading.Thread(target=poke)
    thread.start()
    assert task.execute(context_for(task, claim())) == "result"
    thread.join()
    assert task.killed == 0


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: dag_with(lambda: FencedRecorder(task_id="job"), gate=False), "found none"),
        (
            lambda: dag_with(lambda: FencedRecorder(task_id="job", gate_task_id="nope")),
            "not a LeaderGateOperator",
        ),
    ],
)
def test_a_fenced_task_without_its_gate_fails_with_instructions(fake, build, message) -> None:
    task = build()
    with pytest.raises(AirflowFailException, match=message):
        task.execute(context_for(task, claim()))


def test_a_missing_claim_fails_and_says_to_clear_the_gate_too(fake) -> None:
    task = dag_with(lambda: FencedRecorder(task_id="job"))
    with pytest.raises(AirflowFailException, match="clear the gate together"):
        task.execute(context_for(task, None))


def test_fenced_wraps_any_operator_class_once() -> None:
    cls = fenced(BashOperator)
    assert cls is fenced(BashOperator)
    assert cls.__name__ == "FencedBashOperator"
    assert issubclass(cls, FencedExecutionMixin) and issubclass(cls, BashOperator)
    assert fenced(cls) is cls
    assert fenced(FencedSparkSubmitOperator) is FencedSparkSubmitOperator
    with pytest.raises(TypeError):
        fenced(dict)  # type: ignore[arg-type]
    task = cls(task_id="t", bash_command="echo hi", gate_task_id="claim_run")
    assert (task.bash_command, task.gate_task_id) == ("echo hi", "claim_run")
    assert "bash_command" in task.template_fields


def test_a_subclass_of_the_explicit_form_hands_the_claim_to_the_work_its_own_way(fake) -> None:
    # docs/guide/airflow.md: override prepare_fenced_run on a subclass of fenced(Operator)
    handed: list[int] = []

    class OwnHandOver(fenced(Recorder)):
        def prepare_fenced_run(self, claim: Any, context: Any) -> None:
            handed.append(claim.token)

    fake.run_token = 9  # the current claim's token, not the gate's
    task = dag_with(lambda: OwnHandOver(task_id="job"))
    context = context_for(task, claim(5))
    assert task.execute(context) == "result"
    assert handed == [9]
    assert "neli_claim" not in context  # instead of the default hand-over


# -- against the real ledger -----------------------------------------------------------------


@pytest.mark.kafka
def test_real_ledger_fenced_task_completes_once_then_skips_and_superseded_fails(
    neli_env, claim_now
) -> None:
    conn_a, conn_b = neli_env(A), neli_env(B)
    with NeliHook(conn_a).get_singleton() as mine:
        reservation = claim_now(mine, ROLE, RUN_KEY)
    assert reservation.should_run

    FencedBash = fenced(BashOperator)
    task = dag_with(
        lambda: FencedBash(task_id="job", bash_command="echo fenced work"), conn_id=conn_a
    )
    context = context_for(task, claim(reservation.token))
    task.execute(context)
    with NeliHook(conn_a).get_singleton() as mine:
        done = mine.status(ROLE, RUN_KEY)
    assert (done.state, done.deployment, done.token) == (
        RunState.COMPLETED,
        A,
        reservation.token,
    )

    # a cleared and re-run fenced task finds the run completed: skipped, nothing re-run
    again = dag_with(lambda: FencedBash(task_id="job", bash_command="exit 1"), conn_id=conn_a)
    with pytest.raises(AirflowSkipException, match="completed"):
        again.execute(context_for(again, claim(reservation.token)))

    # superseded: B takes over A's claim of another run once its handoff deadline passed
    other_key = RUN_KEY + "-2"
    with NeliHook(conn_a).get_singleton() as mine:
        first = claim_now(mine, ROLE, other_key)
    with NeliHook(conn_b).get_singleton() as theirs:
        deadline = theirs.status(ROLE, other_key).handoff_deadline
        while time.time() <= deadline + 1.5:  # handoff + max clock error
            time.sleep(0.2)
        second = claim_now(theirs, ROLE, other_key)
    assert second.should_run and second.token > first.token
    late = waiting_dag(FencedBash(task_id="job", bash_command="exit 1"), conn_a, timeout=2)
    stale = {"token": first.token, "run_key": other_key, "role": ROLE, "deployment": A}
    # Another region's claim is live: this try waits as the gate would, for the gate's
    # timeout, then fails (retryable), naming the holder.
    with pytest.raises(AirflowException, match="the gate's timeout") as failed:
        late.execute(context_for(late, stale))
    assert not isinstance(failed.value, AirflowFailException)
    assert isinstance(failed.value.__cause__, AcquireTimeoutError)
    assert B in str(failed.value) and str(second.token) in str(failed.value)


def waiting_dag(task: Any, conn_id: str, *, timeout: float, outlets: list[Any] = (),
                run_acquire_timeout: float | None = None) -> Any:
    """``task`` behind a gate that pokes every 0.3 s for at most ``timeout`` s."""
    with DAG("fenced_dag", schedule=None, start_date=LOGICAL):
        gate = LeaderGateOperator(task_id="claim_run", role=ROLE, neli_conn_id=conn_id,
                                  poke_interval=0.3, timeout=timeout,
                                  run_acquire_timeout=run_acquire_timeout)
        task.outlets = list(outlets)
        gate >> task
    return task


@pytest.mark.kafka
def test_a_retry_that_comes_while_another_region_runs_waits_then_ends_as_the_gate_would(
    neli_env, claim_now
) -> None:
    """The killed region's retry, while the region that took over still runs the job: the try
    waits (no try used, nothing run), and once that region completed it, succeeds with the
    outlet's asset event by proxy, as a gate finding the run completed would."""
    from airflow.sdk import Asset
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from neli_orchestrate.airflow.assets import EXTRA_KEY

    conn_a, conn_b = neli_env(A), neli_env(B)
    key = RUN_KEY + "-wait"
    with NeliHook(conn_a).get_singleton() as mine:
        first = claim_now(mine, ROLE, key)
    with NeliHook(conn_b).get_singleton() as theirs:
        deadline = theirs.status(ROLE, key).handoff_deadline
        while time.time() <= deadline + 1.5:  # handoff + max clock error: A's executor is late
            time.sleep(0.2)
        second = claim_now(theirs, ROLE, key)
    assert second.should_run and second.token > first.token

    started, release, ran_b = threading.Event(), threading.Event(), []

    def region_b() -> None:  # B's executor runs the job and holds the role meanwhile
        def work(run: Any) -> None:
            started.set()
            assert release.wait(60), "the test never released B's job"
            ran_b.append(run.token)

        with NeliHook(conn_b).get_singleton() as theirs:
            theirs.execute(ROLE, key, second.token, work)

    b = threading.Thread(target=region_b, daemon=True)
    b.start()
    assert started.wait(60), "B's executor never started its job"
    table = Asset("daily_table")
    late = waiting_dag(FencedRecorder(task_id="job"), conn_a, timeout=120, outlets=[table],
                       run_acquire_timeout=0.5)
    ti, events = PushTI({"token": first.token, "run_key": key, "role": ROLE, "deployment": A}), (
        OutletEventAccessors())
    result: list[Any] = []
    a = threading.Thread(target=lambda: result.append(
        late.execute({"ti": ti, "dag": late.dag, "outlet_events": events})), daemon=True)
    a.start()
    # A's try keeps asking while B runs: it has not failed, and has run nothing.
    with NeliHook(conn_a).get_singleton() as mine:
        waited_until = time.monotonic() + 3
        while time.monotonic() < waited_until:
            assert a.is_alive(), "A's try ended while B still ran the job"
            assert mine.status(ROLE, key).token == second.token
            time.sleep(0.2)
    release.set()
    b.join(60)
    a.join(60)
    assert not a.is_alive(), "A's try never ended after B completed the run"
    assert ran_b == [second.token] and late.executed == 0 and result == [None]
    neli = events[table].extra[EXTRA_KEY]
    assert (neli["deployment"], neli["token"], neli["proxy"]) == (B, second.token, True)
    with NeliHook(conn_a).get_singleton() as mine:
        done = mine.status(ROLE, key)
    assert (done.state, done.deployment, done.token) == (RunState.COMPLETED, B, second.token)


# -- stop first, then record, then release: real Airflow task runner, real broker ------------

STOP_FIRST_DAG = '''
from datetime import timedelta
from pathlib import Path

import pendulum
import psutil
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG

from neli_orchestrate.airflow import LeaderGateOperator
from neli_orchestrate.core.neli import Neli
from neli_orchestrate.ledger.kafka import KafkaLedgerWriter

PID = Path({pid!r})
PROBE = Path({probe!r})


def _alive():
    """Is the work's process alive right now? None before the work started it."""
    text = PID.read_text().strip() if PID.exists() else ""
    if not text:
        return None
    try:
        return psutil.Process(int(text)).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _note(what):
    with PROBE.open("a") as probe:
        probe.write(f"{{what}} {{_alive()}}\\n")


# The probe: at the moment a ledger record is written and a member leaves its group, note
# whether the work's process still runs (this file runs in the task process).
_write, _close = KafkaLedgerWriter.write, Neli.close


def write(self, record):
    _note(f"record:{{record.state}}")
    return _write(self, record)


def close(self):
    _note("leave")
    return _close(self)


KafkaLedgerWriter.write, Neli.close = write, close

with DAG("stop_first", schedule=None, start_date=pendulum.datetime(2013, 1, 1, tz="UTC")):
    gate = LeaderGateOperator(task_id="gate", role="stop_first", poke_interval=1,
                              acquire_timeout=30, run_acquire_timeout=30)
    gate >> BashOperator(task_id="job", bash_command="sleep 20 & echo $! > {pid}; wait",
                         execution_timeout=timedelta(seconds=2), retries=0)
'''


@pytest.mark.kafka
def test_execution_timeout_stops_the_work_before_failed_is_recorded_and_the_group_left(
    tmp_path, neli_conn
) -> None:
    import json as _json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dagtest_runner import run_dag

    pid, probe = tmp_path / "sleep.pid", tmp_path / "probe.txt"
    conn = neli_conn(A, conn_id="neli_default")
    started = time.monotonic()
    result = run_dag(
        tmp_path,
        STOP_FIRST_DAG.format(pid=str(pid), probe=str(probe)),
        "stop_first",
        connections={"neli_default": {"conn_type": "neli", "host": conn.host,
                                      "extra": _json.loads(conn.extra)}},
    )
    took = time.monotonic() - started
    assert "AirflowTaskTimeout" in result.output, result.output[-4000:]
    notes = [line.split() for line in probe.read_text().splitlines()]
    during = [(what, alive) for what, alive in notes if alive != "None"]
    # Once the work had started, every record and every leave found its process gone.
    assert ("record:FAILED", "False") in during, (during, result.output[-3000:])
    assert ("leave", "False") in during, during
    assert all(alive == "False" for _, alive in during), during
    assert took < 60, f"the 20 s sleep was not cut short ({took:.0f} s)"
    with NeliHook(conn.conn_id, connection=conn).get_singleton() as singleton:
        record = singleton.status("stop_first", "stop_first/2013-01-01T00:00:00+00:00")
    assert record is not None and record.state is RunState.FAILED, record
    assert "AirflowTaskTimeout" in (record.reason or ""), record


@pytest.mark.kafka
def test_a_setsid_worker_of_the_work_is_stopped_before_failed_is_recorded(tmp_path,
                                                                          neli_conn) -> None:
    """The work's process starts a worker in a new session that outlives its parent (``setsid
    -f``): the try, a child subreaper, adopts it and stops it before anything is recorded."""
    import json as _json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dagtest_runner import run_dag

    pid, probe = tmp_path / "worker.pid", tmp_path / "probe.txt"
    dag = STOP_FIRST_DAG.replace(
        'bash_command="sleep 20 & echo $! > {pid}; wait"',
        'bash_command="setsid -f sh -c \'echo $$ > {pid}; exec sleep 20\'; sleep 20"')
    assert dag != STOP_FIRST_DAG
    conn = neli_conn(A, conn_id="neli_default")
    result = run_dag(
        tmp_path, dag.format(pid=str(pid), probe=str(probe)), "stop_first",
        connections={"neli_default": {"conn_type": "neli", "host": conn.host,
                                      "extra": _json.loads(conn.extra)}},
    )
    assert "AirflowTaskTimeout" in result.output, result.output[-4000:]
    notes = [line.split() for line in probe.read_text().splitlines()]
    during = [(what, alive) for what, alive in notes if alive != "None"]
    assert ("record:FAILED", "False") in during, (during, result.output[-3000:])
    assert all(alive == "False" for _, alive in during), during
    worker = int(pid.read_text())
    assert not Path(f"/proc/{worker}").exists() or "Z" in Path(
        f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[:1]


class Spawner(BaseOperator):
    """Work whose process starts a worker in a new session; its on_kill takes a while."""

    def __init__(self, *, pid_file: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pid_file = pid_file
        self.killed = 0

    def execute(self, context: Any) -> None:
        import subprocess

        subprocess.run(["setsid", "-f", "sh", "-c", f"echo $$ > {self.pid_file}; exec sleep 60"],
                       check=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(0.02)
        raise AssertionError("SIGTERM never interrupted the work")

    def on_kill(self) -> None:
        import os

        self.killed += 1
        if self.killed == 1:  # a second SIGTERM arrives while the work is being stopped
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.3)


def test_a_second_sigterm_during_the_stop_cannot_cut_it_short(fake, tmp_path) -> None:
    import os
    from pathlib import Path

    pid_file = tmp_path / "worker.pid"
    seen_at_record: list[bool] = []
    execute = fake.execute

    def recording(*args: Any, **kwargs: Any) -> Any:
        try:
            return execute(*args, **kwargs)
        except BaseException:
            # what Singleton.execute does next: record FAILED; the worker must be gone now
            seen_at_record.append(_alive_pid(int(pid_file.read_text())))
            raise

    fake.execute = recording  # type: ignore[method-assign]
    airflow_calls: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: airflow_calls.append(signum))
    try:
        with DAG("fenced_dag", schedule=None, start_date=LOGICAL):
            task = fenced(Spawner)(task_id="job", pid_file=str(pid_file))
            LeaderGateOperator(task_id="claim_run", role=ROLE) >> task

        def terminate() -> None:
            deadline = time.monotonic() + 20
            while not (pid_file.exists() and pid_file.read_text().strip()):
                assert time.monotonic() < deadline
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGTERM)

        thread = threading.Thread(target=terminate)
        thread.start()
        with pytest.raises(AirflowException, match="SIGTERM"):
            task.execute(context_for(task, claim()))
        thread.join()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert airflow_calls == [signal.SIGTERM, signal.SIGTERM]  # both reached Airflow's handler
    assert seen_at_record == [False], "the setsid worker outlived the stop"
    assert not _alive_pid(int(Path(pid_file).read_text()))


class CleaningSpawner(BaseOperator):
    """Work whose process starts a setsid worker and cleans up on its way out; a second
    SIGTERM arrives during that cleanup, after the first SIGTERM's exception and before the
    try stops the work (deterministically: the cleanup sends it)."""

    def __init__(self, *, pid_file: str, marker: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pid_file = pid_file
        self.marker = marker

    def execute(self, context: Any) -> None:
        import os
        import subprocess
        from pathlib import Path

        subprocess.run(["setsid", "-f", "sh", "-c", f"echo $$ > {self.pid_file}; exec sleep 60"],
                       check=True)
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                time.sleep(0.02)
            raise AssertionError("SIGTERM never interrupted the work")
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # the impatient second SIGTERM
            for _ in range(20):  # the handler runs between these bytecodes
                time.sleep(0.001)
            Path(self.marker).write_text("cleaned up")


def test_a_second_sigterm_before_the_try_stops_the_work_cannot_cut_it_short(fake,
                                                                             tmp_path) -> None:
    """The once-only SIGTERM of the fenced try: the second SIGTERM comes while the work is
    still unwinding from the first (its own cleanup), before the try marks it stopped; it
    reaches Airflow's handler but raises nothing, so the cleanup finishes, then the try stops
    the setsid worker, then records FAILED."""
    import os
    from pathlib import Path

    pid_file, marker = tmp_path / "worker.pid", tmp_path / "cleaned"
    seen_at_record: list[bool] = []
    execute = fake.execute

    def recording(*args: Any, **kwargs: Any) -> Any:
        try:
            return execute(*args, **kwargs)
        except BaseException:
            seen_at_record.append(_alive_pid(int(pid_file.read_text())))
            raise

    fake.execute = recording  # type: ignore[method-assign]
    airflow_calls: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: airflow_calls.append(signum))
    try:
        with DAG("fenced_dag", schedule=None, start_date=LOGICAL):
            task = fenced(CleaningSpawner)(task_id="job", pid_file=str(pid_file),
                                           marker=str(marker))
            LeaderGateOperator(task_id="claim_run", role=ROLE) >> task

        def terminate() -> None:
            deadline = time.monotonic() + 20
            while not (pid_file.exists() and pid_file.read_text().strip()):
                assert time.monotonic() < deadline
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGTERM)

        thread = threading.Thread(target=terminate)
        thread.start()
        with pytest.raises(AirflowException, match="SIGTERM"):
            task.execute(context_for(task, claim()))
        thread.join()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert airflow_calls == [signal.SIGTERM, signal.SIGTERM]  # both reached Airflow's handler
    assert marker.exists(), "the second SIGTERM cut the work's own cleanup short"
    assert seen_at_record == [False], "the setsid worker outlived the stop"
    assert not _alive_pid(int(Path(pid_file).read_text()))


def _alive_pid(pid: int) -> bool:
    from pathlib import Path

    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_the_docs_say_what_a_fence_raises() -> None:
    # docs/guide/airflow.md once said a fence raised AirflowFailException "without retries" while
    # the code raised a retryable AirflowException (the tests above pin the code's choice).
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "airflow.md").read_text()
    fenced_task = text[text.index("### The fenced task"):]
    fenced_task = fenced_task[:fenced_task.index("\n## ")]
    assert "without retries" not in fenced_task
    assert "a fence fails this try, not the run" in fenced_task
    assert "*final* fence" in fenced_task and "`AirflowFailException`" in fenced_task


def test_a_timeout_whose_driver_kill_is_unconfirmed_fails_naming_the_driver(
    fake, monkeypatch
) -> None:
    # Cluster mode, the master unreachable: Airflow's execution_timeout fires mid-job, the kill
    # cannot be confirmed. The try fails with WorkNotStopped naming the driver, which the
    # singleton writes into FAILED's `unstopped` (tests/cli/test_cli_ledger.py), and counts
    # neli.spark_unconfirmed_kill.
    from airflow.sdk.exceptions import AirflowTaskTimeout

    from neli_orchestrate.airflow import metrics as airflow_metrics
    from neli_orchestrate.errors import WorkNotStopped
    from neli_orchestrate.metrics import Metric

    monkeypatch.setenv("NELI_SPARK_KILL_CONFIRM_TIMEOUT", "0.3")
    driver = "driver-20130107000000-0001"

    def submit_job(self: Any, ctx: Any) -> str:
        self._hook = self._get_hook()
        self._hook._driver_id = driver  # what the provider parses from spark-submit
        return driver

    def poll(self: Any, external_id: str, ctx: Any) -> None:
        raise AirflowTaskTimeout("Timeout, PID: 1")

    def unreachable(self: Any, external_id: str, ctx: Any) -> str:
        raise ConnectionRefusedError("the master's REST port is unreachable")

    monkeypatch.setattr(SparkSubmitOperator, "submit_job", submit_job)
    monkeypatch.setattr(SparkSubmitOperator, "poll_until_complete", poll)
    monkeypatch.setattr(SparkSubmitOperator, "get_job_status", unreachable)
    monkeypatch.setattr(SparkSubmitOperator, "on_kill", lambda self: None)  # its curl fails too
    sent: list[Any] = []
    monkeypatch.setattr(airflow_metrics, "to_airflow_stats", sent.append)
    task = stock_spark_on_a_cluster(monkeypatch)
    context = runner_context(task)
    with pytest.raises(WorkNotStopped) as raised:
        task.execute(context)
    assert raised.value.application == f"standalone application {driver} on spark://127.0.0.1:7077"
    assert isinstance(raised.value, AirflowException)  # retryable, as any failed try
    assert "AirflowTaskTimeout" in str(raised.value) and "may still be running" in str(raised.value)
    assert [(e.name, e.role, e.run_key) for e in sent] == [
        (Metric.SPARK_UNCONFIRMED_KILL, ROLE, RUN_KEY)]


EARLIER = "standalone application driver-20130106000000-0001 on spark://127.0.0.1:7077"


@pytest.mark.parametrize("state", ["KILLED", "FINISHED"])
def test_an_earlier_tokens_driver_is_stopped_and_confirmed_before_the_job_submits(
        fake, monkeypatch, state) -> None:
    events: list[str] = []
    answers = iter(["RUNNING", state] if state == "KILLED" else [state])

    def status(self: Any, external_id: str, ctx: Any) -> str:
        events.append(f"asked {external_id}")
        return next(answers)

    monkeypatch.setattr(SparkSubmitOperator, "get_job_status", status)
    monkeypatch.setattr(provider_hook.SparkSubmitHook, "on_kill",
                        lambda hook: events.append(f"killed {hook._driver_id}"))
    monkeypatch.setattr(SparkSubmitOperator, "execute_resumable",
                        lambda self, ctx: events.append("submitted"))
    fake.unstopped = (EARLIER,)
    task = stock_spark_on_a_cluster(monkeypatch)
    task.execute(runner_context(task))
    driver = "driver-20130106000000-0001"
    if state == "KILLED":
        assert events == [f"asked {driver}", f"killed {driver}", f"asked {driver}", "submitted"]
    else:  # it had ended: nothing to kill
        assert events == [f"asked {driver}", "submitted"]
    assert fake.stopped == [EARLIER]


def test_an_earlier_tokens_driver_the_master_cannot_confirm_stopped_fails_the_try_unsubmitted(
        fake, monkeypatch) -> None:
    from neli_orchestrate.errors import WorkNotStopped

    monkeypatch.setenv("NELI_SPARK_KILL_CONFIRM_TIMEOUT", "0.3")
    submitted: list[str] = []

    def unreachable(self: Any, external_id: str, ctx: Any) -> str:
        raise ConnectionRefusedError("the master's REST port is unreachable")

    monkeypatch.setattr(SparkSubmitOperator, "get_job_status", unreachable)
    monkeypatch.setattr(provider_hook.SparkSubmitHook, "on_kill", lambda hook: None)
    monkeypatch.setattr(SparkSubmitOperator, "execute_resumable",
                        lambda self, ctx: submitted.append("submitted"))
    fake.unstopped = (EARLIER,)
    task = stock_spark_on_a_cluster(monkeypatch)
    with pytest.raises(WorkNotStopped) as raised:
        task.execute(runner_context(task))
    assert raised.value.application == EARLIER  # FAILED names it again: the next try asks again
    assert "not submitting beside an earlier token's application" in str(raised.value)
    assert submitted == [] and fake.stopped == []


def test_an_earlier_tokens_driver_on_another_cluster_is_left_to_the_sink(fake,
                                                                         monkeypatch) -> None:
    submitted: list[str] = []
    monkeypatch.setattr(SparkSubmitOperator, "execute_resumable",
                        lambda self, ctx: submitted.append("submitted"))
    fake.unstopped = (EARLIER.replace("127.0.0.1:7077", "10.9.9.9:7077"),)
    task = stock_spark_on_a_cluster(monkeypatch)
    warnings: list[str] = []
    monkeypatch.setattr(type(task.log), "warning",
                        lambda log, msg, *args: warnings.append(msg % args), raising=False)
    task.execute(runner_context(task))
    assert submitted == ["submitted"] and fake.stopped == []
    assert [w for w in warnings if "this try cannot stop it (this task's Spark connection "
            "submits to spark://127.0.0.1:7077)" in w], warnings


DRIVER = "driver-20130107000000-0002"
NAMED = f"standalone application {DRIVER} on spark://127.0.0.1:7077"


def a_cluster_job_until_killed(monkeypatch: pytest.MonkeyPatch, fake: FakeSingleton
                               ) -> tuple[Any, list[str]]:
    """A stock SparkSubmitOperator in cluster mode whose driver runs until the ledger names it
    (then the job ends) or the try kills it (the master then reports it KILLED)."""
    events: list[str] = []
    killed = threading.Event()

    def submit_job(self: Any, ctx: Any) -> str:
        self._hook = self._get_hook()
        self._hook._driver_id = DRIVER  # what the provider parses from spark-submit
        events.append("submitted")
        return DRIVER

    def poll(self: Any, external_id: str, ctx: Any) -> None:
        deadline = time.monotonic() + 30
        while not fake.applications and not killed.is_set():
            assert time.monotonic() < deadline, "the driver was neither named nor killed"
            time.sleep(0.02)
        events.append("finished")

    def on_kill(self: Any) -> None:
        events.append("killed")
        killed.set()

    monkeypatch.setattr(SparkSubmitOperator, "submit_job", submit_job)
    monkeypatch.setattr(SparkSubmitOperator, "poll_until_complete", poll)
    monkeypatch.setattr(SparkSubmitOperator, "on_kill", on_kill)
    monkeypatch.setattr(SparkSubmitOperator, "get_job_status",
                        lambda self, external_id, ctx: "KILLED" if killed.is_set() else "RUNNING")
    return stock_spark_on_a_cluster(monkeypatch), events


def test_naming_the_driver_is_retried_with_backoff_until_the_ledger_takes_it(
        fake, monkeypatch) -> None:
    from confluent_kafka import KafkaError, KafkaException

    # two transient refusals (a broker hiccup, a coordinator moving), then the ledger takes it
    fake.naming_errors = [KafkaException(KafkaError(KafkaError._TIMED_OUT)),
                          KafkaException(KafkaError(KafkaError._TRANSPORT))]
    task, events = a_cluster_job_until_killed(monkeypatch, fake)
    task.execute(runner_context(task))
    assert fake.applications == [NAMED]  # named once, after the third write
    assert fake.naming_attempts == 3
    assert events == ["submitted", "finished"]  # never killed: it ran named


def test_a_driver_the_ledger_never_names_is_stopped_and_the_try_fails(fake, monkeypatch) -> None:
    monkeypatch.setenv("NELI_SPARK_NAMING_TIMEOUT", "1.5")
    fake.naming_fails_for_good = True
    task, events = a_cluster_job_until_killed(monkeypatch, fake)
    started = time.monotonic()
    with pytest.raises(AirflowException, match="could not name .*within 1.5 s") as raised:
        task.execute(runner_context(task))
    assert not isinstance(raised.value, AirflowFailException)  # retryable: a retry decides again
    assert time.monotonic() - started < 20
    assert fake.applications == []
    assert fake.naming_attempts >= 3  # retried with backoff before giving up
    assert events[:2] == ["submitted", "killed"]  # stopped rather than run unnamed


A_TRY_THAT_DIES = """
import logging, sys, time
from types import SimpleNamespace

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from neli_orchestrate import NeliConfig, Singleton, SingletonConfig
from neli_orchestrate.airflow.operators.fenced import _ApplicationWatcher

bootstrap, namespace, ready = sys.argv[1:4]
logging.basicConfig(level=logging.INFO)


class RefusedOnce:
    \"\"\"The run, but the ledger refuses the first write that names the driver.\"\"\"

    def __init__(self, run):
        self.run, self.refused = run, False
        self.token = run.token

    def record_application(self, text):
        if not self.refused:
            self.refused = True
            raise RuntimeError("injected: the ledger's transaction timed out")
        self.run.record_application(text)


singleton = Singleton(SingletonConfig(
    neli=NeliConfig(bootstrap_servers=bootstrap, profile="fast", session_timeout=3,
                    heartbeat_timeout=1),
    namespace=namespace, deployment="us-east-1", acquire_timeout=60, handoff_timeout=3))
with singleton.claim("cluster_job", "2013-01-08") as run:
    assert run.should_run, run
    hook = SparkSubmitHook(conn_id="spark_cluster")
    hook._driver_id = "driver-20130108000000-0001"  # what the provider parses from spark-submit
    watcher = _ApplicationWatcher(SimpleNamespace(_hook=hook, log=logging.getLogger("try")),
                                  RefusedOnce(run), timeout=30)
    open(ready, "w").write(str(run.token))
    time.sleep(600)  # the driver runs on the cluster; this try is killed meanwhile
"""


@pytest.mark.kafka
def test_after_one_refused_write_the_driver_is_still_named_and_a_successor_inherits_it(
    warm_broker: str, tmp_path: Any
) -> None:
    """The issue's case against the real ledger: one injected ledger write failure while naming
    the cluster-mode driver, then the try dies (SIGKILL). The successor's claim must inherit
    the driver to stop it (with the try-once watcher it inherited nothing)."""
    import json
    import os
    import subprocess
    import sys
    import uuid

    from neli_orchestrate import NeliConfig, Singleton, SingletonConfig

    namespace = f"name{uuid.uuid4().hex[:8]}"
    ready = tmp_path / "ready"
    env = {**os.environ, "AIRFLOW_CONN_SPARK_CLUSTER": json.dumps(
        {"conn_type": "spark", "host": "spark://127.0.0.1:7077",
         "extra": {"deploy-mode": "cluster"}})}
    config = SingletonConfig(
        neli=NeliConfig(bootstrap_servers=warm_broker, profile="fast", session_timeout=3,
                        heartbeat_timeout=1),
        namespace=namespace, deployment="eu-west-1", acquire_timeout=60, handoff_timeout=3)
    named = "standalone application driver-20130108000000-0001 on spark://127.0.0.1:7077"
    log = tmp_path / "try.log"
    with open(log, "wb") as out:
        doomed = subprocess.Popen([sys.executable, "-c", A_TRY_THAT_DIES, warm_broker,
                                   namespace, str(ready)], env=env, stdout=out,
                                  stderr=subprocess.STDOUT)
    try:
        with Singleton(config) as successor:
            deadline = time.monotonic() + 120
            while not ready.exists():
                assert doomed.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.1)
            # the watcher's retry comes 0.25 s after the refusal: give it (and a broken,
            # try-once watcher) 10 s, then the try dies
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                record = successor.status("cluster_job", "2013-01-08")
                if record is not None and record.application:
                    break
                time.sleep(0.2)
        doomed.kill()
        doomed.wait(30)
        with Singleton(config) as successor:
            deadline = time.monotonic() + 60
            while True:
                with successor.claim("cluster_job", "2013-01-08") as run:
                    if run.should_run:
                        inherited = run.unstopped
                        break
                assert time.monotonic() < deadline, run
                time.sleep(0.3)
    finally:
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait(30)
    assert inherited == (named,), log.read_text()[-3000:]
    assert "injected: the ledger's transaction timed out" in log.read_text()  # it was refused
