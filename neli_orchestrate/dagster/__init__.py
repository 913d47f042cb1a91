"""Dagster integration: exactly-once singleton ops and assets across Dagster deployments.

- :class:`NeliResource` (a ``ConfigurableResource``): ``with neli.singleton(context) as run:``
  runs the block's work in one deployment per role and run key; a fence fails the step with
  ``dagster.Failure(allow_retries=False)``.
- :class:`NeliRun`: the handle inside the block (``should_run``, ``token``, ``metadata``,
  ``cancel_spark_on_fence``).
- :func:`leader_gate_op`: an op with an optional ``Nothing`` output; downstream steps are
  skipped in the deployments that do not run the run key.
- :func:`singleton_asset`: the asset form, with ``output_required=False``.

Those four are ``__all__``; the rest stays in its module (``gates``: ``GATE_OUTPUT``;
``run``: ``default_role``, ``default_run_key``; ``delta``, ``iceberg``: token-checked table
writes without Spark). See docs/guide/dagster.md.
"""

from __future__ import annotations

from neli_orchestrate.dagster.gates import leader_gate_op, singleton_asset
from neli_orchestrate.dagster.resource import NeliResource
from neli_orchestrate.dagster.run import NeliRun

__all__ = ["NeliResource", "NeliRun", "leader_gate_op", "singleton_asset"]
