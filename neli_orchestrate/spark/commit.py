"""The token commit guard for directories: it lives in :mod:`neli_orchestrate.sinks.directory`.

The names below stay importable from here (``from neli_orchestrate.spark.commit import ...``).
"""

from __future__ import annotations

from neli_orchestrate.sinks.directory import (
    DEFAULT_LOCK_TIMEOUT,
    HIGH_WATER_FORMAT,
    INTERNAL_DIR,
    MARKER_FORMAT,
    MARKER_NAME,
    CommitConflictError,
    CommitError,
    CommitLockTimeout,
    CommitMarker,
    CommitMarkerError,
    StagedOutput,
    TokenCommitGuard,
    commit_output,
    escape_run_key,
)

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "HIGH_WATER_FORMAT",
    "INTERNAL_DIR",
    "MARKER_FORMAT",
    "MARKER_NAME",
    "CommitConflictError",
    "CommitError",
    "CommitLockTimeout",
    "CommitMarker",
    "CommitMarkerError",
    "StagedOutput",
    "TokenCommitGuard",
    "commit_output",
    "escape_run_key",
]
