"""Token-checked Iceberg writes without Spark (pyiceberg): they live in
:mod:`neli_orchestrate.sinks.iceberg`, next to the Spark writer they share keys and properties with.

The names below stay importable from here.
"""

from __future__ import annotations

from neli_orchestrate.sinks.iceberg import IcebergCommit, IcebergCommitError, write_pyiceberg_fenced

__all__ = ["IcebergCommit", "IcebergCommitError", "write_pyiceberg_fenced"]
