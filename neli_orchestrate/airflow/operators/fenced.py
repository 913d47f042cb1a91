"""Fenced execution: run an operator only under this deployment's verified claim; fail on fence.

Usage::

    gate = LeaderGateOperator(task_id="gate", role="nycflights_daily")
    job = FencedSparkSubmitOperator(task_id="job", application="jobs/nycflights_daily.py")
    gate >> job                      # the claim (token, run key, role) comes from gate's XCom

    # any other operator, without rewriting it:
    FencedBash = fenced(BashOperator)
    gate >> FencedBash(task_id="export", bash_command="./export.sh")
    # or explicitly: class FencedBashOperator(FencedExecutionMixin, BashOperator): ...

What the fenced task does (through :meth:`neli_orchestrate.Singleton.execute`):

1. Re-acquires leadership of the role and re-verifies the gate's claim. Superseded (another
   deployment claimed the run with a larger token) → the task FAILS naming the new owner and
   token; completed elsewhere → the task is SKIPPED.
2. Records ``RUNNING`` and runs the wrapped operator's ``execute`` while holding leadership.
3. If leadership is lost mid-run (``LeaderFenced``), the watchdog thread signals the task's
   main thread (``SIGUSR1`` via ``signal.pthread_kill``); the handler calls ``on_kill()``
   (for Spark: kill spark-submit and every process under it) and raises
   ``AirflowFailException``: the task FAILS at once, without retries. SIGTERM alone would not
   do this in Airflow 3 (the task runner's SIGTERM handler only calls ``on_kill``).
4. Records ``COMPLETED`` on success, ``FAILED`` with the reason on error. Airflow retries
   apply; a retry re-claims the run with a new, larger token (the work sees the new one).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from neli_orchestrate.airflow.hooks.neli import NeliHook
from neli_orchestrate.airflow.operators.gate import (
    CLAIM_KEYS,
    LeaderGateOperator,
    open_singleton,
)
from neli_orchestrate.errors import ConfigError, FencedError, SkippedRun

if TYPE_CHECKING:
    from airflow.sdk import Context

logger = logging.getLogger(__name__)

#: The signal the watchdog sends to the task's main thread on fence.
FENCE_SIGNAL = signal.SIGUSR1


class RunClaim(dict):
    """The gate's XCom: ``{"token", "run_key", "role", "deployment"}`` (a plain dict)."""

    @property
    def token(self) -> int:
        return int(self["token"])

    @property
    def run_key(self) -> str:
        return str(self["run_key"])

    @property
    def role(self) -> str:
        return str(self["role"])

    @property
    def deployment(self) -> str:
        return str(self["deployment"])


class FencedExecutionMixin:
    """Mix into an operator so its ``execute`` runs only under a verified, held claim.

    Put it first: ``class FencedFoo(FencedExecutionMixin, FooOperator)``, or use
    :func:`fenced`. Subclasses may override :meth:`prepare_fenced_run` to hand the claim to the
    work (FencedSparkSubmitOperator puts it into Spark conf).

    :param gate_task_id: the LeaderGateOperator whose XCom holds the claim; default: the only
        LeaderGateOperator upstream of this task.
    :param neli_conn_id: connection for the singleton; default: the gate's.
    :param acquire_timeout: seconds to wait for leadership of the role before failing the try
        (Airflow retries apply); default: the connection's. Runs of one role execute one
        after another, so allow for the longest run ahead of this one.
    """

    def __init__(
        self,
        *args: Any,
        gate_task_id: str | None = None,
        neli_conn_id: str | None = None,
        acquire_timeout: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.gate_task_id = gate_task_id
        self.neli_conn_id = neli_conn_id
        self.acquire_timeout = acquire_timeout
        self._neli_fence_reason: str | None = None
        self._neli_in_work = False

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
            super(cls, self).__init__(
                *args,
                gate_task_id=gate_task_id,
                neli_conn_id=neli_conn_id,
                acquire_timeout=acquire_timeout,
                **kw,
            )

        __init__.__qualname__ = f"{cls.__qualname__}.__init__"
        cls.__init__ = __init__  # type: ignore[method-assign]

    # -- what subclasses may adapt -------------------------------------------------------------

    def prepare_fenced_run(self, claim: RunClaim, context: Context) -> None:
        """Hand the verified claim to the work before it starts (default: nothing)."""

    # -- the fenced run ------------------------------------------------------------------------

    def _find_gate(self) -> LeaderGateOperator:
        task: BaseOperator = self  # type: ignore[assignment]
        if self.gate_task_id:
            gate = task.dag.task_dict.get(self.gate_task_id) if task.dag else None
            if not isinstance(gate, LeaderGateOperator):
                raise AirflowFailException(
                    f"{task.task_id}: gate_task_id {self.gate_task_id!r} is not a "
                    "LeaderGateOperator in this DAG"
                )
            return gate
        upstream = task.get_flat_relatives(upstream=True)
        gates = [t for t in upstream if isinstance(t, LeaderGateOperator)]
        if len(gates) != 1:
            found = sorted(g.task_id for g in gates)
            raise AirflowFailException(
                f"{task.task_id}: a fenced task needs exactly one upstream LeaderGateOperator "
                f"(found {found or 'none'}); add `gate >> {task.task_id}` or pass gate_task_id="
            )
        return gates[0]

    def _pull_claim(self, context: Context, gate: LeaderGateOperator) -> RunClaim:
        value = context["ti"].xcom_pull(task_ids=gate.task_id)
        if not isinstance(value, Mapping) or any(k not in value for k in CLAIM_KEYS):
            raise AirflowFailException(
                f"no claim from gate {gate.task_id!r} for this run (XCom return_value is "
                f"{value!r}); clear the gate together with this task so it claims the run again"
            )
        return RunClaim(value)

    def execute(self, context: Context) -> Any:
        task: BaseOperator = self  # type: ignore[assignment]
        gate = self._find_gate()
        claim = self._pull_claim(context, gate)
        hook = NeliHook(
            self.neli_conn_id or gate.neli_conn_id,
            deployment=gate.deployment,
            acquire_timeout=self.acquire_timeout,
        )
        try:
            with open_singleton(hook) as singleton:
                if hook.deployment != claim.deployment:
                    raise AirflowFailException(
                        f"the claim belongs to deployment {claim.deployment!r} but this task's "
                        f"connection says {hook.deployment!r}; use the gate's connection"
                    )
                return self._execute_under_claim(singleton, claim, context)
        except ConfigError as exc:
            raise AirflowFailException(f"NELI configuration error: {exc}") from exc
        finally:
            task.log.debug("fenced run of %s finished", task.task_id)

    def _execute_under_claim(self, singleton: Any, claim: RunClaim, context: Context) -> Any:
        task: BaseOperator = self  # type: ignore[assignment]
        wrapped_execute: Callable[[Context], Any] = super().execute  # type: ignore[misc]

        def work(run: Any) -> Any:
            # A retry after a failed or dead attempt runs under a new claim: use its token.
            current = RunClaim({**claim, "token": run.token})
            if current.token != claim.token:
                task.log.info(
                    "Re-claimed run %r with token %s (gate's token %s: %s)",
                    claim.run_key,
                    current.token,
                    claim.token,
                    run.reason,
                )
            self.prepare_fenced_run(current, context)
            self._neli_in_work = True
            try:
                return wrapped_execute(context)
            finally:
                self._neli_in_work = False

        previous = self._install_fence_handler()
        try:
            return singleton.execute(
                claim.role, claim.run_key, claim.token, work, on_fence=self._on_fence
            )
        except SkippedRun as exc:
            raise AirflowSkipException(str(exc)) from exc
        except FencedError as exc:
            reason = self._neli_fence_reason
            detail = f"{exc}" if reason is None or reason in str(exc) else f"{exc} ({reason})"
            raise AirflowFailException(
                f"Fenced: run {claim.run_key!r} of role {claim.role!r} with token "
                f"{claim.token} may no longer run here: {detail}"
            ) from exc
        finally:
            self._restore_fence_handler(previous)
            task.log.debug("fence handler restored")

    # -- the fence: watchdog thread -> SIGUSR1 -> main thread ---------------------------------

    def _on_fence(self, reason: str) -> None:
        """Fence callback (watchdog thread): make the main thread stop the work now."""
        self._neli_fence_reason = reason or "leadership lost"
        main = threading.main_thread()
        if threading.current_thread() is main:
            self._fence_now()
            return
        if main.ident is not None:
            signal.pthread_kill(main.ident, FENCE_SIGNAL)

    def _install_fence_handler(self) -> tuple[bool, Any]:
        """Install the SIGUSR1 handler; return (installed, previous handler)."""
        if threading.current_thread() is not threading.main_thread():
            self.log.warning(  # type: ignore[attr-defined]
                "not in the main thread: a fence cannot interrupt the work; it fails the "
                "task when the work returns"
            )
            return False, None
        return True, signal.signal(FENCE_SIGNAL, self._fence_signal_handler)

    def _restore_fence_handler(self, installed: tuple[bool, Any]) -> None:
        done, previous = installed
        if done:
            # None means "not set from Python": the default action is what was there.
            signal.signal(FENCE_SIGNAL, signal.SIG_DFL if previous is None else previous)

    def _fence_signal_handler(self, signum: int, frame: Any) -> None:
        if self._neli_fence_reason is None:
            return  # a stray SIGUSR1, not our watchdog
        self._fence_now()

    def _fence_now(self) -> None:
        if not self._neli_in_work:
            # Not inside the work: the singleton itself raises FencedError at its next step.
            return
        self._neli_in_work = False
        reason = self._neli_fence_reason
        self.log.error("Fenced while running (%s): killing the work", reason)  # type: ignore[attr-defined]
        try:
            self.on_kill()  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - still fail the task
            self.log.exception("on_kill() failed while fencing")  # type: ignore[attr-defined]
        raise AirflowFailException(f"Fenced: {reason}; the work was killed")


def _kill_process_tree(root_pid: int, *, timeout: float = 10.0) -> list[int]:
    """Kill every process below ``root_pid`` (and it); return the pids that had to be killed."""
    import psutil

    try:
        root = psutil.Process(root_pid)
        procs = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return []
    killed = []
    for proc in procs:
        try:
            proc.kill()
            killed.append(proc.pid)
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(procs, timeout=timeout)
    return killed


class FencedSparkSubmitOperator(FencedExecutionMixin, SparkSubmitOperator):
    """SparkSubmitOperator that runs only under the gate's claim and fails when fenced.

    The claim reaches the job as Spark conf (``spark.neli.token``, ``spark.neli.run_key``,
    ``spark.neli.role``, ``spark.neli.deployment``, ``spark.neli.attempt``); read it in the job
    with :func:`neli_orchestrate.spark.read_neli_conf` and publish through the token-checked
    commit. ``on_kill`` kills spark-submit and every process it started (JVM, Python driver).

    Takes every SparkSubmitOperator argument plus ``gate_task_id``, ``neli_conn_id`` and
    ``acquire_timeout`` (see FencedExecutionMixin).
    """

    ui_color = "#f7d9b8"

    def prepare_fenced_run(self, claim: RunClaim, context: Context) -> None:
        from neli_orchestrate.spark import neli_spark_conf

        conf = dict(self.conf or {})
        conf.update(
            neli_spark_conf(
                token=claim.token,
                run_key=claim.run_key,
                role=claim.role,
                deployment=claim.deployment,
                attempt=int(getattr(context["ti"], "try_number", 1) or 1),
            )
        )
        self.conf = conf
        self._hook = None  # the hook copies conf when built: build it with the claim
        self.log.info(
            "Submitting under fencing token %s (run %r, role %r)",
            claim.token,
            claim.run_key,
            claim.role,
        )

    def on_kill(self) -> None:
        process = getattr(self._hook, "_submit_sp", None) if self._hook else None
        pid = process.pid if process is not None and process.poll() is None else None
        descendants: list[int] = []
        if pid is not None:
            import psutil

            try:
                descendants = [p.pid for p in psutil.Process(pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                descendants = []
        super().on_kill()
        # spark-submit's kill() reaches the JVM only; its Python driver and workers are its
        # children and must not outlive a fenced task.
        leftovers = [p for d in descendants for p in _kill_process_tree(d)]
        if pid is not None:
            leftovers += _kill_process_tree(pid)
        if leftovers:
            self.log.warning("killed leftover Spark processes %s", leftovers)


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
