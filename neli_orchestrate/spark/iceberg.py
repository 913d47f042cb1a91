"""Token-checked Iceberg writes through Spark: they live in :mod:`neli_orchestrate.sinks.iceberg`.

The names below stay importable from here (``from neli_orchestrate.spark.iceberg import ...``).
"""

from __future__ import annotations

from neli_orchestrate.sinks.iceberg import (
    DEFAULT_CONFLICT_RETRIES,
    DEPLOYMENT_PROPERTY,
    ROLE_PROPERTY,
    RUN_KEY_PROPERTY,
    TOKEN_PROPERTY,
    IcebergCommit,
    IcebergCommitError,
    committed_tokens,
    iceberg_catalog_conf,
    write_iceberg_fenced,
)

__all__ = [
    "DEFAULT_CONFLICT_RETRIES",
    "DEPLOYMENT_PROPERTY",
    "ROLE_PROPERTY",
    "RUN_KEY_PROPERTY",
    "TOKEN_PROPERTY",
    "IcebergCommit",
    "IcebergCommitError",
    "committed_tokens",
    "iceberg_catalog_conf",
    "write_iceberg_fenced",
]
