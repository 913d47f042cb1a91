"""Token-checked Delta writes through Spark: they live in :mod:`neli_orchestrate.sinks.delta`.

The names below stay importable from here (``from neli_orchestrate.spark.delta import ...``).
"""

from __future__ import annotations

from neli_orchestrate.sinks.delta import (
    DEFAULT_CONFLICT_RETRIES,
    USER_METADATA_KEYS,
    DeltaCommit,
    DeltaCommitError,
    committed_token,
    delta_app_id,
    delta_history,
    delta_session_conf,
    write_delta_fenced,
)

__all__ = [
    "DEFAULT_CONFLICT_RETRIES",
    "USER_METADATA_KEYS",
    "DeltaCommit",
    "DeltaCommitError",
    "committed_token",
    "delta_app_id",
    "delta_history",
    "delta_session_conf",
    "write_delta_fenced",
]
