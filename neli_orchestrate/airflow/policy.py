"""DAG rewriting: the provider's cluster policy fences the task directly after each gate.

Usage (nothing to write: the task directly downstream of a gate runs fenced)::

    gate = LeaderGateOperator(task_id="gate", role="nycflights_daily")
    gate >> SparkSubmitOperator(task_id="job", application="jobs/nycflights_daily.py")

Registered through the ``airflow.policy`` entry point of the neli-orchestrate distribution,
so Airflow applies it wherever it loads DAG files once the package is installed: the DAG
processor (a shape that cannot be fenced shows as an import error in the UI), every task
process (the stock operator after the gate runs fenced there), ``airflow dags test``.

Where entry points are not an option, register it in ``airflow_local_settings.py``::

    from neli_orchestrate.airflow.policy import dag_policy  # noqa: F401

This module only rewrites and checks DAGs when they are loaded: :func:`fence_downstream`
installs :class:`FencedExecute` as the ``execute`` of each gate's direct child and raises
:class:`UnfenceableTaskError` for a shape that cannot be fenced. Where the gates are
(:mod:`neli_orchestrate.airflow.graph`) it imports at module level: that module imports nothing
of ours. What a fenced task does when it runs is :mod:`neli_orchestrate.airflow.operators.fenced`,
which this module imports (never the other way round), and only inside functions: Airflow
loads this entry point while importing its settings, which can happen inside
``import neli_orchestrate.airflow.hooks.neli`` (the hook imports Airflow); a module-level import
of the operators would then import the half-initialised hook module and fail. The gate imports
this module; this module never imports the gate (pyproject.toml's contract "Airflow's gate,
policy, fenced try and graph").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.policies import hookimpl

from neli_orchestrate.airflow.graph import direct_gates, is_gate, is_mapped
from neli_orchestrate.airflow.spark_provider import import_problem, is_spark_submit

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["dag_policy", "policy_loaded"]


@hookimpl
def dag_policy(dag: Any) -> None:
    """Fence each gate's direct child; refuse (import error) what cannot be fenced."""
    from airflow.exceptions import AirflowClusterPolicyViolation

    try:
        fence_downstream(dag)
    except UnfenceableTaskError as exc:
        raise AirflowClusterPolicyViolation(str(exc)) from exc


def policy_loaded() -> bool:
    """True if this Airflow installation applies :func:`dag_policy` when it loads DAG files."""
    try:
        from airflow import settings

        hooks = settings.get_policy_plugin_manager().hook.dag_policy.get_hookimpls()
    except Exception:  # noqa: BLE001 - no Airflow core here (a bare Task SDK worker)
        return False
    return any(getattr(impl.function, "__wrapped__", impl.function) is dag_policy
               or impl.function is dag_policy for impl in hooks)


class UnfenceableTaskError(ValueError):
    """A task behind a LeaderGateOperator cannot run fenced; the message says what to do.

    Raised while Airflow loads the DAG (the cluster policy): the DAG fails to import and the
    message shows under the UI's import errors.
    """


class FencedExecute:
    """Installed as ``task.execute`` on a gate's stock child: runs its own execute fenced.

    Stored on the instance, so the operator's class, its UI name and serialization do not
    change. The task that runs is the task runner's (``context["ti"].task``, a prepared copy).
    """

    def __init__(self, gate_task_id: str) -> None:
        self.gate_task_id = gate_task_id

    def __call__(self, context: Context) -> Any:
        from neli_orchestrate.airflow.operators.fenced import run_fenced

        task = context["ti"].task
        return run_fenced(
            task,
            context,
            lambda: type(task).execute(task, context),
            gate_task_id=self.gate_task_id,
        )

    def __repr__(self) -> str:
        return f"FencedExecute(gate_task_id={self.gate_task_id!r})"


def is_fenced(task: Any) -> bool:
    """True if ``task`` runs fenced (explicit form, or attached by :func:`fence_downstream`)."""
    from neli_orchestrate.airflow.operators.fenced import FencedExecutionMixin

    return isinstance(task, FencedExecutionMixin) or isinstance(
        getattr(task, "__dict__", {}).get("execute"), FencedExecute
    )


def fence_downstream(dag: Any) -> None:
    """Make the task directly downstream of each LeaderGateOperator in ``dag`` run fenced.

    Idempotent. Raises :class:`UnfenceableTaskError` for a shape that cannot be fenced (the DAG
    then fails to import): several tasks directly downstream of one gate, a mapped gate or
    mapped task, a deferrable task or a sensor in reschedule mode, an EmptyOperator (the
    scheduler never runs it), a task behind two gates, an explicitly fenced task that is not a
    direct child of a gate.
    """
    from neli_orchestrate.airflow.operators.fenced import FencedExecutionMixin

    for task in dag.tasks:
        if is_gate(task):
            _fence_child_of(task)
        elif isinstance(task, FencedExecutionMixin):
            _check_explicit(dag, task)


def _check_explicit(dag: Any, task: Any) -> None:
    """An explicitly fenced task must be a direct child of (its) gate."""
    gates = direct_gates(task)
    named = task.gate_task_id
    if not gates or (named and named not in {g.task_id for g in gates}):
        raise UnfenceableTaskError(
            f"DAG {dag.dag_id!r}: {type(task).__name__} {task.task_id!r} is not directly "
            f"downstream of {'gate ' + repr(named) if named else 'a gate'}; a fenced task runs "
            f"under the claim its gate just took: write `gate >> {task.task_id}` (tasks after "
            "it need no fencing)"
        )


def _check_spark_completion(what: str, task: Any) -> None:
    """Refuse a SparkSubmitOperator whose spark-submit returns before the application ended."""
    if not is_spark_submit(task):
        return
    problem = import_problem(task)
    if problem:
        raise UnfenceableTaskError(
            f"{what}: COMPLETED must mean the Spark application finished: {problem}"
        )


def _fence_child_of(gate: Any) -> None:
    from neli_orchestrate.airflow.operators.fenced import FencedExecutionMixin

    dag_id = gate.dag.dag_id if gate.dag else "?"
    where = f"DAG {dag_id!r}, gate {gate.task_id!r}"
    if is_mapped(gate):
        raise UnfenceableTaskError(
            f"{where}: a LeaderGateOperator cannot be mapped (.expand); give each item its own "
            "DAG run, or its own gate with a run_key that names the item"
        )
    children = list(gate.downstream_list)
    if not children:
        return
    if len(children) > 1:
        names = sorted(t.task_id for t in children)
        raise UnfenceableTaskError(
            f"{where}: exactly one task runs under a claim, but {names} are all directly "
            f"downstream; chain them (`{gate.task_id} >> {names[0]} >> {names[1:]}`) or give "
            "each its own gate and role"
        )
    (child,) = children
    what = f"{where}: task {child.task_id!r}"
    if is_mapped(child):
        raise UnfenceableTaskError(
            f"{what} is mapped (.expand): its map indexes would share one claim. Run the items "
            "inside one task, or give each item its own DAG run or gate (run_key naming the "
            "item); see docs/guide/airflow.md, 'Mapped tasks'"
        )
    if getattr(child, "deferrable", False) is True or getattr(child, "start_from_trigger", False):
        raise UnfenceableTaskError(
            f"{what} is deferrable: its work would run in the triggerer, where nothing holds "
            "the claim or can fence it; pass deferrable=False"
        )
    if getattr(child, "mode", None) == "reschedule":
        raise UnfenceableTaskError(
            f"{what} is a sensor in reschedule mode: it would leave the worker between pokes "
            "and lose the claim; use mode='poke', or put the sensor before the gate"
        )
    if getattr(child, "inherits_from_empty_operator", False):
        raise UnfenceableTaskError(
            f"{what} is an EmptyOperator: the scheduler marks it done without running it, so "
            "nothing would record the run COMPLETED; put the real work directly after the gate"
        )
    others = sorted(g.task_id for g in direct_gates(child) if g is not gate)
    if others:
        raise UnfenceableTaskError(
            f"{what} is also directly downstream of gate(s) {others}; a task runs under one "
            "claim: keep one gate"
        )
    _check_spark_completion(what, child)
    if isinstance(child, FencedExecutionMixin):
        if child.gate_task_id not in (None, gate.task_id):
            raise UnfenceableTaskError(
                f"{what} names gate_task_id={child.gate_task_id!r} but its gate is "
                f"{gate.task_id!r}"
            )
        return
    if not is_fenced(child):
        child.execute = FencedExecute(gate.task_id)

