"""Token-checked Delta commits without Spark, for Dagster assets that write pandas or pyarrow.

Usage (inside ``with neli.singleton(role, run_key) as run:``)::

    commit = write_deltalake_fenced(frame, "/data/daily_performance", run.run_key, run.token,
                                    role="daily_flights", deployment="us-east-1")
    context.add_output_metadata({"delta_version": commit.version, "token": commit.token})

Built on ``deltalake`` (delta-rs, the ``delta`` extra). The table, app id and commit metadata are
those of :func:`neli_orchestrate.spark.delta.write_delta_fenced`, so Spark jobs and Dagster assets
can share a table and refuse each other's stale tokens.

Unlike Delta on Spark, delta-rs 1.6 does **not** skip a write whose ``app_transactions`` version
is below the recorded one (it commits it, and the recorded version goes *down*). The refusal is
therefore a conditional commit:

1. Load the table once (snapshot ``V``); a recorded version above the token for the app id
   raises :class:`~neli_orchestrate.errors.StaleTokenError`, an equal one is a no-op.
2. Write through that loaded table (``write_deltalake(table_at_V, ..., predicate=<partition>)``):
   delta-rs commits version ``V+1`` with put-if-absent and, if another commit came first, runs
   its conflict check; a commit that added files to the run key's partition after ``V`` fails
   ours (``CommitFailedError``, "a concurrent transaction added new data").
3. On that failure, go back to 1.

Limits: as for Iceberg, an owner that committed *no* rows for the partition adds no file, so
empty outputs are refused unless ``allow_empty=True``; atomicity is delta-rs's: put-if-absent on
local disks, HDFS, ABFS and GCS, and on S3 through conditional writes or a locking provider
(``storage_options``, see delta-rs' S3 docs).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from neli_orchestrate.claim import check_token
from neli_orchestrate.errors import ConfigError, StaleTokenError
from neli_orchestrate.spark.delta import (
    DEFAULT_CONFLICT_RETRIES,
    USER_METADATA_KEYS,
    DeltaCommit,
    DeltaCommitError,
    delta_app_id,
)

logger = logging.getLogger(__name__)


def _load(uri: str, storage_options: Mapping[str, str] | None) -> Any:
    """The table's latest snapshot, or None when no table exists at ``uri`` yet."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(uri, storage_options=dict(storage_options or {}) or None)
    except TableNotFoundError:
        return None


def _is_conflict(exc: BaseException) -> bool:
    from deltalake.exceptions import CommitFailedError

    return isinstance(exc, CommitFailedError)


def _sql_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def write_deltalake_fenced(
    data: Any,
    uri: str,
    run_key: str,
    token: int,
    *,
    role: str | None = None,
    deployment: str | None = None,
    partition_column: str = "date",
    partition_value: str | None = None,
    storage_options: Mapping[str, str] | None = None,
    conflict_retries: int = DEFAULT_CONFLICT_RETRIES,
    allow_empty: bool = False,
) -> DeltaCommit:
    """Replace ``run_key``'s partition of the Delta table at ``uri`` with ``data`` (pandas or
    pyarrow) under ``token``; raise :class:`~neli_orchestrate.errors.StaleTokenError` if a
    higher token for the role and run key is committed before the write or wins a race with it.
    """
    import pyarrow as pa  # type: ignore[import-untyped]
    from deltalake import CommitProperties, Transaction, write_deltalake

    check_token(token)
    app_id = delta_app_id(role, run_key)
    value = run_key if partition_value is None else partition_value
    table = data if isinstance(data, pa.Table) else pa.Table.from_pandas(data, preserve_index=False)
    if partition_column not in table.column_names:
        table = table.append_column(partition_column, pa.array([value] * table.num_rows))
    if not allow_empty and table.num_rows == 0:
        raise ConfigError(
            f"refusing to commit an empty table for run key {run_key!r} to {uri}: an empty "
            "overwrite adds no file, so a stale writer racing with it would not be refused "
            "(pass allow_empty=True to accept that)"
        )
    metadata = json.dumps(
        dict(zip(USER_METADATA_KEYS, (token, role, run_key, deployment, app_id), strict=True)),
        sort_keys=True,
    )
    predicate = f'"{partition_column}" = {_sql_literal(value)}'
    options = dict(storage_options or {}) or None

    for attempt in range(conflict_retries + 1):
        current = _load(uri, storage_options)
        recorded = current.transaction_version(app_id) if current is not None else None
        if recorded is not None and recorded > token:
            raise StaleTokenError(
                f"Delta table {uri}: token {token} is stale for {app_id}; token {recorded} is "
                "already committed, nothing was written",
                token=token,
                committed=recorded,
            )
        if recorded == token:
            assert current is not None
            return DeltaCommit(uri, app_id, run_key, token, committed=False,
                               version=int(current.version()))
        properties = CommitProperties(
            app_transactions=[Transaction(app_id, token)],
            custom_metadata={"userMetadata": metadata},
        )
        try:
            if current is None:  # a new table: creating version 0 is itself put-if-absent
                write_deltalake(uri, table, mode="overwrite", partition_by=[partition_column],
                                storage_options=options, commit_properties=properties)
            else:  # through the snapshot we checked: a newer commit to the partition conflicts
                write_deltalake(current, table, mode="overwrite", predicate=predicate,
                                commit_properties=properties)
        except Exception as exc:
            if not (_is_conflict(exc) or (current is None and _load(uri, storage_options))):
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
        return DeltaCommit(uri, app_id, run_key, token, committed=True,
                           version=int(after.version()))
    raise DeltaCommitError(
        f"Delta table {uri}: token {token} for {app_id} lost {conflict_retries + 1} commit races "
        "in a row; another writer keeps committing to the partition"
    )
