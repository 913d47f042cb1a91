"""Write a run's DataFrame to an Apache Iceberg table only if its fencing token is current.

Usage::

    spark = SparkSession.builder.config(map=iceberg_catalog_conf("lake", "/data/warehouse"))...
    commit = write_iceberg_fenced(df, "lake.flights.daily_performance", run.run_key, run.token,
                                  role=run.role, deployment=run.deployment)
    commit.snapshot_id                # the snapshot whose summary carries neli.token

Each write records the token in its snapshot summary (``neli.token``, with ``neli.role``,
``neli.run-key``, ``neli.deployment``; the ``snapshot-property.*`` write option). The refusal is a
*conditional commit* built from Iceberg's optimistic concurrency, not a read-then-write race:

1. Load the table's current metadata once: its current snapshot ``S`` and, from every snapshot
   still in it, the highest token recorded for this role and run key. A higher token raises
   :class:`~neli_orchestrate.errors.StaleTokenError`; an equal one is an idempotent no-op.
2. Write with ``overwrite(<partition column> = <run key>)`` (replace the run key's rows),
   ``isolation-level=serializable`` and ``validate-from-snapshot-id=S``. At commit, Iceberg
   re-reads the table and fails the commit with a ``ValidationException`` if any snapshot after
   ``S`` added or deleted data matching the run key's filter. A commit by another token for the
   run key between step 1 and the pointer swap is such a snapshot, so the token read in step 1
   is still the highest at the moment this commit lands; the swap of the metadata pointer
   itself is atomic (catalog compare-and-swap).
3. On a validation failure, go back to 1 (which raises if the winner's token is higher).

So two racing writers of one run key cannot both commit from the same ``S``; the higher token
ends up committed and a lower one raises, whatever the order.

.. note:: Limits, stated honestly:

   - The check relies on the competing commit touching the run key's data files. An owner
     that commits an *empty* DataFrame adds no file, and a later stale writer that started
     before it is not refused by validation (step 1 still refuses a stale writer that starts
     after it). The sink therefore refuses empty DataFrames unless ``allow_empty=True``.
   - Tokens are read from the snapshots kept in table metadata. ``expire_snapshots`` removes
     old snapshots and their summaries; a writer whose token is older than every kept snapshot
     of its run key is only refused through step 2 (if it started before the newer commit).
     Keep snapshots for longer than a zombie can be paused (Iceberg's default is 5 days).
   - The catalog must give an atomic compare-and-swap of the metadata pointer. The Hadoop
     catalog does it with a rename: safe on local disks and HDFS, *not* on S3/GCS/ABFS; use a
     REST, JDBC, Glue, Nessie or Hive catalog there.
   - Writers that bypass this function are not checked against the token, and rows of ``df``
     outside the run key's partition are appended (the overwrite filter replaces only the run
     key's rows; Iceberg does not check written rows against it).

The checks read Iceberg's JVM ``Table`` through py4j: classic PySpark sessions only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from neli_orchestrate.claim import check_token
from neli_orchestrate.errors import ConfigError, NeliError, StaleTokenError

logger = logging.getLogger(__name__)

DEFAULT_CONFLICT_RETRIES = 3

TOKEN_PROPERTY = "neli.token"
ROLE_PROPERTY = "neli.role"
RUN_KEY_PROPERTY = "neli.run-key"
DEPLOYMENT_PROPERTY = "neli.deployment"

_CONFLICT_MARKERS = (
    "org.apache.iceberg.exceptions.ValidationException",
    "org.apache.iceberg.exceptions.CommitFailedException",
    "Found conflicting files",
    "Found new conflicting",
)


class IcebergCommitError(NeliError):
    """A token-checked Iceberg write could not complete (repeated conflicts, unexpected state)."""


@dataclass(frozen=True)
class IcebergCommit:
    """Outcome of :func:`write_iceberg_fenced`."""

    table: str
    run_key: str
    token: int
    #: False when this token's write had already been committed (an idempotent repeat).
    committed: bool
    #: The snapshot that carries the token in its summary.
    snapshot_id: int


def iceberg_catalog_conf(name: str, warehouse: str, *, extensions: bool = True) -> dict[str, str]:
    """Return Spark settings for an Iceberg Hadoop catalog ``name`` on a warehouse directory.

    The catalog's table cache is off so each read sees the latest commit. A Hadoop catalog is
    safe on local disks and HDFS only (see the module notes); other catalogs are a different
    ``spark.sql.catalog.<name>.type`` away.
    """
    conf = {
        f"spark.sql.catalog.{name}": "org.apache.iceberg.spark.SparkCatalog",
        f"spark.sql.catalog.{name}.type": "hadoop",
        f"spark.sql.catalog.{name}.warehouse": warehouse,
        f"spark.sql.catalog.{name}.cache-enabled": "false",
    }
    if extensions:
        conf["spark.sql.extensions"] = (
            "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
        )
    return conf


def _load_table(spark: Any, table: str) -> Any:
    jvm = spark._jvm
    if jvm is None:  # pragma: no cover - Spark Connect sessions have no JVM gateway
        raise ConfigError("token-checked Iceberg writes need a classic (non-Connect) SparkSession")
    loaded = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, table)
    loaded.refresh()
    return loaded


def _tokens(jtable: Any, role: str | None, run_key: str) -> list[tuple[int, int]]:
    """(token, snapshot id) of every snapshot in ``jtable``'s metadata for role and run key."""
    found = []
    for snapshot in jtable.snapshots():
        summary = snapshot.summary()
        if summary.get(RUN_KEY_PROPERTY) != run_key or summary.get(ROLE_PROPERTY) != (role or ""):
            continue
        raw = summary.get(TOKEN_PROPERTY)
        if raw is not None:
            found.append((int(raw), int(snapshot.snapshotId())))
    return found


def committed_tokens(spark: Any, table: str, run_key: str, *, role: str | None = None
                     ) -> list[tuple[int, int]]:
    """Return ``(token, snapshot id)`` of the table's kept snapshots for role and run key."""
    return _tokens(_load_table(spark, table), role, run_key)


def _is_conflict(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return any(marker in text for marker in _CONFLICT_MARKERS)


def write_iceberg_fenced(
    df: Any,
    table: str,
    run_key: str,
    token: int,
    *,
    role: str | None = None,
    deployment: str | None = None,
    partition_column: str = "date",
    partition_value: Any = None,
    options: Mapping[str, str] | None = None,
    conflict_retries: int = DEFAULT_CONFLICT_RETRIES,
    allow_empty: bool = False,
) -> IcebergCommit:
    """Replace ``run_key``'s rows of the Iceberg ``table`` with ``df``, refusing a stale token.

    ``table`` must exist (create it partitioned by ``partition_column``); its rows with
    ``partition_column = partition_value`` (default: the run key) are replaced. A DataFrame
    without that column gets it as a literal.

    Raises :class:`~neli_orchestrate.errors.StaleTokenError` when a higher token for the role
    and run key is committed before this write or wins the race against it, and
    :class:`IcebergCommitError` after ``conflict_retries`` lost races.
    """
    from pyspark.sql import functions as F

    check_token(token)
    if not isinstance(run_key, str) or not run_key:
        raise ConfigError(f"run_key must be a non-empty string, got {run_key!r}")
    value = run_key if partition_value is None else partition_value
    spark = df.sparkSession
    if partition_column not in df.columns:
        df = df.withColumn(partition_column, F.lit(value))
    if not allow_empty and df.isEmpty():
        raise ConfigError(
            f"refusing to commit an empty DataFrame for run key {run_key!r} of {table}: an empty "
            "overwrite adds no data file, so a stale writer racing with it would not be "
            "refused (pass allow_empty=True to accept that)"
        )
    condition = F.col(partition_column) == F.lit(value)

    for attempt in range(conflict_retries + 1):
        jtable = _load_table(spark, table)
        current = jtable.currentSnapshot()
        tokens = _tokens(jtable, role, run_key)
        highest = max(tokens, default=None)
        if highest is not None and highest[0] > token:
            raise StaleTokenError(
                f"Iceberg table {table}: token {token} is stale for run key {run_key!r} "
                f"(role {role!r}); token {highest[0]} is already committed in snapshot "
                f"{highest[1]}, nothing was written",
                token=token,
                committed=highest[0],
            )
        if highest is not None and highest[0] == token:
            logger.info("Iceberg %s: token %d already committed for %s", table, token, run_key)
            return IcebergCommit(table, run_key, token, committed=False, snapshot_id=highest[1])
        writer = (
            df.writeTo(table)
            .option("isolation-level", "serializable")
            .option(f"snapshot-property.{TOKEN_PROPERTY}", str(token))
            .option(f"snapshot-property.{ROLE_PROPERTY}", role or "")
            .option(f"snapshot-property.{RUN_KEY_PROPERTY}", run_key)
            .option(f"snapshot-property.{DEPLOYMENT_PROPERTY}", deployment or "")
        )
        if current is not None:
            writer = writer.option("validate-from-snapshot-id", str(current.snapshotId()))
        for key, option in (options or {}).items():
            writer = writer.option(key, option)
        try:
            writer.overwrite(condition)
        except Exception as exc:
            if not _is_conflict(exc):
                raise
            logger.info("Iceberg %s: commit of token %d lost a race (try %d): %s",
                        table, token, attempt + 1, str(exc).splitlines()[0][:300])
            continue
        mine = [snap for tok, snap in _tokens(_load_table(spark, table), role, run_key)
                if tok == token]
        if not mine:
            raise IcebergCommitError(
                f"Iceberg table {table}: no snapshot carries token {token} for {run_key!r} "
                "after the write"
            )
        logger.info("Iceberg %s: committed token %d for %s in snapshot %d",
                    table, token, run_key, mine[-1])
        return IcebergCommit(table, run_key, token, committed=True, snapshot_id=mine[-1])
    raise IcebergCommitError(
        f"Iceberg table {table}: token {token} for {run_key!r} lost {conflict_retries + 1} "
        "commit races in a row; another writer keeps committing to the partition"
    )
