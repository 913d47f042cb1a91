"""OpenLineage's ``neli`` run facet: one derivation, used by Airflow and Dagster alike.

Every region's lineage of one singleton run carries the same ``role``, ``run_key`` and
``token``; ``deployment`` names the region that ran the work, ``recorded_by`` the region that
emitted the event, and ``proxy`` is true where they differ. ``ledger_offset`` is where the
reported ledger record sits in the role's ledger partition (absent when it was not read back).

The facet's JSON schema ships in the wheel as ``neli_orchestrate/lineage/NeliRunFacet.json``;
its ``_schemaURL`` is a package URL (purl, ``pkg:pypi/neli-orchestrate@VERSION#PATH``) whose
subpath is that file's path in the wheel of that version: :func:`schema_file` resolves it in
an installed package. The project has no web home yet, and a purl names exactly one file of one
release without guessing a host (docs/guide/airflow.md, "Lineage").

Needs no OpenLineage package: :func:`neli_facet` returns the facet as JSON-ready data, which
``neli_orchestrate.airflow.lineage`` wraps for the Airflow OpenLineage provider and the Dagster
integration puts on a materialization's metadata.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from neli_orchestrate import __version__

#: The key of the run facet in an OpenLineage event's ``run.facets``.
FACET_NAME = "neli"
#: The schema's path inside the wheel (and the repository).
SCHEMA_PATH = "neli_orchestrate/lineage/NeliRunFacet.json"
_PURL = "pkg:pypi/neli-orchestrate"
#: ``_producer`` of the facet: this package, this release.
PRODUCER = f"{_PURL}@{__version__}"
#: ``_schemaURL`` of the facet: the schema file in this release's wheel.
SCHEMA_URL = f"{PRODUCER}#{SCHEMA_PATH}"


class Recorded(Protocol):
    """What the facet reads of a ledger record (``LedgerRecord``) or a claim."""

    @property
    def role(self) -> str: ...

    @property
    def run_key(self) -> str: ...

    @property
    def token(self) -> int: ...

    @property
    def deployment(self) -> str: ...


def neli_facet(record: Recorded, *, recorded_by: str) -> dict[str, Any]:
    """The ``neli`` run facet of ``record`` as emitted by deployment ``recorded_by``.

    ``record`` is a ledger record (its ``state`` and ``offset`` are reported) or a claim
    (``state`` and ``ledger_offset`` then are what it has, else absent).
    ``proxy`` is derived, never passed: a region that did not run the work records a proxy.
    """
    if not recorded_by:
        raise ValueError("recorded_by must name the deployment that emits the event")
    facet: dict[str, Any] = {
        "_producer": PRODUCER,
        "_schemaURL": SCHEMA_URL,
        "role": record.role,
        "run_key": record.run_key,
        "token": int(record.token),
        "deployment": record.deployment,
        "recorded_by": recorded_by,
        "proxy": record.deployment != recorded_by,
    }
    offset = getattr(record, "offset", None)
    if offset is not None:
        facet["ledger_offset"] = int(offset)
    state = getattr(record, "state", None)
    if state is not None:
        facet["state"] = str(getattr(state, "value", state))
    return facet


def schema_file(url: str = SCHEMA_URL) -> Path:
    """The installed schema file a ``neli`` facet's ``_schemaURL`` names.

    Raises ValueError for a URL of another package or another release than the one installed
    (its schema may differ: install that release to read it).
    """
    prefix = f"{_PURL}@"
    if not url.startswith(prefix) or "#" not in url:
        raise ValueError(f"{url!r} is not a neli-orchestrate schema URL ({SCHEMA_URL!r})")
    version, _, path = url[len(prefix):].partition("#")
    if version != __version__:
        raise ValueError(f"{url!r} names neli-orchestrate {version}, but {__version__} is "
                         "installed: read the schema of that release")
    package, _, rest = path.partition("/")
    if package != "neli_orchestrate" or not rest:
        raise ValueError(f"{url!r} names no file of the neli_orchestrate package")
    found = resources.files("neli_orchestrate").joinpath(rest)
    if not found.is_file():
        raise ValueError(f"{url!r}: no file {path} in the installed package")
    return Path(str(found))



def sink_dataset(commit: Any) -> dict[str, str] | None:
    """The OpenLineage dataset a token-checked sink's commit wrote, with its table version.

    ``commit`` is a ``DeltaCommit`` (path and ``version``) or an ``IcebergCommit`` (table and
    ``snapshot_id``); anything else gives None. Names follow OpenLineage's dataset naming:
    a Delta table at ``scheme://authority/path`` is namespace ``scheme://authority``, name
    ``/path`` (a local path: namespace ``file``); an Iceberg table is namespace ``iceberg``
    and its identifier (the catalog is not in the commit). ``version`` is the Delta version
    or the Iceberg snapshot id (empty when the snapshot is unknown).
    """
    from urllib.parse import urlsplit

    path = getattr(commit, "path", None)
    if isinstance(path, str) and isinstance(getattr(commit, "version", None), int):
        parts = urlsplit(path)
        if parts.scheme and parts.scheme != "file" and len(parts.scheme) > 1:
            namespace, name = f"{parts.scheme}://{parts.netloc}", parts.path or "/"
        else:
            namespace, name = "file", parts.path if parts.scheme == "file" else path
        return {"namespace": namespace, "name": name, "version": str(commit.version)}
    table = getattr(commit, "table", None)
    if isinstance(table, str) and hasattr(commit, "snapshot_id"):
        snapshot = commit.snapshot_id
        return {"namespace": "iceberg", "name": table,
                "version": "" if snapshot is None else str(snapshot)}
    return None
