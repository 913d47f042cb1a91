"""Airflow 3.3 provider of neli_orchestrate: run singleton tasks exactly once across regions.

Usage::

    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from neli_orchestrate.airflow import LeaderGateOperator

    gate = LeaderGateOperator(task_id="claim_run", role="nycflights_daily")
    job = SparkSubmitOperator(task_id="job", application="jobs/nycflights_daily.py")
    gate >> job          # the task directly after the gate runs fenced (cluster policy)

``__all__`` holds what users write in DAG files: :class:`LeaderGateOperator`, the explicit
alias of its fence :func:`fenced` and its Spark form :class:`FencedSparkSubmitOperator`,
:class:`NeliLeaderSensor`, and :class:`NeliHook` for their own tasks. There is one way to fence
a task: put it directly after the gate; ``fenced(...)`` and ``FencedSparkSubmitOperator`` are
the explicit aliases (same behaviour, per-task arguments). The rest stays importable from its
module, one concept each: ``hooks.neli`` (NeliHook), ``operators.gate`` (LeaderGateOperator),
``operators.fenced`` (the fenced try at run time and the explicit form ``fenced``; its
machinery ``run_fenced`` and ``FencedExecutionMixin`` is internal), ``operators.spark_submit``
(FencedSparkSubmitOperator), ``policy`` (DAG rewriting: the cluster policy that fences each
gate's direct child and refuses shapes that cannot be fenced), ``claims`` (what gate, sensor,
trigger and fenced tasks share), ``assets`` (the ledger identity on asset events, events by
proxy, run keys of asset-triggered runs), ``sensors.leader`` (NeliLeaderSensor),
``triggers.leader`` (NeliLeadershipTrigger, which the sensor and gate defer to),
``provider`` (get_provider_info, the provider entry point). Names are imported lazily so that
Airflow's provider discovery, which imports ``provider``, stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "NeliHook": "neli_orchestrate.airflow.hooks.neli",
    "LeaderGateOperator": "neli_orchestrate.airflow.operators.gate",
    "FencedSparkSubmitOperator": "neli_orchestrate.airflow.operators.spark_submit",
    "fenced": "neli_orchestrate.airflow.operators.fenced",
    "NeliLeaderSensor": "neli_orchestrate.airflow.sensors.leader",
}

if TYPE_CHECKING:
    from neli_orchestrate.airflow.hooks.neli import NeliHook
    from neli_orchestrate.airflow.operators.fenced import fenced
    from neli_orchestrate.airflow.operators.gate import LeaderGateOperator
    from neli_orchestrate.airflow.operators.spark_submit import FencedSparkSubmitOperator
    from neli_orchestrate.airflow.sensors.leader import NeliLeaderSensor

__all__ = [
    "FencedSparkSubmitOperator",
    "LeaderGateOperator",
    "NeliHook",
    "NeliLeaderSensor",
    "fenced",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'neli_orchestrate.airflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
