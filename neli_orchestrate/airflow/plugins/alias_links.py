"""Link a gate's proxy AssetAlias to its assets before Airflow registers the events by proxy.

Airflow 3.3 links an AssetAlias to an asset (table ``asset_alias_asset``) the first time an
event goes through the alias to that asset, inside the request that records the task's
success: it reads the alias's links, finds none, and inserts one. Two gates of the same DAG
whose first events by proxy arrive in the same instant both insert it; the second request
fails with ``UNIQUE constraint failed: asset_alias_asset`` and the API server marks that gate
``failed`` (no retry).

:class:`ProxyAliasLinks`, a root middleware of the api-server (registered by the NELI plugin),
sees such a success request first: for each event a gate emits through its
``neli-proxy/<dag>/<task>`` alias it creates the missing link in a transaction of its own,
committed before Airflow's handler reads the links; a concurrent request that created it
first is fine (the link exists, which is all that is needed). Airflow's handler then finds
the link and inserts nothing. Other requests pass through untouched.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from typing import Any

from neli_orchestrate.airflow.assets import PROXY_ALIAS_PREFIX

logger = logging.getLogger(__name__)

#: The execution API's task-state update (a task's success carries its outlet events).
_STATE_PATH = re.compile(r"/execution/task-instances/[^/]+/state$")

Link = tuple[str, str, str]  # (alias name, asset name, asset uri)


def proxy_links(body: bytes) -> set[Link]:
    """The (alias, asset name, asset uri) of every event by proxy in a task-state payload."""
    try:
        payload = json.loads(body or b"{}")
    except ValueError:
        return set()
    events = payload.get("outlet_events") if isinstance(payload, dict) else None
    found: set[Link] = set()
    for event in events or ():
        if not isinstance(event, dict):
            continue
        alias = event.get("source_alias_name")
        key = event.get("dest_asset_key")
        if (isinstance(alias, str) and alias.startswith(PROXY_ALIAS_PREFIX)
                and isinstance(key, dict) and key.get("name") and key.get("uri")):
            found.add((alias, str(key["name"]), str(key["uri"])))
    return found


def ensure_links(links: Iterable[Link]) -> int:
    """Create the missing alias-asset links, each in its own committed transaction; return
    how many this call created. A link another request created meanwhile counts as there."""
    from airflow.models.asset import AssetAliasModel, AssetModel, alias_association_table
    from airflow.utils.session import create_session
    from sqlalchemy import insert, select
    from sqlalchemy.exc import IntegrityError

    created = 0
    for alias, name, uri in sorted(set(links)):
        try:
            with create_session() as session:
                alias_id = session.scalar(
                    select(AssetAliasModel.id).where(AssetAliasModel.name == alias))
                asset_id = session.scalar(
                    select(AssetModel.id).where(AssetModel.name == name, AssetModel.uri == uri))
                if alias_id is None or asset_id is None:
                    continue  # not serialized yet: Airflow's own handling applies
                table = alias_association_table
                linked = session.scalar(select(table.c.alias_id).where(
                    table.c.alias_id == alias_id, table.c.asset_id == asset_id))
                if linked is None:
                    session.execute(insert(table).values(alias_id=alias_id, asset_id=asset_id))
                    created += 1
        except IntegrityError:
            logger.debug("alias %s already linked to asset %s by a concurrent request", alias, name)
    return created


class ProxyAliasLinks:
    """ASGI middleware: :func:`ensure_links` before a task's success with events by proxy."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (scope.get("type") != "http" or scope.get("method") != "PATCH"
                or not _STATE_PATH.search(scope.get("path", ""))):
            await self.app(scope, receive, send)
            return
        messages: list[Any] = []
        body = b""
        while True:
            message = await receive()
            messages.append(message)
            if message.get("type") != "http.request":
                break
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        links = proxy_links(body)
        if links:
            from starlette.concurrency import run_in_threadpool

            try:
                await run_in_threadpool(ensure_links, links)
            except Exception:  # noqa: BLE001 - Airflow's own handling still applies
                logger.warning("cannot link the NELI proxy aliases first", exc_info=True)

        async def replay() -> Any:
            if messages:
                return messages.pop(0)
            return await receive()

        await self.app(scope, replay, send)


__all__ = ["ProxyAliasLinks", "ensure_links", "proxy_links"]
