"""Where the gates are in a DAG: the gate marker, gate discovery and the mapped-task check.

Usage::

    gates = direct_gates(task)          # the LeaderGateOperators directly upstream of task
    if is_gate(task) and is_mapped(task): ...

What the DAG rewriting (:mod:`neli_orchestrate.airflow.policy`), the fenced try
(:mod:`neli_orchestrate.airflow.operators.fenced`) and the gate itself share about the shape
of a DAG. A gate is recognised by a class attribute (:data:`GATE_MARKER`), not by its class,
so this module imports nothing of ours: the policy, which Airflow loads while it imports its
own settings, can import it at module level, and the operators import it without a circle
(the layers contract "Airflow's gate, policy, fenced try and graph" in pyproject.toml).
Spark-submit recognition is :func:`neli_orchestrate.airflow.spark_provider.is_spark_submit`.
"""

from __future__ import annotations

from typing import Any

#: Class attribute (set True) that marks LeaderGateOperator, found without importing it.
GATE_MARKER = "neli_gate"


def is_mapped(task: Any) -> bool:
    """True for a mapped task (``.expand``): its map indexes would share one claim."""
    # Inside the function: Airflow loads the policy (which imports this module) while it
    # imports its own settings, before the Task SDK's definitions may be imported.
    from airflow.sdk.definitions.mappedoperator import MappedOperator

    return isinstance(task, MappedOperator)


def is_gate(task: Any) -> bool:
    """True for a LeaderGateOperator (or a mapped one)."""
    cls = getattr(task, "operator_class", None) if is_mapped(task) else type(task)
    return bool(getattr(cls, GATE_MARKER, False))


def direct_gates(task: Any) -> list[Any]:
    """The LeaderGateOperators directly upstream of ``task``."""
    return [t for t in task.upstream_list if is_gate(t)]
