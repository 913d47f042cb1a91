"""Write a run's DataFrame to a Delta Lake table only if its fencing token is current.

Usage::

    run = read_neli_conf(spark)
    commit = write_delta_fenced(df, "s3a://lake/daily_performance", run.run_key, run.token,
                                role=run.role, deployment=run.deployment)
    commit.version                    # the Delta version that holds this run's rows

The token reaches Delta's own commit protocol: every write carries ``txnAppId`` (derived from
role and run key, :func:`delta_app_id`) and ``txnVersion`` (the token). Delta records the pair
in its log atomically with the commit, and a write whose version is not above the recorded one
for that app id is skipped, also atomically: two writers racing from the same table version
cannot both commit, because the loser's conflict check sees the winner's transaction for the
app id (``ConcurrentTransactionException``).

Delta skips quietly; this module makes the outcome loud. Before writing it reads the version
recorded for the app id and raises :class:`~neli_orchestrate.errors.StaleTokenError` (naming
both tokens) when it is higher; after writing it reads it again, and a higher one means the write
was skipped or superseded: it raises too. A Delta conflict (another writer committed to the
partition while this one ran) is retried from the top, so the higher token of two racing writers
always ends up committed and the lower one raises.

- lower token than recorded: raises, the table is not changed by this write;
- equal: the run's output is already committed; a no-op (``DeltaCommit.committed`` is False);
- higher (a take-over): replaces the run key's partition (``replaceWhere``), so a re-run after a
  crash between commit and ``COMPLETED`` does not duplicate rows.

The table needs the Delta jars on the classpath (``spark.jars``, see
:func:`neli_orchestrate.testing.table_jars.ensure_table_format_jars`) and the session settings
of :func:`delta_session_conf`. The checks use the Delta JVM classes through py4j, so this works
with classic PySpark sessions (local, standalone, YARN, Kubernetes), not with Spark Connect.

.. note:: What is guaranteed is Delta's: a commit is atomic where the storage gives Delta a
   put-if-absent for log entries (local and HDFS paths, ABFS, GCS; S3 needs a multi-cluster
   LogStore such as the DynamoDB one, or S3's conditional writes where the Delta release uses
   them). Writers that bypass this function (a plain ``df.write.format("delta")``) are not
   checked against the token.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from neli_orchestrate.claim import check_token
from neli_orchestrate.errors import ConfigError, NeliError, StaleTokenError

logger = logging.getLogger(__name__)

#: Retries of a write that lost a Delta commit race to another writer of the same partition.
DEFAULT_CONFLICT_RETRIES = 3

#: ``userMetadata`` of each commit: JSON with these keys, readable in ``DESCRIBE HISTORY``.
USER_METADATA_KEYS = ("neli.token", "neli.role", "neli.run_key", "neli.deployment", "neli.app_id")

_CONFLICT_MARKERS = (
    "io.delta.exceptions.",
    "ConcurrentModificationException",
    "DELTA_CONCURRENT",
    "DELTA_METADATA_CHANGED",
    "DELTA_PROTOCOL_CHANGED",
)


class DeltaCommitError(NeliError):
    """A token-checked Delta write could not complete (repeated conflicts, unexpected state)."""


@dataclass(frozen=True)
class DeltaCommit:
    """Outcome of :func:`write_delta_fenced`."""

    path: str
    app_id: str
    run_key: str
    token: int
    #: False when this token's write had already been committed (an idempotent repeat).
    committed: bool
    #: The table version read after the write (the commit's own version unless a newer
    #: writer committed in between, which the token check would then have reported).
    version: int


def delta_session_conf() -> dict[str, str]:
    """Return the Spark session settings that enable Delta (extension and catalog)."""
    return {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    }


def delta_app_id(role: str | None, run_key: str) -> str:
    """Return the Delta transaction app id of a run key: one per (role, run key)."""
    if not isinstance(run_key, str) or not run_key:
        raise ConfigError(f"run_key must be a non-empty string, got {run_key!r}")
    return f"neli-orchestrate/{role or '-'}/{run_key}"


def committed_token(spark: Any, path: str, app_id: str) -> int | None:
    """Return the transaction version Delta recorded for ``app_id`` at ``path`` (None if none).

    Reads the latest table snapshot (not a cached one). None also when no table exists yet.
    """
    snapshot = _latest_snapshot(spark, path)
    if snapshot is None:
        return None
    recorded = snapshot.transactions().get(app_id)
    return int(recorded.get()) if recorded.isDefined() else None


def _delta_log(spark: Any, path: str) -> Any:
    jvm = spark._jvm
    if jvm is None:  # pragma: no cover - Spark Connect sessions have no JVM gateway
        raise ConfigError("token-checked Delta writes need a classic (non-Connect) SparkSession")
    return jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)


def _latest_snapshot(spark: Any, path: str) -> Any | None:
    log = _delta_log(spark, path)
    empty = spark._jvm.scala.Option.empty()
    # update(stalenessAcceptable, checkIfUpdatedSinceTs, catalogTableOpt): read the log's tail
    snapshot = log.update(False, empty, empty)
    return snapshot if int(snapshot.version()) >= 0 else None


def _is_conflict(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return any(marker in text for marker in _CONFLICT_MARKERS)


def _sql_literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def write_delta_fenced(
    df: Any,
    path: str,
    run_key: str,
    token: int,
    *,
    role: str | None = None,
    deployment: str | None = None,
    partition_column: str = "date",
    partition_value: str | None = None,
    options: Mapping[str, str] | None = None,
    conflict_retries: int = DEFAULT_CONFLICT_RETRIES,
) -> DeltaCommit:
    """Replace ``run_key``'s partition of the Delta table at ``path`` with ``df`` under ``token``.

    The partition is ``partition_column = partition_value`` (default: the run key); a DataFrame
    without that column gets it as a literal, and rows with another value make Delta refuse the
    write (its ``replaceWhere`` constraint check). A new table is created partitioned by it.

    Raises :class:`~neli_orchestrate.errors.StaleTokenError` when a higher token for the same
    role and run key is recorded before or after the write, and :class:`DeltaCommitError` after
    ``conflict_retries`` lost commit races.
    """
    check_token(token)
    app_id = delta_app_id(role, run_key)
    value = run_key if partition_value is None else partition_value
    spark = df.sparkSession
    if partition_column not in df.columns:
        from pyspark.sql import functions as F

        df = df.withColumn(partition_column, F.lit(value))
    metadata = json.dumps(
        dict(zip(USER_METADATA_KEYS, (token, role, run_key, deployment, app_id), strict=True)),
        sort_keys=True,
    )
    predicate = f"`{partition_column.replace('`', '``')}` = {_sql_literal(value)}"

    for attempt in range(conflict_retries + 1):
        before = committed_token(spark, path, app_id)
        if before is not None and before > token:
            raise StaleTokenError(
                f"Delta table {path}: token {token} is stale for {app_id}; token {before} is "
                "already committed, nothing was written",
                token=token,
                committed=before,
            )
        if before == token:
            version = int(_latest_snapshot(spark, path).version())  # type: ignore[union-attr]
            logger.info("Delta %s: token %d already committed for %s", path, token, app_id)
            return DeltaCommit(path, app_id, run_key, token, committed=False, version=version)
        writer = (
            df.write.format("delta")
            .mode("overwrite")
            .partitionBy(partition_column)
            .option("replaceWhere", predicate)
            .option("txnAppId", app_id)
            .option("txnVersion", str(token))
            .option("userMetadata", metadata)
        )
        for key, option in (options or {}).items():
            writer = writer.option(key, option)
        try:
            writer.save(path)
        except Exception as exc:
            if not _is_conflict(exc):
                raise
            logger.info("Delta %s: commit of token %d lost a race (try %d): %s",
                        path, token, attempt + 1, str(exc).splitlines()[0][:300])
            continue
        after = committed_token(spark, path, app_id)
        if after is not None and after > token:
            raise StaleTokenError(
                f"Delta table {path}: token {token} lost to token {after} for {app_id}; Delta "
                "skipped this write or a newer one replaced it",
                token=token,
                committed=after,
            )
        if after != token:
            raise DeltaCommitError(
                f"Delta table {path}: after writing token {token} the log records {after} for "
                f"{app_id}; was the write made without txnAppId/txnVersion?"
            )
        version = int(_latest_snapshot(spark, path).version())  # type: ignore[union-attr]
        logger.info("Delta %s: committed token %d for %s at version %d",
                    path, token, app_id, version)
        return DeltaCommit(path, app_id, run_key, token, committed=True, version=version)
    raise DeltaCommitError(
        f"Delta table {path}: token {token} for {app_id} lost {conflict_retries + 1} commit "
        "races in a row; another writer keeps committing to the partition"
    )


def delta_history(spark: Any, path: str) -> list[dict[str, Any]]:
    """Return the table's commits, oldest first, with the token each carried (if any).

    Each entry: ``version``, ``operation``, ``timestamp`` and the ``neli.*`` keys of the commit's
    ``userMetadata`` (``token``, ``role``, ``run_key``, ``deployment``, ``app_id``; None for
    commits not made by :func:`write_delta_fenced`). History is kept for the table's
    ``delta.logRetentionDuration`` (30 days by default).
    """
    rows = spark.sql(
        f"DESCRIBE HISTORY delta.`{path.replace('`', '``')}`"
    ).select("version", "operation", "timestamp", "userMetadata").collect()
    history = []
    for row in sorted(rows, key=lambda r: r["version"]):
        meta: dict[str, Any] = {}
        if row["userMetadata"]:
            try:
                meta = json.loads(row["userMetadata"])
            except ValueError:
                meta = {}
        entry: dict[str, Any] = {
            "version": int(row["version"]),
            "operation": row["operation"],
            "timestamp": row["timestamp"],
        }
        for key in USER_METADATA_KEYS:
            entry[key.removeprefix("neli.")] = meta.get(key) if isinstance(meta, dict) else None
        history.append(entry)
    return history
