"""What the other regions see: asset events that carry a singleton run's ledger identity.

Usage::

    extra = asset_event.extra["neli"]     # in a DAG scheduled on the singleton task's asset
    extra["deployment"], extra["role"], extra["run_key"], extra["token"], extra["proxy"]

A singleton task's outlets receive an asset event in every region: in the region that ran it
(the task's own event, stamped by the fenced execution with :func:`stamp_outlet_events`) and,
by proxy, in each region whose gate skipped the run because it was ``COMPLETED`` elsewhere (the
gate emits them through its :func:`proxy_alias`). Both carry the same identity under
:data:`EXTRA_KEY`, so a DAG scheduled on the asset derives the same run key in every region
(:func:`run_key_after_assets`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from neli_orchestrate.claim import Claim
    from neli_orchestrate.observe import LedgerRecord

logger = logging.getLogger(__name__)

#: Key of the asset event ``extra`` that holds the singleton run's ledger identity.
EXTRA_KEY = "neli"

#: The identity fields every region writes alike (``proxy``, ``recorded_by`` and
#: ``completed_at`` say who wrote the event and may differ).
IDENTITY_KEYS = ("deployment", "role", "run_key", "token")


#: Start of the name of every gate's proxy AssetAlias.
PROXY_ALIAS_PREFIX = "neli-proxy/"


#: Path (below a region's UI base URL) of the NELI page's redirect to the DAG run that ran a
#: run key with a token (``neli_orchestrate.airflow.plugins.leadership``).
RAN_PATH = "/neli/ran"


def ran_url(
    base: str,
    *,
    role: str,
    run_key: str,
    token: int,
    dag_id: str | None = None,
    task_id: str | None = None,
) -> str:
    """The address, in the region whose UI is at ``base``, that opens the DAG run (the task
    ``task_id`` of it when given) whose gate claimed ``run_key`` under ``token``."""
    from urllib.parse import urlencode

    query: dict[str, Any] = {"role": role, "run_key": run_key, "token": int(token)}
    if dag_id:
        query["dag_id"] = dag_id
    if task_id:
        query["task_id"] = task_id
    return f"{base.rstrip('/')}{RAN_PATH}?{urlencode(query)}"


def proxy_alias_name(dag_id: str, task_id: str) -> str:
    """The name of the AssetAlias through which a gate emits asset events by proxy."""
    return f"{PROXY_ALIAS_PREFIX}{dag_id}/{task_id}"


def identity(
    *,
    deployment: str,
    role: str,
    run_key: str,
    token: int,
    proxy: bool,
    recorded_by: str,
    completed_at: float | None = None,
) -> dict[str, Any]:
    """The ``extra[EXTRA_KEY]`` of a singleton run's asset event (JSON-safe)."""
    value: dict[str, Any] = {
        "deployment": deployment,
        "role": role,
        "run_key": run_key,
        "token": int(token),
        "proxy": proxy,
        "recorded_by": recorded_by,
    }
    if completed_at is not None:
        from neli_orchestrate.observe import ledger_time

        value["completed_at"] = ledger_time(completed_at)
    return value


def proxy_identity(record: LedgerRecord, *, role: str, run_key: str, here: str) -> dict[str, Any]:
    """The identity of a run another deployment completed, from its ``COMPLETED`` record."""
    return identity(
        deployment=record.deployment,
        role=role,
        run_key=run_key,
        token=record.token,
        proxy=True,
        recorded_by=here,
        completed_at=record.at,
    )


def concrete_outlets(task: Any) -> tuple[list[Any], list[str]]:
    """The assets a task declares as outlets, and the names of those that cannot be proxied.

    Assets and asset references can; an AssetAlias cannot (which assets it resolves to is
    decided inside the task's own run).
    """
    from airflow.sdk import Asset, AssetAlias
    from airflow.sdk.definitions.asset import AssetRef

    assets: list[Any] = []
    refused: list[str] = []
    for outlet in getattr(task, "outlets", None) or ():
        if isinstance(outlet, (Asset, AssetRef)):
            assets.append(outlet)
        elif isinstance(outlet, AssetAlias):
            refused.append(f"AssetAlias({outlet.name!r})")
    return assets, refused


def stamp_outlet_events(task: Any, context: Mapping[str, Any], claim: Claim) -> None:
    """Add the claim's identity to the extra of the asset events ``task`` emits on success.

    Called by the fenced execution in the region that runs the work; user-set extra keys stay.
    """
    # The gate's XCom always names role and deployment; only a Spark conf form may lack them.
    _stamp(task, context, identity(
        deployment=claim.deployment or "",
        role=claim.role or "",
        run_key=claim.run_key,
        token=claim.token,
        proxy=False,
        recorded_by=claim.deployment or "",
    ))


def stamp_proxy_outlet_events(
    task: Any, context: Mapping[str, Any], record: LedgerRecord, *, role: str, run_key: str,
    here: str,
) -> list[Any]:
    """Make the asset events ``task`` emits on success events by proxy of a run another
    deployment completed (:func:`proxy_identity` of its ``COMPLETED`` record), as the gate's.

    Called by a fenced try that finds its run completed by a deployment that took it over
    (the task then succeeds without running the work). Returns the assets stamped.
    """
    return _stamp(task, context, proxy_identity(record, role=role, run_key=run_key, here=here))


def _stamp(task: Any, context: Mapping[str, Any], value: dict[str, Any]) -> list[Any]:
    events = context.get("outlet_events")
    assets, _ = concrete_outlets(task)
    if events is None or not assets:
        return []
    stamped = []
    for asset in assets:
        try:
            events[asset].extra[EXTRA_KEY] = value
        except (KeyError, TypeError, ValueError) as exc:  # an unresolvable reference
            logger.warning("cannot stamp the asset event of %r with the NELI run: %s", asset, exc)
        else:
            stamped.append(asset)
    return stamped


def identities(events: Iterable[Any]) -> list[dict[str, Any]]:
    """The distinct singleton identities in asset events (``.extra`` or dicts with ``extra``)."""
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for event in events:
        extra = getattr(event, "extra", None)
        if extra is None and isinstance(event, Mapping):
            extra = event.get("extra")
        value = (extra or {}).get(EXTRA_KEY) if isinstance(extra, Mapping) else None
        if not isinstance(value, Mapping) or any(k not in value for k in IDENTITY_KEYS):
            continue
        try:
            key = (str(value["role"]), int(value["token"]), str(value["run_key"]))
        except (TypeError, ValueError):
            continue
        seen.setdefault(key, dict(value))
    return [seen[k] for k in sorted(seen)]


def run_key_after_assets(dag_id: str, events: Iterable[Any]) -> str | None:
    """The run key of a run triggered by singleton asset events: the same in every region.

    ``"<dag_id>/after/<role>/<run_key>@<token>"`` of the latest identity among the events
    (largest role, then token: roles templated by date sort by date, and a role's tokens grow
    with each run). The token makes a re-run upstream (``ledger reset``) a new downstream run.
    When one region's scheduler batches two upstream runs into one DAG run and another region
    does not, each run key still runs once: the batch runs under the latest one's key. None
    when no event carries an identity.
    """
    found = identities(events)
    if not found:
        return None
    latest = max(found, key=lambda v: (str(v["role"]), int(v["token"])))
    return f"{dag_id}/after/{latest['role']}/{latest['run_key']}@{int(latest['token'])}"


__all__ = [
    "EXTRA_KEY",
    "PROXY_ALIAS_PREFIX",
    "RAN_PATH",
    "concrete_outlets",
    "identities",
    "identity",
    "proxy_alias_name",
    "proxy_identity",
    "ran_url",
    "run_key_after_assets",
    "stamp_outlet_events",
    "stamp_proxy_outlet_events",
]
