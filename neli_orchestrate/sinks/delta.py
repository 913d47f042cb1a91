"""Token-checked writes to a Delta Lake table: through Spark, or through delta-rs without Spark.

Usage::

    # a Spark job (spark-submit, with the Delta jars)
    claim = read_neli_conf(spark)     # the claim the gate handed to spark-submit
    commit = write_delta_fenced(df, "s3a://lake/daily_performance", claim)
    # a Dagster asset or any Python process writing pandas / pyarrow (extra ``delta``)
    commit = write_deltalake_fenced(frame, "/lake/daily_performance", run.run_key, run.token,
                                    role="daily_flights")
    commit.version                    # the Delta version that holds this run's rows

Both writers record the token under the same key (:func:`delta_app_id`, made by
:func:`neli_orchestrate.sinks.keys.sink_key` from the role, the run key and the partition the
write replaces) as a Delta app transaction (``txnAppId``/``txnVersion`` in Spark,
``CommitProperties(app_transactions=...)`` in delta-rs), with the same ``userMetadata``, so Spark
jobs and Dagster assets can share a table and refuse each other's stale tokens.

- lower token than recorded: raises :class:`~neli_orchestrate.errors.StaleTokenError` naming both
  tokens; the table is not changed by this write;
- equal: the write's output is already committed; a no-op (``DeltaCommit.committed`` is False);
- higher (a take-over): replaces the partition (``replaceWhere`` / a predicate), so a re-run
  after a crash between commit and ``COMPLETED`` does not duplicate rows.

One token may write several partitions of one table under one run key: the key names the
partition, so each is committed (pass ``partition_value=``).

**Spark** (:func:`write_delta_fenced`). Delta records the app transaction atomically with the
commit and skips, *silently*, a write whose version is not above the recorded one; two writers
racing from the same table version cannot both commit (the loser's conflict check sees the
winner's transaction for the app id, or the partition it replaced). The sink reads the recorded
version before writing (higher: raise; equal: no-op) and after (higher: Delta skipped the write
or a newer one replaced it: raise), and retries a lost race from the top. The checks use Delta's
JVM classes through py4j: classic sessions, not Spark Connect. A first write to a missing path
creates version 0, which Delta's log store writes with put-if-absent, so two first writers race
like any other two.

**delta-rs** (:func:`write_deltalake_fenced`). delta-rs 1.6 does *not* skip a lower
``app_transactions`` version (it commits it, and the recorded version goes down), so the refusal
is a conditional commit: (1) load the table; if there is none, create it with
``DeltaTable.create(mode="error")`` (the log's put-if-absent of version 0: of two creators one
wins, the other reloads); (2) check the recorded version in that snapshot; (3) write *through
that loaded snapshot* with the partition's predicate, never by URI and never without a
predicate: a commit that added files to the partition after the snapshot fails ours
(``CommitFailedError``); (4) on that failure, back to (1). An empty output adds no file a racing
writer could conflict with, so it is refused unless ``allow_empty=True``.

**Table maintenance.** OPTIMIZE, VACUUM, checkpoints and log cleanup keep the app transactions
(they live in every checkpoint), so stale writers stay refused after them. The table property
``delta.setTransactionRetentionDuration`` lets Delta drop a recorded app transaction once the
interval has passed; both writers refuse a table that sets it (:class:`ConfigError` naming the
property and how to unset it). See docs/guide/spark.md for the table of maintenance operations.

Guarantees are Delta's commit on the storage: put-if-absent of the next log entry (local, HDFS,
ABFS, GCS natively; S3 through conditional writes or a multi-cluster LogStore / locking
provider). Writers that bypass these functions are not checked against the token.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from neli_orchestrate.claim import Claim, as_claim
from neli_orchestrate.errors import ConfigError, NeliError, StaleTokenError
from neli_orchestrate.sinks.keys import legacy_app_id, require_role, require_run_key, sink_key

logger = logging.getLogger(__name__)

#: Retries of a write that lost a Delta commit race to another writer of the same partition.
DEFAULT_CONFLICT_RETRIES = 3

#: ``userMetadata`` of each commit: JSON with these keys, readable in ``DESCRIBE HISTORY``.
USER_METADATA_KEYS = ("neli.token", "neli.role", "neli.run_key", "neli.deployment", "neli.app_id")

#: The table property that lets Delta forget a recorded token; the sinks refuse tables that set it.
RETENTION_PROPERTY = "delta.setTransactionRetentionDuration"
#: The Spark session default that gives new tables :data:`RETENTION_PROPERTY`.
RETENTION_SESSION_DEFAULT = (
    "spark.databricks.delta.properties.defaults.setTransactionRetentionDuration"
)

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
    """Outcome of :func:`write_delta_fenced` and :func:`write_deltalake_fenced`."""

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


def delta_app_id(
    role: str | None,
    run_key: str,
    *,
    partition_column: str = "date",
    partition_value: object = None,
) -> str:
    """Return the Delta transaction app id of a write: one per (role, run key, partition).

    The partition defaults to ``partition_column = run key``, as in the writers. ``role`` is
    required (ConfigError when None or empty).
    """
    value = run_key if partition_value is None else partition_value
    return sink_key(require_role(role), require_run_key(run_key), partition_column, value)


def _app_ids(role: str, run_key: str, column: str, value: object) -> tuple[str, str | None]:
    """The key this write records its token under, and the previous release's key to read."""
    return sink_key(role, run_key, column, value), legacy_app_id(role, run_key, column, value)


def _retention_refused(path: str, value: object) -> ConfigError:
    return ConfigError(
        f"Delta table {path} sets {RETENTION_PROPERTY}={value!r}: Delta then drops the token a "
        "run recorded once that interval has passed, and a stale writer could replace newer "
        "rows. The token-checked sinks refuse such a table: unset the property (ALTER TABLE "
        f"delta.`{path}` UNSET TBLPROPERTIES ('{RETENTION_PROPERTY}')) and do not set "
        f"{RETENTION_SESSION_DEFAULT}"
    )


def _stale(path: str, token: int, app_id: str, recorded: int) -> StaleTokenError:
    return StaleTokenError(
        f"Delta table {path}: token {token} is stale for {app_id}; token {recorded} is already "
        "committed, nothing was written",
        token=token,
        committed=recorded,
    )


def _newest(*versions: int | None) -> int | None:
    present = [v for v in versions if v is not None]
    return max(present) if present else None


def _metadata_json(token: int, role: str, run_key: str, deployment: str | None,
                   app_id: str) -> str:
    return json.dumps(
        dict(zip(USER_METADATA_KEYS, (token, role, run_key, deployment, app_id), strict=True)),
        sort_keys=True,
    )


def _before_commit(stage: str, path: str) -> None:
    """Called right before each commit attempt (``stage``: create, write); tests hold a writer
    here to run another one first, deterministically."""


# -- Delta via Spark --------------------------------------------------------------------------


def committed_token(spark: Any, path: str, app_id: str) -> int | None:
    """Return the transaction version Delta recorded for ``app_id`` at ``path`` (None if none).

    Reads the latest table snapshot (not a cached one). None also when no table exists yet.
    """
    snapshot = _latest_snapshot(spark, path)
    return None if snapshot is None else _recorded(snapshot, app_id)


def _recorded(snapshot: Any, app_id: str | None) -> int | None:
    if app_id is None:
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


def _check_spark_retention(spark: Any, path: str, snapshot: Any | None) -> None:
    default = spark.conf.get(RETENTION_SESSION_DEFAULT, None)
    if default:
        raise _retention_refused(path, f"{default} (from {RETENTION_SESSION_DEFAULT})")
    if snapshot is not None:
        configured = snapshot.metadata().configuration().get(RETENTION_PROPERTY)
        if configured.isDefined():
            raise _retention_refused(path, configured.get())


def _is_conflict(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return any(marker in text for marker in _CONFLICT_MARKERS)


def _sql_literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def write_delta_fenced(
    df: Any,
    path: str,
    claim: Claim | str,
    token: int | None = None,
    *,
    role: str | None = None,
    deployment: str | None = None,
    partition_column: str = "date",
    partition_value: str | None = None,
    options: Mapping[str, str] | None = None,
    conflict_retries: int = DEFAULT_CONFLICT_RETRIES,
) -> DeltaCommit:
    """Replace a partition of the Delta table at ``path`` with ``df`` under ``token`` (Spark).

    ``claim`` is the run's :class:`~neli_orchestrate.claim.Claim` (``run.claim``,
    ``read_neli_conf(spark)``); the loose form passes the run key and ``token`` (with
    ``role=``, ``deployment=``) and builds that Claim.

    The partition is ``partition_column = partition_value`` (default: the run key); a DataFrame
    without that column gets it as a literal, and rows with another value make Delta refuse the
    write (its ``replaceWhere`` constraint check). A new table is created partitioned by it.
    ``role`` is required (ConfigError without it).

    Raises :class:`~neli_orchestrate.errors.StaleTokenError` when a higher token for the same
    role, run key and partition is recorded before or after the write, :class:`ConfigError` for
    a table that sets ``delta.setTransactionRetentionDuration``, and :class:`DeltaCommitError`
    after ``conflict_retries`` lost commit races.
    """
    claim = as_claim(claim, token, role=role, deployment=deployment)  # the loose form
    token, deployment = claim.token, claim.deployment
    role = require_role(claim.role)
    run_key = require_run_key(claim.run_key)
    value = run_key if partition_value is None else partition_value
    app_id, legacy = _app_ids(role, run_key, partition_column, value)
    spark = df.sparkSession
    if partition_column not in df.columns:
        from pyspark.sql import functions as F

        df = df.withColumn(partition_column, F.lit(value))
    metadata = _metadata_json(token, role, run_key, deployment, app_id)
    predicate = f"`{partition_column.replace('`', '``')}` = {_sql_literal(str(value))}"

    for attempt in range(conflict_retries + 1):
        snapshot = _latest_snapshot(spark, path)
        _check_spark_retention(spark, path, snapshot)
        before = None if snapshot is None else _newest(
            _recorded(snapshot, app_id), _recorded(snapshot, legacy))
        if before is not None and before > token:
            raise _stale(path, token, app_id, before)
        if before == token:
            assert snapshot is not None
            logger.info("Delta %s: token %d already committed for %s", path, token, app_id)
            return DeltaCommit(path, app_id, run_key, token, committed=False,
                               version=int(snapshot.version()))
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
            _before_commit("write", path)
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


# -- Delta via delta-rs -----------------------------------------------------------------------


def _load(uri: str, storage_options: Mapping[str, str] | None) -> Any:
    """The table's latest snapshot, or None when no table exists at ``uri`` yet."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(uri, storage_options=dict(storage_options or {}) or None)
    except TableNotFoundError:
        return None


def _create(uri: str, schema: Any, partition_column: str,
            storage_options: Mapping[str, str] | None) -> None:
    """Create the table as an empty version 0, with the log's put-if-absent; lose quietly if
    another writer created it first (the caller reloads either way)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    try:
        _before_commit("create", uri)
        DeltaTable.create(uri, schema, mode="error", partition_by=[partition_column],
                          storage_options=dict(storage_options or {}) or None)
        logger.info("Delta %s: created the table (version 0)", uri)
    except DeltaError as exc:
        if _load(uri, storage_options) is None:
            raise
        logger.info("Delta %s: another writer created the table first: %s",
                    uri, str(exc).splitlines()[0][:300])


def _rs_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def write_deltalake_fenced(
    data: Any,
    uri: str,
    claim: Claim | str,
    token: int | None = None,
    *,
    role: str | None = None,
    deployment: str | None = None,
    partition_column: str = "date",
    partition_value: str | None = None,
    storage_options: Mapping[str, str] | None = None,
    conflict_retries: int = DEFAULT_CONFLICT_RETRIES,
    allow_empty: bool = False,
) -> DeltaCommit:
    """Replace a partition of the Delta table at ``uri`` with ``data`` (pandas or pyarrow)
    under ``token``, without Spark (delta-rs).

    ``claim`` is the run's :class:`~neli_orchestrate.claim.Claim` (``run.claim``,
    ``read_neli_conf(spark)``); the loose form passes the run key and ``token`` (with
    ``role=``, ``deployment=``) and builds that Claim.

    The partition is ``partition_column = partition_value`` (default: the run key); rows with
    another value make delta-rs refuse the write. A missing table is created (empty version 0,
    put-if-absent) partitioned by it. Raises :class:`~neli_orchestrate.errors.StaleTokenError`
    if a higher token for the role, run key and partition is committed before the write or wins
    a race with it; :class:`ConfigError` for a missing role, an empty output (unless
    ``allow_empty``) or a table that sets ``delta.setTransactionRetentionDuration``.
    """
    import pyarrow as pa  # type: ignore[import-untyped]
    from deltalake import CommitProperties, Transaction, write_deltalake

    claim = as_claim(claim, token, role=role, deployment=deployment)  # the loose form
    token, deployment = claim.token, claim.deployment
    role = require_role(claim.role)
    run_key = require_run_key(claim.run_key)
    value = run_key if partition_value is None else partition_value
    app_id, legacy = _app_ids(role, run_key, partition_column, value)
    table = data if isinstance(data, pa.Table) else pa.Table.from_pandas(data, preserve_index=False)
    if partition_column not in table.column_names:
        table = table.append_column(partition_column, pa.array([value] * table.num_rows))
    if not allow_empty and table.num_rows == 0:
        raise ConfigError(
            f"refusing to commit an empty table for run key {run_key!r} to {uri}: an empty "
            "overwrite adds no file, so a stale writer racing with it would not be refused "
            "(pass allow_empty=True to accept that)"
        )
    metadata = _metadata_json(token, role, run_key, deployment, app_id)
    predicate = f'"{partition_column}" = {_rs_literal(str(value))}'

    for attempt in range(conflict_retries + 1):
        current = _load(uri, storage_options)
        if current is None:
            _create(uri, table.schema, partition_column, storage_options)
            current = _load(uri, storage_options)
            if current is None:
                raise DeltaCommitError(f"Delta table {uri}: created, but cannot be loaded")
        configured = current.metadata().configuration.get(RETENTION_PROPERTY)
        if configured is not None:
            raise _retention_refused(uri, configured)
        recorded = _newest(current.transaction_version(app_id),
                           current.transaction_version(legacy) if legacy else None)
        if recorded is not None and recorded > token:
            raise _stale(uri, token, app_id, recorded)
        if recorded == token:
            logger.info("Delta %s: token %d already committed for %s", uri, token, app_id)
            return DeltaCommit(uri, app_id, run_key, token, committed=False,
                               version=int(current.version()))
        properties = CommitProperties(
            app_transactions=[Transaction(app_id, token)],
            custom_metadata={"userMetadata": metadata},
        )
        try:
            _before_commit("write", uri)
            # Through the snapshot we checked, with the partition's predicate: a commit to the
            # partition after that snapshot makes delta-rs' conflict check refuse this one.
            write_deltalake(current, table, mode="overwrite", predicate=predicate,
                            commit_properties=properties)
        except Exception as exc:
            if not _rs_conflict(exc):
                raise
            logger.info("Delta %s: commit of token %d lost a race (try %d): %s",
                        uri, token, attempt + 1, str(exc).splitlines()[0][:300])
            continue
        after = _load(uri, storage_options)
        recorded_after = after.transaction_version(app_id) if after is not None else None
        if recorded_after is not None and recorded_after > token:
            raise StaleTokenError(
                f"Delta table {uri}: token {token} lost to token {recorded_after} for {app_id}",
                token=token,
                committed=recorded_after,
            )
        if recorded_after != token or after is None:
            raise DeltaCommitError(
                f"Delta table {uri}: after writing token {token} the log records "
                f"{recorded_after} for {app_id}"
            )
        logger.info("Delta %s: committed token %d for %s at version %d",
                    uri, token, app_id, after.version())
        return DeltaCommit(uri, app_id, run_key, token, committed=True,
                           version=int(after.version()))
    raise DeltaCommitError(
        f"Delta table {uri}: token {token} for {app_id} lost {conflict_retries + 1} commit races "
        "in a row; another writer keeps committing to the partition"
    )


def _rs_conflict(exc: BaseException) -> bool:
    from deltalake.exceptions import CommitFailedError

    return isinstance(exc, CommitFailedError)
