"""Token-checked Dagster IO managers: an asset's output lands only under a current claim.

Usage::

    @singleton_asset(partitions_def=daily, io_manager_key="lake")
    def daily_performance(context, run):
        return compute(context.partition_key)            # a pandas or pyarrow table

    defs = dg.Definitions(
        assets=[daily_performance],
        resources={"neli": NeliResource(...),
                   "lake": NeliDeltaIOManager(root_uri="s3://lake/tables")},
    )

:class:`NeliDeltaIOManager` (delta-rs) and :class:`NeliIcebergIOManager` (pyiceberg) write the
output through the token-checked sinks (:mod:`neli_orchestrate.sinks.delta`,
:mod:`neli_orchestrate.sinks.iceberg`) with the claim of the step that produced it:
:func:`~neli_orchestrate.dagster.singleton_asset` yields its output inside the claim and
registers the claim for the step (:func:`claim_for_outputs`), so ``handle_output`` runs while
this deployment still holds the role and finds the token there. Then:

- fenced before the write: nothing is written (:class:`~dagster.Failure`, no materialization);
- the table holds a newer token for the partition: the sink refuses before any byte lands
  (``StaleTokenError`` → ``Failure``, no materialization);
- fenced *during* the write: the sink's conditional commit still lets only the highest token's
  rows stand; if this write committed, a newer token's write replaces it. The step fails and
  records no materialization, and the message says the rows were committed.

An output of a step that holds no claim (a plain ``@asset``) is refused: the IO manager would
otherwise write without a token.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import dagster as dg
from pydantic import Field

from neli_orchestrate.errors import FencedError, StaleTokenError

#: The step's ``neli_orchestrate.dagster.NeliRun`` (typed loosely: the sinks sit below the
#: front doors and import nothing from them).
NeliRun = Any

logger = logging.getLogger(__name__)

class OutputRefused(Exception):
    """An IO manager refused a step's output (stale or fenced); ends the singleton block."""


class OutputClaim:
    """The claim a step's outputs are written under, and what an IO manager refused."""

    def __init__(self, run: NeliRun, end: Callable[[], None] | None) -> None:
        self.run = run
        self._end = end
        #: Why an IO manager refused this step's output (None: it did not).
        self.refused: str | None = None

    def refuse(self, reason: str) -> None:
        """Record why the output was refused and end the claim's block now."""
        self.refused = reason
        if self._end is not None:
            end, self._end = self._end, None
            end()


_lock = threading.Lock()
_claims: dict[tuple[str, str], OutputClaim] = {}


@contextlib.contextmanager
def claim_for_outputs(context: Any, run: NeliRun, end: Callable[[], None] | None = None
                      ) -> Iterator[OutputClaim]:
    """Make ``run``'s claim the one the token-checked IO managers use for this step's outputs
    while the block runs (``singleton_asset`` wraps its ``yield`` in it). ``end()`` ends the
    claim's block at once when an IO manager refuses the output."""
    op_context = getattr(context, "op_execution_context", context)
    key = (op_context.run_id, op_context.get_step_execution_context().step.key)
    claim = OutputClaim(run, end)
    with _lock:
        _claims[key] = claim
    try:
        yield claim
    finally:
        with _lock:
            _claims.pop(key, None)


def _claim(context: dg.OutputContext, manager: str) -> OutputClaim:
    with _lock:
        claim = _claims.get((context.run_id, context.step_key))
    if claim is None or claim.run.token is None:
        raise dg.Failure(
            description=(
                f"{manager}: step {context.step_key!r} holds no NELI claim, so its output has no "
                "fencing token and is not written. Produce it with @singleton_asset (which "
                "hands the claim to the IO manager) or use another IO manager"
            ),
            allow_retries=False,
        )
    return claim


def _partition_value(context: dg.OutputContext, run: NeliRun) -> str:
    return context.partition_key if context.has_partition_key else run.run_key


def _table_name(context: dg.OutputContext | dg.InputContext) -> list[str]:
    return list(context.asset_key.path)


def _not_written(run: NeliRun, where: str, why: str) -> dg.Failure:
    return dg.Failure(
        description=(
            f"neli: {why}. Nothing was written to {where}; no materialization is recorded for "
            f"run key {run.run_key!r} of role {run.role!r} (token {run.token}, deployment "
            f"{run.deployment!r}). A newer leader owns the run."
        ),
        metadata={"token": run.token, "role": run.role, "run_key": run.run_key,
                  "deployment": run.deployment, "written": False},
        allow_retries=False,
    )


def _write(claim: OutputClaim, where: str, write: Any) -> Any:
    """Check the claim, write through the sink, and refuse to report a fenced write as done."""
    try:
        return _checked_write(claim.run, where, write)
    except dg.Failure as failure:
        # End the singleton block now, with this reason: the ledger records FAILED (or nothing,
        # when fenced) and leadership is released before the step fails.
        claim.refuse(failure.description or "the IO manager refused the output")
        raise


def _checked_write(run: NeliRun, where: str, write: Any) -> Any:
    try:
        run.check()
    except FencedError as exc:
        raise _not_written(run, where, f"fenced before the IO manager wrote: {exc}") from exc
    try:
        commit = write()
    except StaleTokenError as exc:
        raise _not_written(
            run, where, f"the table refused token {exc.token}: token {exc.committed} is already "
            "committed for this partition") from exc
    if run.fenced:
        raise dg.Failure(
            description=(
                f"neli: fenced while the IO manager wrote: token {run.token}'s rows were "
                f"committed to {where} ({commit}) before the fence was noticed; they stand only "
                "until the newer leader's write replaces them (a lower token can never replace "
                f"a higher one). No materialization is recorded for run key {run.run_key!r} of "
                f"role {run.role!r} (deployment {run.deployment!r}): {run.fence_reason}"
            ),
            metadata={"token": run.token, "role": run.role, "run_key": run.run_key,
                      "deployment": run.deployment, "written": True},
            allow_retries=False,
        )
    return commit


def _lineage(commit: Any) -> dict[str, Any]:
    """``neli_dataset``: the table the commit wrote as an OpenLineage dataset, with its version
    (the Delta version or Iceberg snapshot id; beside the ``neli`` run facet of the step)."""
    from neli_orchestrate.lineage.facet import sink_dataset

    dataset = sink_dataset(commit)
    return {} if dataset is None else {"neli_dataset": dg.MetadataValue.json(dataset)}


class NeliDeltaIOManager(dg.ConfigurableIOManager):
    """Store asset outputs (pandas or pyarrow) in Delta tables with the step's fencing token.

    The table of asset ``a/b`` is ``<root_uri>/a/b``; each output replaces its partition
    (``partition_column`` = the partition key, else the run key) through
    :func:`~neli_orchestrate.sinks.delta.write_deltalake_fenced`. Inputs load the partitions
    the downstream step asks for (the whole table when it is not partitioned).
    """

    root_uri: str = Field(description="Where the tables live: <root_uri>/<asset key path>.")
    partition_column: str = Field(default="date", description="The column holding the partition.")
    storage_options: dict[str, str] = Field(
        default_factory=dict, description="delta-rs storage options (object store credentials).")
    allow_empty: bool = Field(
        default=False, description="Accept empty outputs (a racing stale writer is then not "
        "refused by the commit; see docs/guide/spark.md).")

    def _uri(self, context: dg.OutputContext | dg.InputContext) -> str:
        return "/".join([self.root_uri.rstrip("/"), *_table_name(context)])

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        """Write ``obj`` under the step's claim; raise ``Failure`` if it is stale or fenced."""
        from neli_orchestrate.sinks.delta import write_deltalake_fenced

        claim = _claim(context, type(self).__name__)
        run = claim.run
        uri = self._uri(context)
        commit = _write(claim, f"Delta table {uri}", lambda: write_deltalake_fenced(
            obj, uri, run.claim, partition_column=self.partition_column,
            partition_value=_partition_value(context, run),
            storage_options=self.storage_options or None, allow_empty=self.allow_empty))
        context.add_output_metadata({"uri": uri, "delta_version": commit.version,
                                     "token": commit.token, "committed": commit.committed,
                                     **_lineage(commit)})

    def load_input(self, context: dg.InputContext) -> Any:
        """The upstream table (its requested partitions) as a pyarrow table."""
        from deltalake import DeltaTable

        table = DeltaTable(self._uri(context), storage_options=self.storage_options or None)
        if context.has_asset_partitions:
            keys = list(context.asset_partition_keys)
            return table.to_pyarrow_table(filters=[(self.partition_column, "in", keys)])
        return table.to_pyarrow_table()


class NeliIcebergIOManager(dg.ConfigurableIOManager):
    """Store asset outputs (pandas or pyarrow) in Iceberg tables with the step's fencing token.

    The table of asset ``a/b`` is ``<namespace>.a_b`` in the pyiceberg catalog ``catalog_name``
    configured by ``catalog_properties`` (``load_catalog``); it must exist, partitioned by
    ``partition_column``. Each output replaces its partition through
    :func:`~neli_orchestrate.sinks.iceberg.write_pyiceberg_fenced`.
    """

    catalog_name: str = Field(description="The pyiceberg catalog's name.")
    catalog_properties: dict[str, str] = Field(
        default_factory=dict, description="pyiceberg load_catalog properties (uri, warehouse, …).")
    namespace: str = Field(description="The Iceberg namespace holding the tables.")
    partition_column: str = Field(default="date", description="The column holding the partition.")
    allow_empty: bool = Field(default=False, description="Accept empty outputs.")

    def _catalog(self) -> Any:
        from pyiceberg.catalog import load_catalog

        return load_catalog(self.catalog_name, **self.catalog_properties)

    def _identifier(self, context: dg.OutputContext | dg.InputContext) -> str:
        return f"{self.namespace}.{'_'.join(_table_name(context))}"

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        """Write ``obj`` under the step's claim; raise ``Failure`` if it is stale or fenced."""
        from neli_orchestrate.sinks.iceberg import write_pyiceberg_fenced

        claim = _claim(context, type(self).__name__)
        run = claim.run
        identifier = self._identifier(context)
        catalog = self._catalog()
        commit = _write(claim, f"Iceberg table {identifier}",
                        lambda: write_pyiceberg_fenced(
                            obj, catalog, identifier, run.claim,
                            partition_column=self.partition_column,
                            partition_value=_partition_value(context, run),
                            allow_empty=self.allow_empty))
        context.add_output_metadata({"table": identifier, "snapshot_id": commit.snapshot_id,
                                     "token": commit.token, "committed": commit.committed,
                                     **_lineage(commit)})

    def load_input(self, context: dg.InputContext) -> Any:
        """The upstream table (its requested partitions) as a pyarrow table."""
        from pyiceberg.expressions import In

        table = self._catalog().load_table(self._identifier(context))
        if context.has_asset_partitions:
            keys = set(context.asset_partition_keys)
            # pyiceberg types In as a pydantic model; it takes (term, literals) positionally
            row_filter = In(self.partition_column, keys)  # type: ignore[call-arg,arg-type]
            return table.scan(row_filter=row_filter).to_arrow()
        return table.scan().to_arrow()
