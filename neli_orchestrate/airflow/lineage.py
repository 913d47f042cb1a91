"""OpenLineage for the gate, the fenced try and the proxy path (the provider's operator hooks).

With apache-airflow-providers-openlineage installed (the ``lineage`` extra) and a transport
configured, Airflow's OpenLineage listener asks each task for ``get_openlineage_facets_on_start``
/ ``_on_complete`` / ``_on_failure``. The gate (:class:`LeaderGateOperator`) and every fenced
try answer with an ``OperatorLineage`` whose run facet ``neli``
(:func:`neli_orchestrate.lineage.facet.neli_facet`) names the run: role, run key, token, the
deployment that ran it, the one that recorded the event, ``proxy``, and the ledger offset of
the record it reports, read back from the ledger after the task's own writes.

START events carry no ``neli`` facet: nothing is claimed when a task starts (the gate claims
during its run, the fenced try re-verifies its claim in ``execute``).

Without the provider nothing here is imported: the hooks are plain methods that are never
called.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from neli_orchestrate.lineage.facet import FACET_NAME, SCHEMA_URL, neli_facet, sink_dataset

logger = logging.getLogger(__name__)

#: The attribute of a running task that holds its :class:`Lineage` (set while it runs).
ATTRIBUTE = "_neli_lineage"


@dataclass
class Lineage:
    """What a task learnt of its run while it ran, for the lineage hooks called after it."""

    #: The deployment that emits the events (this task's).
    recorded_by: str
    #: The record the facet reports (or the claim, where it could not be read back).
    record: Any
    #: OpenLineage output datasets (a fenced try's sink table, with its version).
    outputs: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class Claimed:
    """A claim as the facet reports it until its record is read back (no offset yet)."""

    role: str
    run_key: str
    token: int
    deployment: str
    state: str = "CLAIMED"
    offset: int | None = None


def wanted() -> bool:
    """True where the OpenLineage provider is installed and enabled (a transport is set)."""
    try:
        from airflow.providers.openlineage import conf
    except ImportError:
        return False
    try:
        return not conf.is_disabled()
    except Exception:  # noqa: BLE001 - a broken lineage config must not fail the task
        return False


def read_back(singleton: Any, role: str, run_key: str, token: int) -> Any:
    """The run's latest record read back through the task's open ``singleton`` (with its
    ledger offset), if it is this ``token``'s and OpenLineage is wanted; else None.

    Read inside the task, not in the provider's listener: the listener runs under the
    provider's execution timeout, and a slow ledger there would drop the whole event.
    """
    if not wanted():
        return None
    try:
        record = singleton.status(role, run_key)
    except Exception as exc:  # noqa: BLE001 - lineage never fails the task
        logger.warning("neli lineage: could not read run %r of role %r back from the ledger "
                       "(no ledger_offset): %s", run_key, role, exc)
        return None
    return record if record is not None and record.token == token else None


def settle(task: Any, singleton: Any) -> None:
    """Replace the claim a running fenced ``task`` reports by its record read back."""
    lineage: Lineage | None = getattr(task, ATTRIBUTE, None)
    if lineage is None or not isinstance(lineage.record, Claimed):
        return
    claim = lineage.record
    found = read_back(singleton, claim.role, claim.run_key, claim.token)
    if found is not None:
        lineage.record = found


def outputs_of(result: Any) -> list[Any]:
    """OpenLineage outputs for what a fenced try's work returned: each sink commit
    (``DeltaCommit``, ``IcebergCommit``, or a list or tuple of them) as a dataset with its
    version (a ``version`` dataset facet). Anything else reports no output."""
    from openlineage.client.event_v2 import OutputDataset
    from openlineage.client.facet_v2 import dataset_version_dataset

    commits = result if isinstance(result, list | tuple) else [result]
    found = []
    for commit in commits:
        dataset = sink_dataset(commit)
        if dataset is None:
            continue
        facets: dict[str, Any] = {}
        if dataset["version"]:
            facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(
                datasetVersion=dataset["version"])
        found.append(OutputDataset(namespace=dataset["namespace"], name=dataset["name"],
                                   facets=facets))
    return found


def remember(task: Any, lineage: Lineage) -> None:
    """Keep ``lineage`` on the running ``task`` for its lineage hooks."""
    setattr(task, ATTRIBUTE, lineage)


def operator_lineage(task: Any) -> Any:
    """The ``OperatorLineage`` of ``task``'s run so far: the ``neli`` facet and outputs."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    lineage: Lineage | None = getattr(task, ATTRIBUTE, None)
    if lineage is None:
        return OperatorLineage()
    record = lineage.record
    facet = run_facet(neli_facet(record, recorded_by=lineage.recorded_by))
    return OperatorLineage(outputs=list(lineage.outputs), run_facets={FACET_NAME: facet})


def run_facet(data: dict[str, Any]) -> Any:
    """The OpenLineage client's RunFacet carrying ``data`` (:func:`neli_facet`)."""
    return _facet_class()(**{k: v for k, v in data.items() if not k.startswith("_")},
                          producer=data["_producer"])


_FACET_CLASS: Any = None


def _facet_class() -> Any:
    """``NeliRunFacet``: an attrs RunFacet of the OpenLineage client, made on first use."""
    global _FACET_CLASS
    if _FACET_CLASS is None:
        import attr
        from openlineage.client.generated.base import RunFacet

        @attr.define
        class NeliRunFacet(RunFacet):  # type: ignore[misc]
            role: str = attr.field(kw_only=True)
            run_key: str = attr.field(kw_only=True)
            token: int = attr.field(kw_only=True)
            deployment: str = attr.field(kw_only=True)
            recorded_by: str = attr.field(kw_only=True)
            proxy: bool = attr.field(kw_only=True)
            ledger_offset: int | None = attr.field(default=None, kw_only=True)
            state: str | None = attr.field(default=None, kw_only=True)

            @staticmethod
            def _get_schema() -> str:
                return SCHEMA_URL

        _FACET_CLASS = NeliRunFacet
    return _FACET_CLASS


class LineageHooks:
    """The OpenLineage provider's operator hooks, answered from the task's :class:`Lineage`."""

    def get_openlineage_facets_on_start(self) -> Any:
        from airflow.providers.openlineage.extractors import OperatorLineage

        return OperatorLineage()

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        return operator_lineage(self)

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        return operator_lineage(self)


def attach(task: Any, lineage: Lineage) -> None:
    """Give a running fenced ``task`` (any operator class) the lineage hooks, with ``lineage``.

    Set on the instance the task runner runs, so the provider's listener finds them there;
    an operator's own hooks (its inputs and outputs) are kept and the ``neli`` facet added.
    """
    remember(task, lineage)
    if isinstance(task, LineageHooks):
        return
    # The class's own hooks, never ours from an earlier attach to this instance (a try
    # attaches before its work and again with what the work returned).
    own = {name: getattr(type(task), name, None) for name in
           ("get_openlineage_facets_on_complete", "get_openlineage_facets_on_failure")}

    def merged(name: str) -> Any:
        def hook(task_instance: Any) -> Any:
            ours = operator_lineage(task)
            method = own[name]
            if not callable(method):
                return ours
            theirs = method(task, task_instance)
            if theirs is None:
                return ours
            theirs.run_facets = {**(theirs.run_facets or {}), **ours.run_facets}
            theirs.outputs = [*(theirs.outputs or []), *ours.outputs]
            return theirs
        return hook

    for name in own:
        object.__setattr__(task, name, merged(name))
    if not callable(getattr(type(task), "get_openlineage_facets_on_start", None)):
        object.__setattr__(task, "get_openlineage_facets_on_start",
                           LineageHooks.get_openlineage_facets_on_start.__get__(task))
