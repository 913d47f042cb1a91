"""Write a PySpark DataFrame as Parquet through the token commit guard.

Usage::

    claim = read_neli_conf(spark)
    marker = write_parquet_fenced(df, "/data/daily_performance", claim, partition_column="date")

pyspark is only needed by the DataFrame you pass; this module imports nothing from it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from neli_orchestrate.claim import Claim, as_claim
from neli_orchestrate.sinks.directory import (
    DEFAULT_LOCK_TIMEOUT,
    CommitError,
    CommitMarker,
    TokenCommitGuard,
)


def write_parquet_fenced(
    df: Any,
    root: str | os.PathLike[str],
    claim: Claim | str,
    token: int | None = None,
    *,
    role: str | None = None,
    deployment: str | None = None,
    attempt: int | None = None,
    partition_column: str | None = None,
    compression: str | None = None,
    options: Mapping[str, str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
    fsync_data: bool = False,
) -> CommitMarker:
    """Write ``df`` as Parquet for the claim's run key; publish it only if its token is current.

    ``claim`` is the run's :class:`~neli_orchestrate.claim.Claim` (``run.claim``,
    ``read_neli_conf(spark)``); the loose form passes the run key and ``token`` (with
    ``role=``, ``deployment=``, ``attempt=``) and builds that Claim.

    Spark writes into the guard's private staging directory (a local ``file://`` path, so a
    cluster default filesystem such as HDFS is never used by accident); the guard then
    publishes it under ``root`` or raises ``StaleTokenError`` and leaves the committed output
    untouched. A stale token is detected before Spark writes anything, and again at publish.

    With ``partition_column`` the output lands in ``root/<column>=<run key>`` and that column
    is dropped from the data (Spark restores it from the directory name on read).
    Driver and executors must share the filesystem of ``root`` (local mode, or a shared mount).
    """
    claim = as_claim(claim, token, role=role, deployment=deployment, attempt=attempt)  # loose
    guard = TokenCommitGuard(
        root, partition_column=partition_column, lock_timeout=lock_timeout, fsync_data=fsync_data
    )
    if partition_column is not None and partition_column in df.columns:
        df = df.drop(partition_column)
    with guard.stage(claim, metadata=metadata) as staged:
        writer = df.write.mode("overwrite")  # the staging directory is ours alone
        if compression is not None:
            writer = writer.option("compression", compression)
        for key, value in (options or {}).items():
            writer = writer.option(key, value)
        writer.parquet(staged.path.as_uri())
    if staged.marker is None:  # pragma: no cover - a clean __exit__ always commits
        raise CommitError(f"run key {claim.run_key!r} was not published")
    return staged.marker
