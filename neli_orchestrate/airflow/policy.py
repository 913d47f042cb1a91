"""The provider's cluster policy: fence the task directly after each LeaderGateOperator.

Registered through the ``airflow.policy`` entry point of the neli-orchestrate distribution,
so Airflow applies it wherever it loads DAG files once the package is installed: the DAG
processor (a shape that cannot be fenced shows as an import error in the UI), every task
process (the stock operator after the gate runs fenced there), ``airflow dags test``.

Where entry points are not an option, register it in ``airflow_local_settings.py``::

    from neli_orchestrate.airflow.policy import dag_policy  # noqa: F401
"""

from __future__ import annotations

from typing import Any

from airflow.policies import hookimpl

__all__ = ["dag_policy", "policy_loaded"]


@hookimpl
def dag_policy(dag: Any) -> None:
    """Fence each gate's direct child; refuse (import error) what cannot be fenced."""
    from airflow.exceptions import AirflowClusterPolicyViolation

    # Imported here, not at module level: Airflow loads this entry point while importing its
    # settings, which can happen inside `import neli_orchestrate.airflow.hooks.neli` (the
    # hook imports Airflow); a module-level import of the operators would then import the
    # half-initialised hook module and fail.
    from neli_orchestrate.airflow.operators.fenced import UnfenceableTaskError, fence_downstream

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
