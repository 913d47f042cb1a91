"""Token-checked Delta writes without Spark (delta-rs): they live in
:mod:`neli_orchestrate.sinks.delta`, next to the Spark writer they share keys and metadata with.

The names below stay importable from here.
"""

from __future__ import annotations

from neli_orchestrate.sinks.delta import DeltaCommit, DeltaCommitError, write_deltalake_fenced

__all__ = ["DeltaCommit", "DeltaCommitError", "write_deltalake_fenced"]
