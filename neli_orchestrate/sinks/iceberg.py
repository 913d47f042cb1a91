"""Token-checked writes to an Apache Iceberg table: through Spark, or through pyiceberg.

Usage::

    spark = SparkSession.builder.config(map=iceberg_catalog_conf("lake", "/data/warehouse"))...
    commit = write_iceberg_fenced(df, "lake.flights.daily_performance", read_neli_conf(spark))
    # without Spark (extra ``iceberg``): a pyiceberg catalog
    catalog = SqlCatalog("lake", uri="sqlite:////data/catalog.db", warehouse="file:///data/wh")
    commit = write_pyiceberg_fenced(frame, catalog, "flights.daily_performance", run.run_key,
                                    run.token, role="daily_flights")
    commit.snapshot_id                # the snapshot whose summary carries neli.token

Where the token is kept. Each write records it under the sink key
(:func:`neli_orchestrate.sinks.keys.sink_key`: role, run key and the partition the write
replaces) in two places:

- the snapshot summary (``neli.token``, ``neli.key``, ``neli.role``, ``neli.run-key``,
  ``neli.deployment``; Spark's ``snapshot-property.*`` write option);
- a *table property* ``neli.token:<key>`` (the high-water mark). Table properties live in the
  table metadata and survive ``expire_snapshots``, ``rewrite_data_files`` and every other
  snapshot change.

Both are written in the *same* metadata commit as the data, so no moment exists at which the
data is visible and the mark is not. pyiceberg does it with one transaction. Spark's writer
cannot add a table property to its own commit, so the Spark sink writes the data to a staging
branch ``neli_stage_<token>_<id>`` (invisible to readers of ``main``) and then publishes it in
one compare-and-swap of the table metadata through the JVM API: ``main`` set to the staged
snapshot, the property set, the branch dropped. It is refused if ``main`` moved since the token
was read, so that single compare-and-swap is the conditional commit.

The refusal is a *conditional commit* built from Iceberg's optimistic concurrency:

1. Load the table's current metadata once: its current snapshot ``S`` and the highest token
   for the key (property, kept snapshot summaries, and the previous release's summaries for
   the run key's own partition). A higher token raises
   :class:`~neli_orchestrate.errors.StaleTokenError`; an equal one is an idempotent no-op.
2. Overwrite the partition (``<column> = <value>``). pyiceberg validates from ``S`` through the
   table it loaded: a commit after ``S`` that added or deleted data of the partition fails ours
   (``ValidationException``). Spark stages the overwrite on a branch created at ``S`` and
   publishes it by moving ``main`` from ``S`` to it, which fails if *any* commit landed on
   ``main`` after ``S`` (stricter: an unrelated commit also makes the write go round again).
   Either way the token read in step 1 is still the highest when our pointer swap lands; the
   swap itself is the catalog's compare-and-swap.
3. On a validation failure, go back to 1 (which raises if the winner's token is higher).

Only snapshots that are ancestors of ``main`` count as committed: a staged snapshot a writer
never published (it lost the race or died) carries its token in its summary but is not a
commit. A writer that dies between staging and publishing leaves its ``neli_stage_*`` branch
behind; it is harmless (never read) and ``ALTER TABLE ... DROP BRANCH`` removes it.

.. note:: Limits, stated honestly:

   - Step 2 relies on the competing commit touching the partition's data files: an owner
     that commits an *empty* output adds none, so empty outputs are refused unless
     ``allow_empty=True``.
   - The catalog must swap the metadata pointer atomically. The Hadoop catalog does it with a
     rename: safe on local disks and HDFS, *not* on S3/GCS/ABFS; use a REST, JDBC/SQL, Glue,
     Nessie or Hive catalog there.
   - Writers that bypass these functions are not checked against the token. Rows outside the
     partition are refused by pyiceberg's sink; Spark's overwrite appends them (Iceberg does
     not check written rows against the filter).

The Spark checks read Iceberg's JVM ``Table`` through py4j: classic PySpark sessions only.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from neli_orchestrate.claim import Claim, as_claim
from neli_orchestrate.errors import ConfigError, NeliError, StaleTokenError
from neli_orchestrate.sinks.keys import require_role, require_run_key, sink_key

logger = logging.getLogger(__name__)

DEFAULT_CONFLICT_RETRIES = 3

TOKEN_PROPERTY = "neli.token"
KEY_PROPERTY = "neli.key"
ROLE_PROPERTY = "neli.role"
RUN_KEY_PROPERTY = "neli.run-key"
DEPLOYMENT_PROPERTY = "neli.deployment"
#: Table property ``neli.token:<sink key>``: the highest token committed for the key.
HIGH_WATER_PREFIX = "neli.token:"
#: Prefix of the branch a Spark write is staged on before it is published to ``main``.
STAGE_BRANCH_PREFIX = "neli_stage_"

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
    """Outcome of :func:`write_iceberg_fenced` and :func:`write_pyiceberg_fenced`."""

    table: str
    run_key: str
    token: int
    #: False when this token's write had already been committed (an idempotent repeat).
    committed: bool
    #: The snapshot that carries the token in its summary (None for a repeat whose snapshot
    #: was expired: the token is then known from the table property only).
    snapshot_id: int | None


def high_water_property(key: str) -> str:
    """The table property that keeps the highest token committed for a sink key."""
    return f"{HIGH_WATER_PREFIX}{key}"


def _summary_token(summary: Mapping[str, Any], key: str, role: str, run_key: str,
                   legacy: bool) -> int | None:
    raw = summary.get(TOKEN_PROPERTY)
    if raw is None:
        return None
    recorded_key = summary.get(KEY_PROPERTY)
    if recorded_key is not None:
        return int(raw) if recorded_key == key else None
    # The previous release: no neli.key, role and run key as separate properties, and only the
    # run key's own partition.
    if legacy and summary.get(ROLE_PROPERTY) == role and summary.get(RUN_KEY_PROPERTY) == run_key:
        return int(raw)
    return None


def _highest(property_value: str | None, snapshots: list[tuple[int, int]]
             ) -> tuple[int, int | None] | None:
    """(token, snapshot id or None) of the highest token from the property and summaries."""
    best: tuple[int, int | None] | None = max(snapshots, default=None)
    if property_value is not None:
        mark = int(property_value)
        if best is None or mark > best[0]:
            best = (mark, None)
    return best


def _snapshot_properties(token: int, key: str, role: str, run_key: str,
                         deployment: str | None) -> dict[str, str]:
    return {
        TOKEN_PROPERTY: str(token),
        KEY_PROPERTY: key,
        ROLE_PROPERTY: role,
        RUN_KEY_PROPERTY: run_key,
        DEPLOYMENT_PROPERTY: deployment or "",
    }


def _stale(table: str, token: int, key: str, highest: tuple[int, int | None]) -> StaleTokenError:
    where = (f"in snapshot {highest[1]}" if highest[1] is not None
             else f"(table property {high_water_property(key)!r})")
    return StaleTokenError(
        f"Iceberg table {table}: token {token} is stale for {key}; token {highest[0]} is "
        f"already committed {where}, nothing was written",
        token=token,
        committed=highest[0],
    )


def _before_commit(stage: str, table: str) -> None:
    """Called right before each commit attempt (``write``; Spark also ``publish``) and right
    after a commit (``published``); tests hold a writer here to run another in between."""


# -- Iceberg via Spark ------------------------------------------------------------------------


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


def _jtokens(jtable: Any, key: str, role: str, run_key: str, legacy: bool
             ) -> list[tuple[int, int]]:
    """(token, snapshot id) of the kept snapshots of ``main`` (the current snapshot and its
    ancestors, oldest first) whose summary carries a token for the key. Snapshots only staged
    on a branch, never published, are not commits and are not read."""
    found = []
    snapshot = jtable.currentSnapshot()
    while snapshot is not None:
        token = _summary_token(snapshot.summary(), key, role, run_key, legacy)
        if token is not None:
            found.append((token, int(snapshot.snapshotId())))
        parent = snapshot.parentId()
        snapshot = jtable.snapshot(parent) if parent is not None else None
    found.reverse()
    return found


def _jhighest(jtable: Any, key: str, role: str, run_key: str, legacy: bool
              ) -> tuple[int, int | None] | None:
    return _highest(jtable.properties().get(high_water_property(key)),
                    _jtokens(jtable, key, role, run_key, legacy))


def committed_tokens(spark: Any, table: str, run_key: str, *, role: str | None = None,
                     partition_column: str = "date", partition_value: Any = None
                     ) -> list[tuple[int, int]]:
    """Return ``(token, snapshot id)`` of the kept snapshots of ``main`` (oldest first) that
    carry a token for the write's key; staged, never published snapshots are not included."""
    role, run_key = require_role(role), require_run_key(run_key)
    value = run_key if partition_value is None else partition_value
    key = sink_key(role, run_key, partition_column, value)
    return _jtokens(_load_table(spark, table), key, role, run_key, str(value) == run_key)


def _is_conflict(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return any(marker in text for marker in _CONFLICT_MARKERS)


def write_iceberg_fenced(
    df: Any,
    table: str,
    claim: Claim | str,
    token: int | None = None,
    *,
    role: str | None = None,
    deployment: str | None = None,
    partition_column: str = "date",
    partition_value: Any = None,
    options: Mapping[str, str] | None = None,
    conflict_retries: int = DEFAULT_CONFLICT_RETRIES,
    allow_empty: bool = False,
) -> IcebergCommit:
    """Replace a partition of the Iceberg ``table`` with ``df``, refusing a stale token (Spark).

    ``claim`` is the run's :class:`~neli_orchestrate.claim.Claim` (``run.claim``,
    ``read_neli_conf(spark)``); the loose form passes the run key and ``token`` (with
    ``role=``, ``deployment=``) and builds that Claim.

    ``table`` must exist (create it partitioned by ``partition_column``); its rows with
    ``partition_column = partition_value`` (default: the run key) are replaced. A DataFrame
    without that column gets it as a literal. ``role`` is required.

    Raises :class:`~neli_orchestrate.errors.StaleTokenError` when a higher token for the role,
    run key and partition is committed before this write or wins the race against it, and
    :class:`IcebergCommitError` after ``conflict_retries`` lost races.
    """
    from pyspark.sql import functions as F

    claim = as_claim(claim, token, role=role, deployment=deployment)  # the loose form
    token, deployment = claim.token, claim.deployment
    role = require_role(claim.role)
    run_key = require_run_key(claim.run_key)
    value = run_key if partition_value is None else partition_value
    key = sink_key(role, run_key, partition_column, value)
    legacy = str(value) == run_key
    spark = df.sparkSession
    if partition_column not in df.columns:
        df = df.withColumn(partition_column, F.lit(value))
    cached = False
    if not allow_empty:
        # Checked before writing; cached so the write reuses what the check computed instead
        # of computing the DataFrame a second time.
        df, cached = df.persist(), True
        if df.isEmpty():
            df.unpersist()
            raise ConfigError(
                f"refusing to commit an empty DataFrame for run key {run_key!r} of {table}: an "
                "empty overwrite adds no data file, so a stale writer racing with it would not "
                "be refused (pass allow_empty=True to accept that)"
            )
    condition = F.col(partition_column) == F.lit(value)
    try:
        return _write_spark(df, spark, table, key, role, run_key, token, deployment, legacy,
                            condition, options, conflict_retries)
    finally:
        if cached:
            df.unpersist()


def _write_spark(df: Any, spark: Any, table: str, key: str, role: str, run_key: str,
                 token: int, deployment: str | None, legacy: bool, condition: Any,
                 options: Mapping[str, str] | None, conflict_retries: int) -> IcebergCommit:
    for attempt in range(conflict_retries + 1):
        jtable = _load_table(spark, table)
        current = jtable.currentSnapshot()
        highest = _jhighest(jtable, key, role, run_key, legacy)
        if highest is not None and highest[0] > token:
            raise _stale(table, token, key, highest)
        if highest is not None and highest[0] == token:
            logger.info("Iceberg %s: token %d already committed for %s", table, token, key)
            return IcebergCommit(table, run_key, token, committed=False, snapshot_id=highest[1])
        stage = f"{STAGE_BRANCH_PREFIX}{token}_{uuid.uuid4().hex[:12]}"
        base = _create_stage(jtable, current, stage)
        try:
            writer = df.writeTo(f"{table}.branch_{stage}").option("isolation-level",
                                                                  "serializable")
            for name, prop in _snapshot_properties(token, key, role, run_key,
                                                   deployment).items():
                writer = writer.option(f"snapshot-property.{name}", prop)
            # The branch is private; validating from its start point keeps Iceberg from
            # checking the overwrite against the whole history (which would always conflict).
            writer = writer.option("validate-from-snapshot-id", str(base))
            for name, option in (options or {}).items():
                writer = writer.option(name, option)
            _before_commit("write", table)
            writer.overwrite(condition)
            _before_commit("publish", table)
            snapshot_id = _publish(spark, table, stage, base, key, token)
        except Exception as exc:
            _drop_stage(spark, table, stage)
            if not (isinstance(exc, _MainMoved) or _is_conflict(exc)):
                raise
            logger.info("Iceberg %s: commit of token %d lost a race (try %d): %s",
                        table, token, attempt + 1, str(exc).splitlines()[0][:300])
            continue
        _before_commit("published", table)
        logger.info("Iceberg %s: committed token %d for %s in snapshot %d",
                    table, token, key, snapshot_id)
        return IcebergCommit(table, run_key, token, committed=True, snapshot_id=snapshot_id)
    raise IcebergCommitError(
        f"Iceberg table {table}: token {token} for {key} lost {conflict_retries + 1} commit "
        "races in a row; another writer keeps committing to the table"
    )


def _create_stage(jtable: Any, current: Any, stage: str) -> int:
    """Create the staging branch at ``main``'s current snapshot and return that snapshot's id
    (a table without one gets an empty snapshot on ``main`` first, so there is always a
    snapshot to move ``main`` from)."""
    if current is None:
        jtable.newFastAppend().commit()
        current = jtable.currentSnapshot()
    snapshot_id = int(current.snapshotId())
    jtable.manageSnapshots().createBranch(stage, snapshot_id).commit()
    return snapshot_id


class _MainMoved(Exception):
    """``main`` moved after the token was read: the staged write must go round again."""


def _publish(spark: Any, table: str, stage: str, start: int, key: str, token: int) -> int:
    """Publish the staged snapshot in ONE compare-and-swap of the table metadata: ``main`` set
    to it, the key's high-water property set, the branch dropped (``TableOperations.commit(base,
    new)``). No automatic retry on newer metadata: a lost swap goes back to reading the token.

    Refused (:class:`_MainMoved`) if ``main`` is no longer at ``start``, the snapshot the token
    was read at; a commit that lands between this check and the swap makes the swap fail
    (``CommitFailedException``)."""
    ops = _load_table(spark, table).operations()
    base = ops.refresh()
    staged = base.ref(stage)
    if staged is None:
        raise IcebergCommitError(f"Iceberg table {table}: staging branch {stage!r} vanished "
                                 "before it was published")
    main = base.ref("main")
    if main is None or int(main.snapshotId()) != start:
        raise _MainMoved(f"main moved from snapshot {start} while token {token} was staged")
    jvm = spark._jvm
    mark = jvm.java.util.HashMap()
    mark.put(high_water_property(key), str(token))
    new = (jvm.org.apache.iceberg.TableMetadata.buildFrom(base)
           .setBranchSnapshot(staged.snapshotId(), "main")
           .removeRef(stage)
           .setProperties(mark)
           .build())
    ops.commit(base, new)
    return int(staged.snapshotId())


def _drop_stage(spark: Any, table: str, stage: str) -> None:
    """Remove a staging branch that was not published (best effort: it is never read)."""
    try:
        jtable = _load_table(spark, table)
        if jtable.refs().get(stage) is not None:
            jtable.manageSnapshots().removeBranch(stage).commit()
    except Exception:  # noqa: BLE001 - the original failure matters more; the branch is inert
        logger.warning("Iceberg %s: could not remove staging branch %s; drop it with ALTER "
                       "TABLE ... DROP BRANCH", table, stage, exc_info=True)


# -- Iceberg via pyiceberg --------------------------------------------------------------------


def _pytokens(table: Any, key: str, role: str, run_key: str, legacy: bool
              ) -> list[tuple[int, int]]:
    found = []
    for snapshot in table.snapshots():
        summary = snapshot.summary.additional_properties if snapshot.summary else {}
        token = _summary_token(summary, key, role, run_key, legacy)
        if token is not None:
            found.append((token, int(snapshot.snapshot_id)))
    return found


def write_pyiceberg_fenced(
    data: Any,
    catalog: Any,
    identifier: str,
    claim: Claim | str,
    token: int | None = None,
    *,
    role: str | None = None,
    deployment: str | None = None,
    partition_column: str = "date",
    partition_value: Any = None,
    conflict_retries: int = DEFAULT_CONFLICT_RETRIES,
    allow_empty: bool = False,
) -> IcebergCommit:
    """Replace a partition of the Iceberg table ``identifier`` in ``catalog`` with ``data``
    (pyarrow or pandas) under ``token``, without Spark (pyiceberg).

    ``claim`` is the run's :class:`~neli_orchestrate.claim.Claim` (``run.claim``,
    ``read_neli_conf(spark)``); the loose form passes the run key and ``token`` (with
    ``role=``, ``deployment=``) and builds that Claim.

    The data and the key's table property ``neli.token:<key>`` are committed in one
    transaction. Raises :class:`~neli_orchestrate.errors.StaleTokenError` if a higher token for
    the role, run key and partition is committed before the write or wins a race with it;
    :class:`ConfigError` for a missing role, an empty output (unless ``allow_empty``) or rows
    outside the partition."""
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.compute as pc  # type: ignore[import-untyped]
    from pyiceberg.exceptions import CommitFailedException, ValidationException
    from pyiceberg.expressions import EqualTo

    claim = as_claim(claim, token, role=role, deployment=deployment)  # the loose form
    token, deployment = claim.token, claim.deployment
    role = require_role(claim.role)
    run_key = require_run_key(claim.run_key)
    value = run_key if partition_value is None else partition_value
    key = sink_key(role, run_key, partition_column, value)
    legacy = str(value) == run_key
    frame = data if isinstance(data, pa.Table) else pa.Table.from_pandas(data, preserve_index=False)
    if partition_column not in frame.column_names:
        frame = frame.append_column(partition_column, pa.array([value] * frame.num_rows))
    if not allow_empty and frame.num_rows == 0:
        raise ConfigError(
            f"refusing to commit an empty table for run key {run_key!r} to {identifier}: an "
            "empty overwrite adds no data file, so a stale writer racing with it would not be "
            "refused (pass allow_empty=True to accept that)"
        )
    column = frame.column(partition_column)
    outside = frame.num_rows - pc.sum(pc.fill_null(pc.equal(column, value), False)).as_py() \
        if frame.num_rows else 0
    if outside:
        raise ConfigError(
            f"{outside} of {frame.num_rows} rows for {identifier} have {partition_column} other "
            f"than {value!r}: the write replaces that partition only (pass partition_value= or "
            "write each partition separately)"
        )
    properties = _snapshot_properties(token, key, role, run_key, deployment)
    for attempt in range(conflict_retries + 1):
        table = catalog.load_table(identifier)
        highest = _highest(table.properties.get(high_water_property(key)),
                           _pytokens(table, key, role, run_key, legacy))
        if highest is not None and highest[0] > token:
            raise _stale(identifier, token, key, highest)
        if highest is not None and highest[0] == token:
            return IcebergCommit(identifier, run_key, token, committed=False,
                                 snapshot_id=highest[1])
        try:
            # pyiceberg types EqualTo as a pydantic model; it takes (term, literal) positionally
            equal = EqualTo(partition_column, value)  # type: ignore[call-arg,arg-type]
            _before_commit("write", identifier)
            with table.transaction() as transaction:
                transaction.overwrite(frame, overwrite_filter=equal,
                                      snapshot_properties=properties)
                transaction.set_properties({high_water_property(key): str(token)})
        except (ValidationException, CommitFailedException) as exc:
            logger.info("Iceberg %s: commit of token %d lost a race (try %d): %s",
                        identifier, token, attempt + 1, str(exc).splitlines()[0][:300])
            continue
        mine = [snap for tok, snap in _pytokens(catalog.load_table(identifier), key, role,
                                                run_key, legacy) if tok == token]
        if not mine:
            raise IcebergCommitError(
                f"Iceberg table {identifier}: no snapshot carries token {token} after the write"
            )
        return IcebergCommit(identifier, run_key, token, committed=True, snapshot_id=mine[-1])
    raise IcebergCommitError(
        f"Iceberg table {identifier}: token {token} for {key} lost {conflict_retries + 1} "
        "commit races in a row; another writer keeps committing to the partition"
    )
