"""Singleton metrics into Airflow's own ``Stats`` (StatsD, Datadog or OpenTelemetry).

Airflow initialises its metrics backend in every task process from the ``[metrics]`` section
(``statsd_on``, ``otel_on``, ...); this forwards each :class:`~neli_orchestrate.metrics.MetricEvent`
to it, so NELI's numbers land wherever the deployment already sends ``ti.finish`` and
``task.duration``. Names: ``neli.<event>`` (``neli.claim``, ``neli.skip``, ``neli.takeover``,
``neli.fence``, ``neli.leader_acquired``, ``neli.leader_lost``, ``neli.wait``,
``neli.give_up``, ``neli.spark_unconfirmed_kill``) and the timer ``neli.time_to_lead``; tags
``role``, ``deployment`` and ``outcome`` (where the backend takes tags). With metrics off in
``[metrics]``, nothing is sent. The scheduler's liveness supervisor
(:mod:`neli_orchestrate.airflow.liveness`) sends the gauge :data:`LIVENESS_ANNOUNCER_UP`.
"""

from __future__ import annotations

import datetime

from neli_orchestrate.metrics import MetricEvent

#: Prefix of every metric this provider sends.
PREFIX = "neli"

#: Gauge, 1 while the deployment's liveness announcer runs, 0 while it cannot (tags
#: ``deployment``, ``component``). A contract: dashboards and alerts use this name.
LIVENESS_ANNOUNCER_UP = f"{PREFIX}.liveness_announcer_up"


def stat_name(event: MetricEvent) -> str:
    return f"{PREFIX}.{event.name.value}"


def to_airflow_stats(event: MetricEvent) -> None:
    """The :data:`~neli_orchestrate.metrics.MetricsHook` the provider's hook passes to Singleton."""
    from airflow.sdk.observability import stats

    if event.is_timing:
        stats.timing(stat_name(event), datetime.timedelta(seconds=event.value), tags=event.tags)
    else:
        stats.incr(stat_name(event), tags=event.tags)


def gauge(name: str, value: float, tags: dict[str, str]) -> None:
    """Set a gauge in Airflow's ``Stats`` (a process outside a task initialises them first:
    :func:`init_stats`)."""
    from airflow.sdk.observability import stats

    stats.gauge(name, value, tags=tags)


def init_stats() -> None:
    """Initialise Airflow's ``Stats`` from ``[metrics]`` in a process Airflow did not start as a
    task (the task runner does this itself)."""
    from airflow.configuration import conf
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics import stats_utils

    stats.initialize(factory=stats_utils.get_stats_factory(),
                     export_legacy_names=conf.getboolean("metrics", "legacy_names_on",
                                                         fallback=False))
