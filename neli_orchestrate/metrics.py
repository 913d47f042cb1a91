"""What a :class:`~neli_orchestrate.Singleton` reports as metrics, and the hook that receives it.

A deployment that wants numbers passes a hook, ``Singleton(config, metrics=hook)``; the hook is
called with one :class:`MetricEvent` per event, on the thread where it happened (the watchdog
thread for a fence). Inside Airflow the provider's hook passes
:func:`neli_orchestrate.airflow.metrics.to_airflow_stats` (Airflow's ``Stats``: StatsD or
OpenTelemetry, whichever the deployment configured); inside Dagster the resource logs each
event through Dagster's logger. Plain Python::

    def metrics(event: MetricEvent) -> None:
        if event.is_timing:
            my_registry.observe(f"neli_{event.name}_seconds", event.value, role=event.role)
        else:
            my_registry.inc(f"neli_{event.name}_total", role=event.role)

    singleton = Singleton(config, metrics=metrics)

A hook that raises is logged and ignored: metrics never change what the protocol does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

log = logging.getLogger(__name__)

__all__ = ["Metric", "MetricEvent", "MetricsHook"]


class Metric(StrEnum):
    """The events a Singleton (or a fenced task) reports (``MetricEvent.name``); counters
    unless noted."""

    #: A claim was written (outcome ``RUN``, ``RETRY`` or ``TAKE_OVER``, by a gate or a retry).
    CLAIM = "claim"
    #: A run key's claim was taken over from another (dead or expired) claimant.
    TAKEOVER = "takeover"
    #: The run key was completed (here or elsewhere): nothing to run.
    SKIP = "skip"
    #: Another deployment leads or holds a live claim: asked to decide later.
    WAIT = "wait"
    #: ``max_attempts`` reached: the run key failed for good.
    GIVE_UP = "give_up"
    #: A run lost its leadership while it held a claim: the work is stopped, the try fails.
    FENCE = "fence"
    #: This deployment's member became leader of a role.
    LEADER_ACQUIRED = "leader_acquired"
    #: This deployment's member lost leadership it held (fenced, lease lapsed, partition lost).
    LEADER_LOST = "leader_lost"
    #: Timing, seconds: from starting to acquire a role to leading it.
    TIME_TO_LEAD = "time_to_lead"
    #: A stopped try (fence, timeout, SIGTERM, error) could not confirm that its remote Spark
    #: application (a cluster-mode driver) stopped: it may still be running. Reported by the
    #: fenced Airflow task, also where a fenced member can no longer write the ledger.
    SPARK_UNCONFIRMED_KILL = "spark_unconfirmed_kill"


@dataclass(frozen=True)
class MetricEvent:
    """One metric event: a count of 1, or a duration in seconds when :attr:`is_timing`."""

    name: Metric
    role: str
    deployment: str
    run_key: str | None = None
    #: The decision's outcome for claim/skip/wait/give_up/takeover, else None.
    outcome: str | None = None
    value: float = 1.0

    @property
    def is_timing(self) -> bool:
        return self.name is Metric.TIME_TO_LEAD

    @property
    def tags(self) -> dict[str, str]:
        """Low-cardinality tags for a metrics backend: role, deployment and outcome.

        The run key is left out on purpose (one series per date would explode a backend).
        """
        tags = {"role": self.role, "deployment": self.deployment}
        if self.outcome is not None:
            tags["outcome"] = self.outcome
        return tags


MetricsHook = Callable[[MetricEvent], None]


def emit(hook: MetricsHook | None, event: MetricEvent) -> None:
    """Call ``hook`` with ``event``; a failing hook is logged, never raised."""
    if hook is None:
        return
    try:
        hook(event)
    except Exception:  # noqa: BLE001 - metrics must not change what the protocol does
        log.warning("the metrics hook failed on %s; ignored", event, exc_info=True)
