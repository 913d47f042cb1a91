"""Fenced execution: run a task only under this deployment's verified claim; fail on fence.

Usage::

    gate = LeaderGateOperator(task_id="gate", role="nycflights_daily")
    job = SparkSubmitOperator(task_id="job", application="jobs/nycflights_daily.py")
    gate >> job      # the direct child of a gate runs fenced: no wrapper class needed

    # the explicit alias, same behaviour, for any operator class:
    FencedBash = fenced(BashOperator)
    gate >> FencedBash(task_id="export", bash_command="./export.sh")

This module is the fenced try at run time. Making the gate's direct child run fenced is DAG
rewriting and lives in :mod:`neli_orchestrate.airflow.policy`
(:func:`~neli_orchestrate.airflow.policy.fence_downstream`: the cluster policy applies it
whenever Airflow loads a DAG file, the gate again before it claims; a shape that cannot be
fenced fails the DAG's import there). Where the gates are in a DAG (gate discovery, the
mapped-task check) is :mod:`neli_orchestrate.airflow.graph`.

One way to fence a task: put it directly after the gate. :func:`fenced` (and
``FencedSparkSubmitOperator``) is the explicit alias of that, adding per-task arguments.
:func:`run_fenced`, ``_FencedExecution``, :class:`FencedExecutionMixin` and the policy's
``FencedExecute`` are the machinery of both forms, not further ways to fence: internal.

What a fenced task does (through :meth:`neli_orchestrate.Singleton.execute`):

1. Re-acquires leadership of the role and re-verifies the gate's claim. Superseded (another
   deployment claimed the run with a larger token) → the task FAILS naming the new owner and
   token; completed → the task is SKIPPED, except when another deployment completed it (it
   took the run over after an earlier try here): then the try ends as the gate would have
   ended the run (:func:`_end_as_the_gate_would`: it succeeds without running the work, with
   its outlets' asset events by proxy, and skips the gate's ``singleton_tasks``).
2. Hands the claim to the work: Spark conf ``spark.neli.*`` (SparkSubmitOperator), environment
   variables ``NELI_TOKEN``, ``NELI_RUN_KEY``, ``NELI_ROLE``, ``NELI_DEPLOYMENT`` (BashOperator
   and every subprocess), and the context key ``neli_claim`` (``@task`` functions: declare a
   ``neli_claim`` parameter). Records ``RUNNING`` and runs the operator's own ``execute``
   while holding leadership.
3. If leadership is lost mid-run, the watchdog thread signals the task's main thread
   (``SIGUSR1`` via ``signal.pthread_kill``). The handler only raises into the work's frame,
   which unwinds it (and releases whatever it held: the task logger's lock, say); the main
   thread, no longer in signal context, then calls the operator's ``on_kill()``, kills every
   process the work started, and the try FAILS at once with the fencing reason.
   A fence fails the try, not the run: Airflow's retries apply, and a retry decides again
   from the ledger (runs under a new, larger token, skips a run completed elsewhere, or waits
   for another region's live claim). Only a final fence (attempt limit reached, or a token
   that is no claim of this ledger) raises ``AirflowFailException``. SIGTERM alone would not
   stop the work in Airflow 3 (the task runner's SIGTERM handler only calls ``on_kill``).
4. Records ``COMPLETED`` on success, ``FAILED`` with the reason on error. Airflow retries
   apply; a retry decides again and may re-claim the run with a new, larger token (the work
   sees the new one).

Stop first, then record, then release: whatever ends the work (a fence, ``execution_timeout``,
SIGTERM, an exception from the work) calls ``on_kill()`` and kills every process the work
started *before* ``FAILED`` is recorded and before the member leaves the role's group. Airflow
itself would call ``on_kill()`` on a timeout only after ``execute`` returned, by which time the
role was released; and on SIGTERM it only calls ``on_kill()``, which here also fails the try.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowSkipException,
    DownstreamTasksSkipped,
    TaskDeferred,
)

from neli_orchestrate.airflow.claims import (
    CLAIM_CONTEXT_KEY,
    DONE_ELSEWHERE_XCOM_KEY,
    open_singleton,
    record_to_dict,
    reset_command,
)
from neli_orchestrate.airflow.graph import direct_gates, is_gate
from neli_orchestrate.airflow.hooks.neli import NeliHook
from neli_orchestrate.airflow.spark_provider import (
    ApplicationNotStopped,
    built_hook,
    cluster_deploy_mode,
    confirm_stopped,
    elsewhere,
    is_spark_submit,
    parse_application,
    rebuild_hook,
    remote_application,
    stop_application,
    submission_problem,
    task_hook,
)
from neli_orchestrate.claim import Claim
from neli_orchestrate.errors import (
    AcquireTimeoutError,
    ConfigError,
    FencedError,
    SkippedRun,
    WorkNotStopped,
    WorkSkipped,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

logger = logging.getLogger(__name__)

#: The signal the watchdog sends to the task's main thread on fence.
FENCE_SIGNAL = signal.SIGUSR1

#: Seconds a stopped try asks the cluster manager whether its remote Spark driver is gone
#: (environment ``NELI_SPARK_KILL_CONFIRM_TIMEOUT`` overrides).
KILL_CONFIRM_TIMEOUT = 30.0


def kill_confirm_timeout() -> float:
    """:data:`KILL_CONFIRM_TIMEOUT`, or ``$NELI_SPARK_KILL_CONFIRM_TIMEOUT`` if set."""
    value = os.environ.get("NELI_SPARK_KILL_CONFIRM_TIMEOUT")
    try:
        return float(value) if value else KILL_CONFIRM_TIMEOUT
    except ValueError:
        raise ConfigError(
            f"NELI_SPARK_KILL_CONFIRM_TIMEOUT={value!r} is not a number of seconds"
        ) from None


#: Seconds a try keeps trying to name its cluster-mode driver in the ledger when the member's
#: session timeout is unknown (environment ``NELI_SPARK_NAMING_TIMEOUT`` overrides).
NAMING_TIMEOUT = 10.0


def naming_timeout(hook: Any) -> float:
    """How long a try may run a cluster-mode driver the ledger does not name yet.

    ``$NELI_SPARK_NAMING_TIMEOUT`` if set, else the session timeout of the role's member (the
    try's lease: should the try die, a successor may take the run over that long after, and it
    must find the driver named to stop it), else :data:`NAMING_TIMEOUT`.
    """
    value = os.environ.get("NELI_SPARK_NAMING_TIMEOUT")
    if value:
        try:
            return float(value)
        except ValueError:
            raise ConfigError(
                f"NELI_SPARK_NAMING_TIMEOUT={value!r} is not a number of seconds") from None
    try:
        return float(hook.singleton_config().neli.resolved.session_timeout)
    except Exception:  # noqa: BLE001 - a hook without NELI timing (a test double): the default
        return NAMING_TIMEOUT


class _Interrupted(BaseException):  # noqa: N818 - an interruption, not an error of the work
    """Raised by a signal handler into the work's frame: a fence, or the first SIGTERM.

    The handler does nothing else. Logging, ``on_kill()`` and killing processes from the
    handler would run inside whatever the work was doing when the signal came; if that was a
    log call holding the task logger's lock (structlog's ``BytesLogger`` takes a plain
    ``threading.Lock``), the handler's first log line waits for that lock forever, and the work
    outlives its fence. Unwinding releases the lock; ``_FencedExecution._work`` then stops the
    work on the main thread. A ``BaseException``, so that the work's ``except Exception`` does
    not swallow it.
    """

    def __init__(self, message: str, *, then: Callable[[], None] | None = None) -> None:
        super().__init__(message)
        #: What the interrupted handler would have done first, run on the main thread before
        #: the stop (Airflow's own SIGTERM handler: ``on_kill()``).
        self.then = then


class ApplicationMayStillRun(WorkNotStopped, AirflowException):
    """The try failed and its remote Spark application could not be confirmed stopped.

    Retryable like any failure; the singleton records ``FAILED`` with the application in the
    record's ``unstopped`` field.
    """

    def serialize(self) -> tuple[str, tuple[str, ...], dict[str, str]]:
        cls = type(self)
        return f"{cls.__module__}.{cls.__name__}", (str(self),), {"application": self.application}


# -- the fenced run ---------------------------------------------------------------------------


def find_gate(task: Any, gate_task_id: str | None = None) -> Any:
    """The LeaderGateOperator directly upstream of ``task`` (or the one named); fail if none."""
    if gate_task_id:
        gate = task.dag.task_dict.get(gate_task_id) if task.dag else None
        if gate is None or not is_gate(gate):
            raise AirflowFailException(
                f"{task.task_id}: gate_task_id {gate_task_id!r} is not a LeaderGateOperator in "
                "this DAG"
            )
        return gate
    gates = direct_gates(task)
    if len(gates) != 1:
        found = sorted(g.task_id for g in gates)
        raise AirflowFailException(
            f"{task.task_id}: a fenced task needs exactly one LeaderGateOperator directly "
            f"upstream (found {found or 'none'}); write `gate >> {task.task_id}`"
        )
    return gates[0]


def pull_claim(context: Context, gate: Any) -> Claim:
    """The gate's claim for this run, from its XCom; fail with instructions if missing."""
    value = context["ti"].xcom_pull(task_ids=gate.task_id)
    try:
        return Claim.from_xcom(value)
    except ConfigError:
        raise AirflowFailException(
            f"no claim from gate {gate.task_id!r} for this run (XCom return_value is {value!r}); "
            "clear the gate together with this task so it claims the run again (a run that "
            f"already COMPLETED needs `{reset_command('ROLE', 'RUN_KEY')}` first)"
        ) from None


def hand_claim_to_work(task: Any, claim: Claim, context: Context) -> None:
    """Give the work its claim: context ``neli_claim``, ``NELI_*`` env, Spark conf.

    Environment variables reach every subprocess (bash, spark-submit); a BashOperator with its
    own ``env`` gets them there too. A SparkSubmitOperator (recognised by class name, so the
    Spark provider is never imported here) also gets them as ``spark.neli.*`` conf, which the
    job reads with :func:`neli_orchestrate.spark.read_neli_conf`.
    """
    context[CLAIM_CONTEXT_KEY] = claim.xcom()  # type: ignore[literal-required]
    env = claim.env()
    if isinstance(getattr(task, "env", None), dict):
        task.env = {**task.env, **env}
    if is_spark_submit(task):
        from neli_orchestrate.spark.conf import neli_spark_conf

        task.conf = {
            **(task.conf or {}),
            **neli_spark_conf(
                claim, attempt=int(getattr(context["ti"], "try_number", 1) or 1)
            ),
        }
        rebuild_hook(task)  # the hook copies conf when it is built: build it with the claim
        if getattr(task, "durable", False):
            # Airflow 3.3's SparkSubmitOperator is a resumable job: a try reattaches to the
            # application an earlier try stored, or returns at once if it succeeded. Under a
            # claim that earlier application ran under an older token (every try that starts
            # work gets a new one: the singleton never runs one token twice), so resuming it
            # would record COMPLETED under this token for work this claim never ran.
            task.durable = False
            task.log.info(
                "Resumable job off for this fenced try (durable=False): token %s submits its "
                "own Spark application; an earlier try's application is never resumed",
                claim.token,
            )
    task.log.info(
        "Running under fencing token %s (run %r, role %r, deployment %r)",
        claim.token,
        claim.run_key,
        claim.role,
        claim.deployment,
    )


def _refuse_early_return(task: Any) -> None:
    """Fail (no retry) before claiming if spark-submit would return before the app finished."""
    try:
        problem = submission_problem(task_hook(task))
    except (AttributeError, KeyError, TypeError):  # not the provider's hook as we know it
        task.log.warning("cannot read the Spark provider's settings: completion not checked")
        return
    if problem:
        raise AirflowFailException(f"{task.task_id}: {problem}")


def run_fenced(
    task: Any,
    context: Context,
    work: Callable[[], Any],
    *,
    gate_task_id: str | None = None,
    neli_conn_id: str | None = None,
    acquire_timeout: float | None = None,
    prepare: Callable[[Claim, Context], None] | None = None,
) -> Any:
    """Run ``work()`` as ``task``'s work under its gate's claim (the steps of the module doc).

    ``prepare(claim, context)`` hands the claim to the work (default: :func:`hand_claim_to_work`).
    """
    gate = find_gate(task, gate_task_id)
    claim = pull_claim(context, gate)
    if is_spark_submit(task):
        _refuse_early_return(task)
    hook = NeliHook(
        neli_conn_id or gate.neli_conn_id,
        deployment=gate.deployment,
        acquire_timeout=(
            acquire_timeout if acquire_timeout is not None else gate.run_acquire_timeout
        ),
    )
    execution = _FencedExecution(task, claim, context, work, prepare)
    execution.naming_timeout = naming_timeout(hook)
    _lineage(task, hook.deployment, claim)
    try:
        with open_singleton(hook) as singleton:
            if hook.deployment != claim.deployment:
                raise AirflowFailException(
                    f"the claim belongs to deployment {claim.deployment!r} but this task's "
                    f"connection says {hook.deployment!r}; use the gate's connection"
                )
            outcome = _wait_and_run(task, gate, execution, singleton)
            if not isinstance(outcome, SkippedRun):
                from neli_orchestrate.airflow.lineage import settle

                settle(task, singleton)  # OpenLineage: the COMPLETED record, with its offset
                return outcome
    except ConfigError as exc:
        raise AirflowFailException(f"NELI configuration error: {exc}") from exc
    return _end_as_the_gate_would(task, gate, claim, context, outcome)


def _lineage(task: Any, here: str, claim: Claim, *, result: Any = None) -> None:
    """OpenLineage of this try (airflow/lineage.py): its claim, read back after the try."""
    from neli_orchestrate.airflow.lineage import Claimed, Lineage, attach, outputs_of

    deployment = claim.deployment or here
    role = claim.role or ""
    try:
        outputs = outputs_of(result) if result is not None else []
    except ImportError:  # no OpenLineage client: nobody asks for lineage
        outputs = []
    attach(task, Lineage(recorded_by=deployment,
                         record=Claimed(role, claim.run_key, claim.token, deployment),
                         outputs=outputs))


def _wait_and_run(task: Any, gate: Any, execution: _FencedExecution, singleton: Any) -> Any:
    """Run the fenced try; while another deployment holds the run, wait as the gate waits.

    ``WAIT`` (another deployment's live claim, or its retry window) and a leadership
    attempt that timed out do not fail the try: the try asks again every ``poke_interval``
    of its gate, for at most the gate's ``timeout`` (sensor semantics; the task's own
    ``execution_timeout`` still applies), holding no leadership in between. So a retry that
    comes while another region runs the job waits for that run to end: it then ends as the
    gate would (the run completed elsewhere), or runs it (the other region failed or died).
    Returns the work's value, or the :class:`SkippedRun` to end as the gate would.
    """
    poke, patience = gate.poke_interval, gate.timeout  # seconds: the sensor coerced them
    deadline = time.monotonic() + patience
    while True:
        try:
            return execution.run(singleton)
        except SkippedRun as exc:
            # decided by the caller, once this try's member has left the role's group
            return exc
        except AcquireTimeoutError as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AirflowException(
                    f"waited {patience:.0f} s (the gate's timeout) for run "
                    f"{execution.claim.run_key!r} while another deployment held it: {exc}"
                ) from exc
            pause = min(poke, left)
            if exc.wait_until is not None:  # the window ends sooner: ask again just after it
                pause = min(pause, max(0.5, exc.wait_until - time.time() + 0.5))
            task.log.info("Waiting, as the gate would: %s. Asking again in %.1f s", exc, pause)
            _sleep_unless_terminated(pause)


class _Terminated(AirflowException):
    """SIGTERM while a fenced try waited: nothing runs and nothing is held, so the try ends."""


def _sleep_unless_terminated(seconds: float) -> None:
    """Sleep, but end the try at once on SIGTERM (after Airflow's own handler): Airflow 3's
    task runner would otherwise only call ``on_kill()`` and let the wait go on until the
    supervisor's SIGKILL."""
    if threading.current_thread() is not threading.main_thread():
        time.sleep(seconds)  # signals reach the main thread only (a test driving a task)
        return
    previous = signal.getsignal(signal.SIGTERM)

    def terminate(signum: int, frame: Any) -> None:
        if callable(previous):
            previous(signum, frame)
        raise _Terminated("terminated (SIGTERM) while waiting for another deployment's run")

    signal.signal(signal.SIGTERM, terminate)
    try:
        time.sleep(seconds)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _end_as_the_gate_would(
    task: Any, gate: Any, claim: Claim, context: Context, skipped: SkippedRun
) -> None:
    """End a try that found its run ``COMPLETED``: as the gate ends a run completed elsewhere.

    Only when another deployment completed it (it took the run over after an earlier try
    here failed or was killed, the gate having claimed the run here): the try does not run
    the work, and, if there is anything only a successful task can do, it succeeds (Airflow
    emits no asset event for a skipped task, and a skipped task skips nothing) with

    - its outlets' asset events by proxy (the ``extra["neli"]`` of the gate's proxy events,
      unless the gate has ``proxy_asset_events=False``), and
    - the rest of the singleton skipped: the gate's ``singleton_tasks``
      (:class:`~airflow.sdk.SkipMixin`, which raises ``DownstreamTasksSkipped``).

    With neither (no outlets to proxy, no ``singleton_tasks``) the task is skipped, as the
    gate would have skipped it. The run completed by this deployment (a cleared task), and
    every other case, is skipped as before. Its XCom ``neli_done`` holds the record (the
    "Ran in region" extra link reads it).
    """
    from airflow.sdk import SkipMixin

    from neli_orchestrate.airflow.assets import (
        concrete_outlets,
        stamp_proxy_outlet_events,
    )
    from neli_orchestrate.observe import is_completed, skipped_by_task

    record = skipped.record
    here = claim.deployment or ""
    if not is_completed(record) or record.deployment == here:
        raise AirflowSkipException(str(skipped)) from skipped
    ti = context["ti"]
    role = str(claim.role or getattr(gate, "role", ""))
    if skipped_by_task(record):
        # The work skipped itself in the region that took the run over: it produced nothing,
        # so this try is a skip too, with no asset event by proxy (as there).
        done = record_to_dict(record) or {}
        done["skipped"], done["skipped_by_task"] = [], True
        url = gate.region_url(record, run_key=claim.run_key, child=task.task_id)
        if url:
            done["url"] = url
        ti.xcom_push(key=DONE_ELSEWHERE_XCOM_KEY, value=done)
        raise AirflowSkipException(
            f"run {claim.run_key!r} of role {role!r} was skipped by the task in deployment "
            f"{record.deployment!r} (token {record.token}) after an earlier try here: "
            f"{record.reason}; this try did not run the work and emits no asset event by proxy"
            f"{': ' + url if url else ''}") from skipped
    proxied: list[Any] = []
    if getattr(gate, "proxy_asset_events", True):
        assets, refused = concrete_outlets(task)
        if refused:
            task.log.warning(
                "Outlets %s of %r resolve to assets only inside the work: no event by proxy for "
                "them", refused, task.task_id)
        if assets:
            proxied = stamp_proxy_outlet_events(task, context, record, role=role,
                                                run_key=claim.run_key, here=here)
    from neli_orchestrate.airflow.lineage import Lineage, attach

    attach(task, Lineage(recorded_by=here, record=record))  # OpenLineage: a proxy of `record`
    rest = [t for t in gate.singleton_task_list() if t.task_id != task.task_id]
    done = record_to_dict(record) or {}
    done["skipped"] = [t.task_id for t in rest]
    url = gate.region_url(record, run_key=claim.run_key, child=task.task_id)
    if url:
        done["url"] = url
    ti.xcom_push(key=DONE_ELSEWHERE_XCOM_KEY, value=done)
    names = [getattr(a, "name", None) or getattr(a, "uri", None) for a in proxied]
    if not proxied and not rest:
        raise AirflowSkipException(
            f"run {claim.run_key!r} of role {role!r} was completed by deployment "
            f"{record.deployment!r} with token {record.token} after an earlier try here; this "
            f"try did not run the work{': ' + url if url else ''}") from skipped
    task.log.info(
        "Run %r of role %r was completed by deployment %r with token %s after an earlier try "
        "here; this try did not run the work: it succeeds with the asset event(s) by proxy %s "
        "and skips the rest of the singleton %s, as the gate would have%s",
        claim.run_key, role, record.deployment, record.token, names, done["skipped"],
        f" (ran there: {url})" if url else "")
    SkipMixin().skip(ti=ti, tasks=rest)  # raises DownstreamTasksSkipped when rest is not empty


class _FencedExecution:
    """One fenced run of a task's work in this task process: claim check, watchdog, fence."""

    def __init__(
        self,
        task: Any,
        claim: Claim,
        context: Context,
        work: Callable[[], Any],
        prepare: Callable[[Claim, Context], None] | None,
    ) -> None:
        self.task = task
        self.claim = claim
        self.context = context
        self.work = work
        self.prepare = prepare or (lambda c, ctx: hand_claim_to_work(task, c, ctx))
        self.fence_reason: str | None = None
        self.in_work = False
        #: The processes the work starts (neli_orchestrate.supervise), from _work on.
        self.tree: Any = None
        self.previous_term: Any = None
        #: Set by SIGTERM: the deployment is stopping this try (shutdown, rolling restart).
        self.terminated = False
        #: Set when a remote Spark application could not be confirmed stopped.
        self.not_stopped: str | None = None
        #: The application that could not be confirmed stopped (``RemoteApplication`` text).
        self.unstopped: str | None = None
        #: Seconds the try may run a cluster-mode driver the ledger does not name yet.
        self.naming_timeout = NAMING_TIMEOUT

    def run(self, singleton: Any) -> Any:
        claim = self.claim
        previous = self._install_handler()
        try:
            return singleton.execute(claim, self._work, on_fence=self._on_fence)
        except WorkSkipped as exc:
            # recorded COMPLETED ("skipped by the task"); Airflow sees what the work raised
            if exc.original is not None:
                raise exc.original from None
            raise AirflowSkipException(str(exc)) from exc
        except FencedError as exc:
            reason = self.fence_reason
            detail = f"{exc}" if reason is None or reason in str(exc) else f"{exc} ({reason})"
            message = (f"Fenced: run {claim.run_key!r} of role {claim.role!r} with token "
                       f"{claim.token} may no longer run here: {detail}")
            if getattr(exc, "final", False):
                raise AirflowFailException(message) from exc
            # A fence fails this try, not the run: a retry decides again from the ledger.
            raise AirflowException(message) from exc
        finally:
            self._restore_handler(previous)

    def _work(self, run: Any) -> Any:
        task = self.task
        # A retry after a failed or dead attempt may run under a new claim: use its token.
        current = self.claim.with_token(run.token)
        if current.token != self.claim.token:
            task.log.info(
                "Re-claimed run %r with token %s (gate's token %s: %s)",
                current.run_key,
                current.token,
                self.claim.token,
                run.reason,
            )
        self.prepare(current, self.context)
        from neli_orchestrate.supervise.work import OwnTree

        # This process becomes a child subreaper: a worker the work starts in a new session
        # (setsid, a daemonising tool) is re-parented here, not to init, and found by the stop.
        self.tree = OwnTree()
        watcher: _ApplicationWatcher | None = None
        try:
            if is_spark_submit(task):
                # Never beside an earlier token's driver that may still run on the cluster.
                self._stop_earlier_applications(run)
                watcher = _ApplicationWatcher(task, run, timeout=self.naming_timeout,
                                              on_unnamed=self._on_fence)
            self.in_work = True
            with _environ(current.env()):
                result = self.work()
            # OpenLineage: the claim it ran under (a retry's may be newer) and the sink's
            # table version, where the work returned the sink's commit
            _lineage(task, current.deployment or "", current, result=result)
            # The task's own asset events name the run, as the other regions' proxies do.
            from neli_orchestrate.airflow.assets import stamp_outlet_events

            stamp_outlet_events(task, self.context, current)
            return result
        except AirflowSkipException as exc:
            # The work skipped itself (skip_on_exit_code, soft_fail, AirflowSkipException):
            # a terminal outcome of the run key, not a failure another region would retry.
            raise WorkSkipped(str(exc) or type(exc).__name__, original=exc) from exc
        except DownstreamTasksSkipped as exc:
            # A short-circuit: the task succeeded and skipped its downstream tasks.
            raise WorkSkipped(f"the task skipped its downstream tasks {exc.tasks}",
                              original=exc) from exc
        except BaseException as exc:
            # Stop first, then record, then release: an execution_timeout (Airflow raises
            # AirflowTaskTimeout here and calls on_kill only after execute returned), a fence, a
            # SIGTERM or the work's own error stops everything the work started before the
            # singleton records FAILED and leaves the group. Here, on the main thread and out of
            # signal context: a fence or SIGTERM only raised _Interrupted into the work.
            interrupted = exc if isinstance(exc, _Interrupted) else None
            if self.in_work:
                self.in_work = False
                if interrupted is not None and interrupted.then is not None:
                    interrupted.then()
                self._stop_work(str(interrupted) if interrupted is not None
                                else f"{type(exc).__name__}: {exc}")
                if interrupted is not None and self.fence_reason is not None:
                    # Retryable: the singleton turns this into FencedError, and run() decides
                    # final or not.
                    fenced = AirflowException(f"Fenced: {self.fence_reason}; "
                                              f"{self.not_stopped or 'the work was killed'}")
                    run.expect_retry(self._retry_in(fenced))
                    raise fenced from None
                if self.not_stopped and not isinstance(exc, TaskDeferred):
                    # FAILED names the application (the ledger's ``unstopped``): the CLI and
                    # the UI show it as possibly still running.
                    raise ApplicationMayStillRun(
                        f"{type(exc).__name__}: {exc}; {self.not_stopped}",
                        application=self.unstopped or "") from exc
            run.expect_retry(self._retry_in(exc))
            if interrupted is not None:
                raise AirflowException(str(interrupted)) from None
            if isinstance(exc, TaskDeferred):
                raise AirflowFailException(
                    f"{task.task_id} tried to defer while running under a claim; a fenced task "
                    "must do its work in the worker: pass deferrable=False"
                ) from exc
            raise
        finally:
            self.in_work = False
            if watcher is not None:
                watcher.stop()

    def _stop_earlier_applications(self, run: Any) -> None:
        """Stop the applications earlier tokens started and nobody confirmed stopped
        (``run.unstopped``: their tries died, were cut off, or failed to confirm the kill),
        through this task's own cluster manager, before this try submits its own."""
        for text in run.unstopped:
            self._stop_earlier_application(run, text)

    def _stop_earlier_application(self, run: Any, text: str) -> None:
        """Stop one; where the cluster manager does not confirm it, the try fails (``FAILED``
        names it again) rather than run beside it. One the task cannot ask about (another
        cluster) is left, with a warning, to the token-checked sink."""
        task = self.task
        application = parse_application(text)
        why = ("not a Spark application it knows" if application is None
               else elsewhere(task, application))
        if application is None or why:
            # Not on this task's cluster manager: it cannot be asked, let alone killed here.
            task.log.warning(
                "%s, started under an earlier token, may still be running; this try cannot stop "
                "it (%s): only the token-checked sink keeps it from overwriting this run's "
                "output (docs/guide/spark.md)", text, why)
            return
        try:
            state = stop_application(task, application, self.context,
                                     deadline=kill_confirm_timeout())
        except ApplicationNotStopped as exc:
            self._count_unconfirmed_kill()
            raise ApplicationMayStillRun(
                f"not submitting beside an earlier token's application: {exc}",
                application=text) from exc
        finally:
            rebuild_hook(task)  # the work builds its own hook, with everything in conf
        task.log.info("%s, started under an earlier token, is stopped (%s): submitting under "
                      "token %s", application, state, run.token)
        run.record_stopped(text)

    def _retry_in(self, exc: BaseException) -> float | None:
        """Seconds until Airflow starts this task's next try after ``exc``; None: no next try.

        None when the try fails for good (``AirflowFailException``, a deferral refused, no
        tries left) or was stopped by SIGTERM: a deployment that is shutting down or
        restarting may not start its retry, so its FAILED record must not make other
        deployments wait for it (they take over at once; if the retry comes after all, it
        finds their claim and waits, then ends as the gate would). Otherwise the task's
        ``retry_delay``, with ``retry_exponential_backoff`` as Airflow computes its upper
        bound, capped by ``max_retry_delay``. A ``retry_policy`` that overrides the delay is
        not read: an early take-over costs no correctness, only the preference for the
        failing deployment.
        """
        ti = self.context.get("ti")
        try_number = int(getattr(ti, "try_number", 1) or 1)
        max_tries = int(getattr(ti, "max_tries", 0) or 0)
        if (self.terminated or isinstance(exc, AirflowFailException | TaskDeferred)
                or try_number > max_tries):
            return None
        task = self.task
        delay = task.retry_delay.total_seconds()
        multiplier = float(task.retry_exponential_backoff or 0)
        if multiplier > 0 and multiplier != 1.0:
            delay = 2 * max(1.0, delay * multiplier ** (try_number - 1))
        if task.max_retry_delay is not None:
            delay = min(delay, task.max_retry_delay.total_seconds())
        return delay

    def _stop_work(self, why: str) -> None:
        """Stop the work and every process it started: ``on_kill()``, then kill what is left."""
        task = self.task
        task.log.error("Stopping the work before anything is recorded (%s)", why)
        # Every process the work started is seen before on_kill(): one that leaves this
        # process's tree meanwhile is still stopped (and, as a subreaper, this process adopts
        # the orphans of a child that on_kill() stops first, e.g. bash's background jobs).
        tree = self.tree
        if tree is not None:
            tree.alive()
        try:
            task.on_kill()
        except Exception:  # noqa: BLE001 - still stop the processes and fail the task
            task.log.exception("on_kill() failed while stopping the work")
        if tree is not None:
            # SIGTERM, then SIGKILL at once (on_kill() was the work's own graceful stop), then
            # sweeps until nothing is left; signals meanwhile cannot cut it short (_terminate
            # raises only while the work runs).
            termed, killed, left = tree.stop(grace=0.0)
            if killed:
                task.log.warning("killed %d process(es) the work left behind", killed)
            if left:
                task.log.error("processes the work started survived SIGKILL: %s", left)
        if is_spark_submit(task):
            self._confirm_remote_stopped()

    def _confirm_remote_stopped(self) -> None:
        """Cluster deploy mode: ask the cluster manager until the driver is no longer active."""
        try:
            application = remote_application(built_hook(self.task))
        except (AttributeError, KeyError, TypeError):
            application = None
        if application is None:
            return
        try:
            state = confirm_stopped(self.task, application, self.context,
                                    deadline=kill_confirm_timeout())
        except ApplicationNotStopped as exc:
            self.not_stopped = str(exc)
            self.unstopped = str(exc.application)
            self.task.log.error("%s", exc)
            self._count_unconfirmed_kill()
        else:
            self.task.log.info("%s stopped: the cluster manager reports %s", application, state)

    def _count_unconfirmed_kill(self) -> None:
        """``neli.spark_unconfirmed_kill`` in Airflow's metrics: the one report that also
        leaves a fenced member (which can no longer write the ledger)."""
        from neli_orchestrate.airflow.metrics import to_airflow_stats
        from neli_orchestrate.metrics import Metric, MetricEvent, emit

        claim = self.claim
        emit(to_airflow_stats, MetricEvent(
            name=Metric.SPARK_UNCONFIRMED_KILL, role=claim.role or "",
            deployment=claim.deployment or "", run_key=claim.run_key))

    # -- the fence: watchdog thread -> SIGUSR1 -> main thread --------------------------------

    def _on_fence(self, reason: str) -> None:
        """Fence callback (watchdog thread): make the main thread stop the work now."""
        self.fence_reason = reason or "leadership lost"
        main = threading.main_thread()
        if threading.current_thread() is main:
            self._fence_now()
            return
        if main.ident is not None:
            signal.pthread_kill(main.ident, FENCE_SIGNAL)

    def _install_handler(self) -> tuple[bool, Any]:
        if threading.current_thread() is not threading.main_thread():
            self.task.log.warning(
                "not in the main thread: a fence cannot interrupt the work; it fails the "
                "task when the work returns"
            )
            return False, None
        # Only a Python SIGTERM handler (Airflow's task runner installs one) is chained; where
        # SIGTERM keeps its default action the process dies and records nothing.
        self.previous_term = signal.getsignal(signal.SIGTERM)
        if callable(self.previous_term):
            signal.signal(signal.SIGTERM, self._terminate)
        return True, signal.signal(FENCE_SIGNAL, self._signal_handler)

    def _restore_handler(self, installed: tuple[bool, Any]) -> None:
        done, previous = installed
        if done:
            # None means "not set from Python": the default action is what was there.
            signal.signal(FENCE_SIGNAL, signal.SIG_DFL if previous is None else previous)
            if callable(self.previous_term):
                signal.signal(signal.SIGTERM, self.previous_term)

    def _signal_handler(self, signum: int, frame: Any) -> None:
        if self.fence_reason is None:
            return  # a stray SIGUSR1, not our watchdog
        self._fence_now()

    def _fence_now(self) -> None:
        """Interrupt the work (only raise: see :class:`_Interrupted`); ``_work`` stops it."""
        if not self.in_work:
            # Not inside the work, or already being stopped: the singleton itself raises
            # FencedError at its next step.
            return
        raise _Interrupted(f"fenced: {self.fence_reason}")

    def _terminate(self, signum: int, frame: Any) -> None:
        """SIGTERM during the fenced run: fail the work, after Airflow's handler (``on_kill``).

        Airflow 3's task runner only calls ``on_kill()`` on SIGTERM and lets ``execute`` go on
        (it may even succeed). Under a claim that would record COMPLETED or keep the role while
        the supervisor is about to kill the process; instead the work stops and the try fails,
        so FAILED is recorded and the group left only after the work stopped. The first
        SIGTERM during the work only raises (:class:`_Interrupted`); Airflow's handler then runs
        on the main thread, out of signal context, just before the stop. Any other SIGTERM goes
        to Airflow's handler at once and raises nothing: a second SIGTERM must not cut short
        the stop the first one starts.
        """
        previous = self.previous_term
        if self.in_work and not self.terminated:
            self.terminated = True
            raise _Interrupted(
                "terminated (SIGTERM) while running under a claim",
                then=(lambda: previous(signum, None)) if callable(previous) else None)
        if callable(previous):
            previous(signum, frame)


class _ApplicationWatcher:
    """Names the Spark application in the ledger as soon as the provider knows its id.

    In cluster deploy mode the driver runs on the cluster, not in this process tree: should
    this try die or be cut off, the ``RUNNING`` record's ``application`` lets the next claim's
    try stop it before submitting its own (``Run.record_application``). A write the ledger
    refuses for a transient reason is tried again with backoff; if the driver is still unnamed
    ``timeout`` seconds after it was seen (the try's lease: a successor could take the run over
    by then and would find nothing to stop), ``on_unnamed(reason)`` stops the work (the
    fence's path: ``on_kill``, the driver killed and confirmed stopped) and the try fails,
    rather than let the driver run unnamed. A fence ends the naming: the run is stopped anyway.
    """

    INTERVAL = 0.25
    #: First pause after a failed write, doubled after each, up to :attr:`MAX_BACKOFF`.
    FIRST_BACKOFF = 0.25
    MAX_BACKOFF = 2.0

    def __init__(self, task: Any, run: Any, *, timeout: float = NAMING_TIMEOUT,
                 on_unnamed: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.task = task
        self.run = run
        self.timeout = timeout
        self.on_unnamed = on_unnamed
        self.clock = clock
        #: The application once the ledger took it (None: not named).
        self.named: str | None = None
        #: Failed writes before it was named (or given up).
        self.failures = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="neli-application-watcher",
                                       daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stopped.wait(self.INTERVAL):
            hook = built_hook(self.task)
            try:
                if hook is not None and not cluster_deploy_mode(hook):
                    return  # client or local mode: the driver is this try's own child
                application = remote_application(hook)
            except (AttributeError, KeyError, TypeError):
                continue  # the hook is being built
            if application is None:
                continue
            self._name(str(application))
            return

    def _name(self, application: str) -> None:
        """Write the application into the ledger until it takes it, the work ends, or
        :attr:`timeout` passes (then stop the work)."""
        deadline = self.clock() + self.timeout
        pause = self.FIRST_BACKOFF
        while True:
            try:
                self.run.record_application(application)
            except FencedError as exc:
                # a newer claim owns the run: the fence stops the work (and this driver)
                self.task.log.warning("not naming %s in the ledger: %s", application, exc)
                return
            except Exception as exc:  # noqa: BLE001 - the ledger's error: try again until the lease
                self.failures += 1
                left = deadline - self.clock()
                if left <= 0:
                    reason = (
                        f"could not name {application} in the ledger within {self.timeout:g} s "
                        f"({self.failures} attempts; last: {type(exc).__name__}: {exc}): "
                        "stopping it rather than run a driver a successor could not find")
                    self.task.log.error("%s", reason)
                    if self.on_unnamed is not None and not self.stopped.is_set():
                        self.on_unnamed(reason)
                    return
                wait = min(pause, left)
                self.task.log.warning(
                    "could not name %s in the ledger (attempt %d: %s: %s); trying again in "
                    "%.2f s (%.1f s left before the try stops it)", application, self.failures,
                    type(exc).__name__, exc, wait, left)
                if self.stopped.wait(wait):
                    return  # the work ended meanwhile: nothing left to name
                pause = min(pause * 2, self.MAX_BACKOFF)
                continue
            self.named = application
            self.task.log.info("Named %s in the ledger (token %s)", application, self.run.token)
            return

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=30)


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# -- the explicit form ---------------------------------------------------------------------------


class FencedExecutionMixin:
    """The class behind the explicit form: its ``execute`` runs only under a verified claim.

    Internal: users write :func:`fenced` (``fenced(FooOperator)`` puts this mixin first) or
    ``FencedSparkSubmitOperator``, or nothing at all, since a stock operator directly
    downstream of a gate gets the same behaviour without a class
    (:func:`neli_orchestrate.airflow.policy.fence_downstream`); the explicit form adds these
    arguments. A subclass of ``fenced(FooOperator)`` may override :meth:`prepare_fenced_run`
    to hand the claim to the work in its own way.

    :param gate_task_id: the LeaderGateOperator whose XCom holds the claim; default: the one
        directly upstream of this task.
    :param neli_conn_id: connection for the singleton; default: the gate's.
    :param acquire_timeout: seconds to wait for leadership of the role before failing the try
        (Airflow retries apply); default: the gate's ``run_acquire_timeout``, else the
        connection's. Runs of one role execute one after another, so allow for the longest run
        ahead of this one.
    """

    gate_task_id: str | None
    neli_conn_id: str | None
    acquire_timeout: float | None

    def __init__(
        self,
        *args: Any,
        gate_task_id: str | None = None,
        neli_conn_id: str | None = None,
        acquire_timeout: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)  # the operator class after the mixin
        self.gate_task_id = gate_task_id
        self.neli_conn_id = neli_conn_id
        self.acquire_timeout = acquire_timeout

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            return

        # BaseOperator's metaclass applies default_args and records init kwargs only around an
        # __init__ the class itself defines; give every fenced class one.
        def __init__(  # noqa: N807
            self: Any,
            *args: Any,
            gate_task_id: str | None = None,
            neli_conn_id: str | None = None,
            acquire_timeout: float | None = None,
            **kw: Any,
        ) -> None:
            super(cls, self).__init__(  # type: ignore[call-arg]  # the operator after the mixin
                *args,
                gate_task_id=gate_task_id,
                neli_conn_id=neli_conn_id,
                acquire_timeout=acquire_timeout,
                **kw,
            )

        __init__.__qualname__ = f"{cls.__qualname__}.__init__"
        cls.__init__ = __init__  # type: ignore[method-assign]

    def prepare_fenced_run(self, claim: Claim, context: Context) -> None:
        """Hand the verified claim to the work before it starts (:func:`hand_claim_to_work`)."""
        hand_claim_to_work(self, claim, context)

    def execute(self, context: Context) -> Any:
        wrapped: Callable[[Context], Any] = super().execute  # type: ignore[misc]
        return run_fenced(
            self,
            context,
            lambda: wrapped(context),
            gate_task_id=self.gate_task_id,
            neli_conn_id=self.neli_conn_id,
            acquire_timeout=self.acquire_timeout,
            prepare=self.prepare_fenced_run,
        )


_FENCED_CLASSES: dict[type, type] = {}


def fenced(operator_class: type[BaseOperator]) -> type[BaseOperator]:
    """Return ``Fenced<Name>``: ``operator_class`` with FencedExecutionMixin in front.

    The same class object is returned for the same operator class, so DAG files can call this
    at import time. Its extra arguments: ``gate_task_id``, ``neli_conn_id``, ``acquire_timeout``.
    """
    if not isinstance(operator_class, type) or not issubclass(operator_class, BaseOperator):
        raise TypeError(f"fenced() needs an operator class, got {operator_class!r}")
    if issubclass(operator_class, FencedExecutionMixin):
        return operator_class
    cls = _FENCED_CLASSES.get(operator_class)
    if cls is None:
        cls = type(
            f"Fenced{operator_class.__name__}",
            (FencedExecutionMixin, operator_class),
            {"__module__": __name__, "__doc__": f"{operator_class.__name__}, fenced by NELI."},
        )
        _FENCED_CLASSES[operator_class] = cls
    return cls


# The explicit form is the one public name here (also ``neli_orchestrate.airflow.fenced``);
# run_fenced, _FencedExecution and FencedExecutionMixin are its machinery, not ways to fence.
__all__ = ["fenced"]
