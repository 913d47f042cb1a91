"""Token-checked Delta writes without Spark (delta-rs) and the Dagster IO manager on them.

``write_deltalake_fenced`` lives in :mod:`neli_orchestrate.sinks.delta`, next to the Spark writer
it shares keys and metadata with; :class:`NeliDeltaIOManager` in
:mod:`neli_orchestrate.sinks.io_managers`. Both stay importable from here.
"""

from __future__ import annotations

from neli_orchestrate.sinks.delta import DeltaCommit, DeltaCommitError, write_deltalake_fenced
from neli_orchestrate.sinks.io_managers import NeliDeltaIOManager

__all__ = ["DeltaCommit", "DeltaCommitError", "NeliDeltaIOManager", "write_deltalake_fenced"]
