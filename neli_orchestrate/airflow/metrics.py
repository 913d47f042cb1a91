"""Singleton metrics into Airflow's own ``Stats`` (StatsD, Datadog or OpenTelemetry).

Airflow initialises its metrics backend in every task process from the ``[metrics]`` section
(``statsd_on``, ``otel_on``, ...); this forwards each :class:`~neli_orchestrate.metrics.MetricEvent`
to it, so NELI's numbers land wherever the deployment already sends ``ti.finish`` and
``task.duration``. Names: ``neli.<event>`` (``neli.claim``, ``neli.skip``, ``neli.takeover``,
``neli.fence``, ``neli.leader_acquired``, ``neli.leader_lost``, ``neli.wait``,
``neli.give_up``, ``neli.spark_unconfirmed_kill``) and the timer ``neli.time_to_lead``; tags
``role``, ``deployment`` and ``outcome`` (where the backend takes tags). With metrics off in
``[metrics]``, nothing is sent.
"""

from __future__ import annotations

import datetime

from neli_orchestrate.metrics import MetricEvent

#: Prefix of every metric this provider sends.
PREFIX = "neli"


def stat_name(event: MetricEvent) -> str:
    return f"{PREFIX}.{event.name.value}"


def to_airflow_stats(event: MetricEvent) -> None:
    """The :data:`~neli_orchestrate.metrics.MetricsHook` the provider's hook passes to Singleton."""
    from airflow.sdk.observability import stats

    if event.is_timing:
        stats.timing(stat_name(event), datetime.timedelta(seconds=event.value), tags=event.tags)
    else:
        stats.incr(stat_name(event), tags=event.tags)
