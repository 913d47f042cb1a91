"""Token-checked Iceberg writes without Spark (pyiceberg) and the Dagster IO manager on them.

``write_pyiceberg_fenced`` lives in :mod:`neli_orchestrate.sinks.iceberg`, next to the Spark
writer it shares keys and properties with; :class:`NeliIcebergIOManager` in
:mod:`neli_orchestrate.sinks.io_managers`. Both stay importable from here.
"""

from __future__ import annotations

from neli_orchestrate.sinks.iceberg import IcebergCommit, IcebergCommitError, write_pyiceberg_fenced
from neli_orchestrate.sinks.io_managers import NeliIcebergIOManager

__all__ = ["IcebergCommit", "IcebergCommitError", "NeliIcebergIOManager", "write_pyiceberg_fenced"]
