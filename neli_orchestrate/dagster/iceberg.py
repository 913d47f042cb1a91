"""Token-checked Iceberg commits without Spark, for Dagster assets that write pyarrow or pandas.

Usage::

    catalog = SqlCatalog("lake", uri="sqlite:////data/catalog.db", warehouse="file:///data/wh")
    commit = write_pyiceberg_fenced(frame, catalog, "flights.daily_performance", run.run_key,
                                    run.token, role="daily_flights")

Built on ``pyiceberg`` (the ``iceberg`` extra). Same contract and snapshot summary keys as
:func:`neli_orchestrate.spark.iceberg.write_iceberg_fenced`, so Spark jobs and Dagster assets
can share a table. The refusal is a conditional commit:

1. Load the table once; from that metadata read the highest ``neli.token`` recorded for the
   role and run key. Higher than ours raises
   :class:`~neli_orchestrate.errors.StaleTokenError`; equal is a no-op.
2. ``overwrite(data, overwrite_filter=<partition column> == <run key>)`` through *that* loaded
   table: pyiceberg 0.12 commits against the metadata it loaded, and when the catalog reports
   a newer version it re-validates: data files added since matching the filter fail the commit
   (``ValidationException``), so a newer token's commit to the run key made after step 1 refuses
   ours. The pointer swap itself is the catalog's compare-and-swap.
3. On that failure, go back to 1.

Limits: those of the Spark sink (empty outputs, snapshot expiry, a catalog with a real
compare-and-swap: SQL, REST, Glue, Hive; pyiceberg has no Hadoop-directory catalog).
"""

from __future__ import annotations

import logging
from typing import Any

from neli_orchestrate.claim import check_token
from neli_orchestrate.errors import ConfigError, StaleTokenError
from neli_orchestrate.spark.iceberg import (
    DEFAULT_CONFLICT_RETRIES,
    DEPLOYMENT_PROPERTY,
    ROLE_PROPERTY,
    RUN_KEY_PROPERTY,
    TOKEN_PROPERTY,
    IcebergCommit,
    IcebergCommitError,
)

logger = logging.getLogger(__name__)


def _tokens(table: Any, role: str | None, run_key: str) -> list[tuple[int, int]]:
    found = []
    for snapshot in table.snapshots():
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if props.get(RUN_KEY_PROPERTY) != run_key or props.get(ROLE_PROPERTY) != (role or ""):
            continue
        if props.get(TOKEN_PROPERTY) is not None:
            found.append((int(props[TOKEN_PROPERTY]), int(snapshot.snapshot_id)))
    return found


def write_pyiceberg_fenced(
    data: Any,
    catalog: Any,
    identifier: str,
    run_key: str,
    token: int,
    *,
    role: str | None = None,
    deployment: str | None = None,
    partition_column: str = "date",
    partition_value: Any = None,
    conflict_retries: int = DEFAULT_CONFLICT_RETRIES,
    allow_empty: bool = False,
) -> IcebergCommit:
    """Replace ``run_key``'s rows of the Iceberg table ``identifier`` in ``catalog`` with ``data``
    under ``token``; raise :class:`~neli_orchestrate.errors.StaleTokenError` if a higher token
    for the role and run key is committed before the write or wins a race with it."""
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyiceberg.exceptions import CommitFailedException, ValidationException
    from pyiceberg.expressions import EqualTo

    check_token(token)
    if not isinstance(run_key, str) or not run_key:
        raise ConfigError(f"run_key must be a non-empty string, got {run_key!r}")
    value = run_key if partition_value is None else partition_value
    frame = data if isinstance(data, pa.Table) else pa.Table.from_pandas(data, preserve_index=False)
    if partition_column not in frame.column_names:
        frame = frame.append_column(partition_column, pa.array([value] * frame.num_rows))
    if not allow_empty and frame.num_rows == 0:
        raise ConfigError(
            f"refusing to commit an empty table for run key {run_key!r} to {identifier}: an "
            "empty overwrite adds no data file, so a stale writer racing with it would not be "
            "refused (pass allow_empty=True to accept that)"
        )
    properties = {
        TOKEN_PROPERTY: str(token),
        ROLE_PROPERTY: role or "",
        RUN_KEY_PROPERTY: run_key,
        DEPLOYMENT_PROPERTY: deployment or "",
    }
    for attempt in range(conflict_retries + 1):
        table = catalog.load_table(identifier)
        highest = max(_tokens(table, role, run_key), default=None)
        if highest is not None and highest[0] > token:
            raise StaleTokenError(
                f"Iceberg table {identifier}: token {token} is stale for run key {run_key!r} "
                f"(role {role!r}); token {highest[0]} is already committed in snapshot "
                f"{highest[1]}, nothing was written",
                token=token,
                committed=highest[0],
            )
        if highest is not None and highest[0] == token:
            return IcebergCommit(identifier, run_key, token, committed=False,
                                 snapshot_id=highest[1])
        try:
            # pyiceberg types EqualTo as a pydantic model; it takes (term, literal) positionally
            equal = EqualTo(partition_column, value)  # type: ignore[call-arg,arg-type]
            table.overwrite(frame, overwrite_filter=equal,
                            snapshot_properties=properties)
        except (ValidationException, CommitFailedException) as exc:
            logger.info("Iceberg %s: commit of token %d lost a race (try %d): %s",
                        identifier, token, attempt + 1, str(exc).splitlines()[0][:300])
            continue
        mine = [snap for tok, snap in _tokens(catalog.load_table(identifier), role, run_key)
                if tok == token]
        if not mine:
            raise IcebergCommitError(
                f"Iceberg table {identifier}: no snapshot carries token {token} after the write"
            )
        return IcebergCommit(identifier, run_key, token, committed=True, snapshot_id=mine[-1])
    raise IcebergCommitError(
        f"Iceberg table {identifier}: token {token} for {run_key!r} lost {conflict_retries + 1} "
        "commit races in a row; another writer keeps committing to the partition"
    )
