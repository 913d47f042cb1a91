"""The "NELI leadership" page of the Airflow UI: who leads each role, what ran where, and when.

Installed with the package (entry point ``airflow.plugins``), nothing to configure: the
api-server mounts a small FastAPI app at ``/neli`` and the UI lists the page under *Browse*.
Per role the page shows the current leader (deployment, member, since when), the recent run
ledger (run key, state, token, deployment, times) and a leadership timeline; ``?run_key=``
shows every ledger record of one run, which is where the "NELI run" extra link of a gate and
of the task it fences points.

It reads what ``neli-orchestrate status`` and ``neli-orchestrate ledger`` read, through the
same read model (:func:`neli_orchestrate.observe.collect_overview`), with the Kafka settings of the
deployment's ``neli`` connection (``?conn_id=``, default ``neli_default``). Read-only: it
never joins a group or writes a record. Access is Airflow's own: the auth manager must
authorize the user for the UI (``AccessView.WEBSITE``); anonymous requests get 401, and a
browser is sent to the login page.
"""

from __future__ import annotations

import html
import json
import logging
from collections.abc import Iterable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlparse

from airflow.plugins_manager import AirflowPlugin
from airflow.sdk import BaseOperatorLink
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from neli_orchestrate.airflow import liveness as _liveness_listener
from neli_orchestrate.airflow.claims import DONE_ELSEWHERE_XCOM_KEY
from neli_orchestrate.airflow.plugins.alias_links import ProxyAliasLinks
from neli_orchestrate.errors import ConfigError, NeliError
from neli_orchestrate.observe import (
    Overview,
    collect_overview,
    entry_data,
    iso_time,
)

if TYPE_CHECKING:
    from airflow.sdk.types import TaskInstanceKey

    from neli_orchestrate.observe import HistoryEntry, RoleStatus
    from neli_orchestrate.settings import ClusterSettings

__all__ = ["NeliPlugin", "NeliRanInLink", "NeliRunLink", "app", "find_claimed_run", "run_url"]

logger = logging.getLogger(__name__)

#: Where the api-server mounts the page (below ``[api] base_url``).
URL_PREFIX = "/neli"
DEFAULT_CONN_ID = "neli_default"


# -- data: the read model (neli_orchestrate.observe), as the CLI reads it ------------------

def _target(conn_id: str) -> tuple[ClusterSettings, str]:
    """Where the deployment's connection points, and the deployment id."""
    from airflow.models.connection import Connection

    from neli_orchestrate.airflow.hooks.neli import NeliHook

    try:
        conn = Connection.get_connection_from_secrets(conn_id)
    except Exception as exc:  # noqa: BLE001 - AirflowNotFoundException, secrets backends
        raise ConfigError(
            f"Airflow connection {conn_id!r} is not defined in this deployment: create the "
            f"'neli' connection the gates use, or open the page with ?conn_id=<its id> "
            f"({type(exc).__name__})") from None
    settings = NeliHook(conn_id, connection=conn).settings  # type: ignore[arg-type]
    return settings, settings.deployment


# -- links ------------------------------------------------------------------------------------

def _base_path() -> str:
    from airflow.configuration import conf

    base = conf.get("api", "base_url", fallback="") or ""
    return urlparse(base).path.rstrip("/")


def run_url(role: str, run_key: str, conn_id: str | None = None,
            dag_id: str | None = None) -> str:
    """The page's address of one run key (what the extra links point at); ``dag_id`` lets
    the page's link to the region that ran it open that region's DAG run."""
    query = {"role": role, "run_key": run_key}
    if conn_id and conn_id != DEFAULT_CONN_ID:
        query["conn_id"] = conn_id
    if dag_id:
        query["dag_id"] = dag_id
    return f"{_base_path()}{URL_PREFIX}/?{urlencode(query)}#run"


def _is_gate(task: Any) -> bool:
    # Serialized operators (what the api-server holds) keep the class name and module only.
    return bool(getattr(task, "neli_gate", False)) or (
        getattr(task, "task_type", None) == "LeaderGateOperator"
        or str(getattr(task, "_task_module", "")).startswith("neli_orchestrate.airflow")
        and str(getattr(task, "task_type", "")).endswith("GateOperator"))


def _rendered(dag_id: str, task_id: str, run_id: str, map_index: int) -> dict[str, Any]:
    from airflow.models.renderedtifields import RenderedTaskInstanceFields as RTIF
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        row = session.scalar(select(RTIF.rendered_fields).where(
            RTIF.dag_id == dag_id, RTIF.task_id == task_id, RTIF.run_id == run_id,
            RTIF.map_index == map_index))
    return dict(row) if isinstance(row, dict) else {}


class NeliRunLink(BaseOperatorLink):
    """"NELI run": from a gate, or the task it fences, to its run key on the NELI page.

    Resolved in the api-server when the task instance is shown: the role and run key are the
    gate's rendered template fields of that DAG run (recorded when its try starts, whether it
    then claims, waits or skips). Tasks that are neither a gate nor directly after one get no
    link.
    """

    name = "NELI run"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        dag = getattr(operator, "dag", None)
        gate = operator if _is_gate(operator) else None
        if gate is None and dag is not None:
            for upstream_id in sorted(getattr(operator, "upstream_task_ids", ()) or ()):
                task = dag.task_dict.get(upstream_id)
                if task is not None and _is_gate(task):
                    gate = task
                    break
        if gate is None:
            return ""
        try:
            fields = _rendered(ti_key.dag_id, gate.task_id, ti_key.run_id, ti_key.map_index)
        except Exception:  # noqa: BLE001 - a link must not break the task page
            logger.warning("cannot read the rendered fields of gate %s", gate.task_id,
                           exc_info=True)
            return ""
        role, run_key = fields.get("role"), fields.get("run_key")
        if not isinstance(role, str) or not isinstance(run_key, str) or not role or not run_key:
            return ""  # the gate has not started in this run yet
        return run_url(role, run_key, getattr(gate, "neli_conn_id", None), ti_key.dag_id)


#: How many of a deployment's latest ``return_value`` XComs ``/neli/ran`` searches for a claim.
CLAIM_SCAN = 5000


def _xcom(dag_id: str, task_id: str, run_id: str, key: str) -> Any:
    """One XCom value of a task instance, as the task pushed it (None when there is none)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        value = session.scalar(select(XComModel.value).where(
            XComModel.dag_id == dag_id, XComModel.task_id == task_id,
            XComModel.run_id == run_id, XComModel.map_index == -1, XComModel.key == key))
    return _decoded(value)


def _decoded(value: Any) -> Any:
    # The task runner stores a pushed dict either as JSON or as its JSON text.
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


class NeliRanInLink(BaseOperatorLink):
    """"Ran in region": from a gate that skipped a run another region completed, and from the
    tasks it skipped, to that region's DAG run (through its ``/neli/ran``); likewise from a
    fenced task whose retry found the run completed by a region that took it over, and from
    the tasks that try skipped.

    Resolved in the api-server from the XCom ``neli_done`` of that DAG run's gate (or fenced
    task), which holds the ledger record, the skipped task ids and the address; the address is
    there only when the connection's ``region_urls`` knows the running region's UI. No link
    otherwise.
    """

    name = "Ran in region"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        dag = getattr(operator, "dag", None)
        if _is_gate(operator):
            sources = [operator]
        elif dag is not None:
            gates = [t for _, t in sorted(dag.task_dict.items()) if _is_gate(t)]
            # a fenced task whose retry found the run taken over and completed elsewhere
            # records the same (operators.fenced._end_as_the_gate_would)
            children = [dag.task_dict[c] for g in gates
                        for c in sorted(getattr(g, "downstream_task_ids", ()) or ())
                        if c in dag.task_dict]
            sources = [*gates, *children]
        else:
            return ""
        for source in sources:
            try:
                done = _xcom(ti_key.dag_id, source.task_id, ti_key.run_id,
                             DONE_ELSEWHERE_XCOM_KEY)
            except Exception:  # noqa: BLE001 - a link must not break the task page
                logger.warning("cannot read the XCom of %s", source.task_id, exc_info=True)
                return ""
            if not isinstance(done, dict):
                continue
            if source.task_id == operator.task_id or operator.task_id in (
                    done.get("skipped") or ()):
                return str(done.get("url") or "")
        return ""


def find_claimed_run(role: str, run_key: str, token: int,
                     dag_id: str | None = None) -> tuple[str, str] | None:
    """(dag_id, run_id) of this deployment's DAG run whose gate claimed ``run_key`` of ``role``
    under ``token`` (the gate's ``return_value`` XCom), searching the latest
    :data:`CLAIM_SCAN` such XComs; else the latest whose gate claimed that run key under
    another token (the fenced task's retry re-claimed it); None when there is none."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    query = select(XComModel.dag_id, XComModel.run_id, XComModel.value).where(
        XComModel.key == "return_value", XComModel.map_index == -1)
    if dag_id:
        query = query.where(XComModel.dag_id == dag_id)
    query = query.order_by(XComModel.timestamp.desc()).limit(CLAIM_SCAN)
    with create_session() as session:
        rows = list(session.execute(query))
    same_key: tuple[str, str] | None = None
    for found_dag, run_id, raw in rows:
        value = _decoded(raw)
        if (not isinstance(value, dict) or value.get("run_key") != run_key
                or value.get("role") != role):
            continue
        if value.get("token") == token:
            return str(found_dag), str(run_id)
        # a retry of the fenced task that re-claimed the run holds a newer token than its gate
        same_key = same_key or (str(found_dag), str(run_id))
    return same_key


# -- auth: Airflow's own ----------------------------------------------------------------------

async def _require_user(request: Request) -> Any:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
    from airflow.api_fastapi.core_api.security import bearer_scheme, get_user

    credentials = await bearer_scheme(request)
    user = await get_user(request, None, credentials)
    if not get_auth_manager().is_authorized_view(access_view=AccessView.WEBSITE, user=user):
        raise HTTPException(status_code=403, detail="Forbidden")
    return user


app = FastAPI(title="NELI leadership", description=__doc__, docs_url=None, redoc_url=None,
              openapi_url=None)


@app.exception_handler(HTTPException)
async def _refused(request: Request, exc: HTTPException) -> Response:
    """401 for scripts; a browser without a session is sent to Airflow's login page."""
    if exc.status_code == 401 and "text/html" in request.headers.get("accept", ""):
        login = f"{_base_path()}/api/v2/auth/login"
        return RedirectResponse(f"{login}?{urlencode({'next': str(request.url)})}",
                                status_code=303)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code,
                        headers=getattr(exc, "headers", None))


def _read(conn_id: str, roles: list[str], run_key: str | None) -> Overview:
    target, deployment = _target(conn_id)
    return collect_overview(target, deployment, roles, run_key)


@app.get("/api/overview")
def overview_json(conn_id: str = DEFAULT_CONN_ID,
                  role: list[str] = Query(default=[]),  # noqa: B008 - FastAPI's idiom
                  run_key: str | None = None,
                  user: Any = Depends(_require_user)) -> JSONResponse:  # noqa: B008
    """The page's data as JSON (what ``status --json`` and ``ledger list --json`` show)."""
    try:
        data = _read(conn_id, role, run_key)
    except NeliError as exc:
        return JSONResponse({"error": str(exc)}, status_code=503)
    return JSONResponse({
        "namespace": data.namespace, "deployment": data.deployment,
        "bootstrap_servers": data.bootstrap_servers, "ledger_topic": data.ledger_topic,
        "roles": [{"status": asdict(r.status), "runs": [entry_data(e) for e in r.runs]}
                  for r in data.roles],
        "run_history": [entry_data(e) for e in data.run_history],
        "warnings": data.warnings,
    })


@app.get("/ran")
def ran(role: str, run_key: str, token: int, dag_id: str | None = None,
        task_id: str | None = None, conn_id: str = DEFAULT_CONN_ID,
        user: Any = Depends(_require_user)) -> RedirectResponse:  # noqa: B008
    """Redirect to this deployment's DAG run (task ``task_id`` of it) that ran ``run_key`` under
    ``token``: where the "Ran in region" link of another region points. When this deployment
    has no such run (XCom gone, another DAG), to this page at the run key instead."""
    found = find_claimed_run(role, run_key, token, dag_id)
    if found is None:
        return RedirectResponse(run_url(role, run_key, conn_id, dag_id), status_code=303)
    found_dag, run_id = found
    path = f"{_base_path()}/dags/{quote(found_dag, safe='')}/runs/{quote(run_id, safe='')}"
    if task_id:
        path += f"/tasks/{quote(task_id, safe='')}"
    return RedirectResponse(path, status_code=303)


@app.get("/", response_class=HTMLResponse)
def page(conn_id: str = DEFAULT_CONN_ID,
         role: list[str] = Query(default=[]),  # noqa: B008
         run_key: str | None = None,
         dag_id: str | None = None,
         user: Any = Depends(_require_user)) -> HTMLResponse:  # noqa: B008
    """The page: per role, leader, recent ledger and timeline."""
    try:
        data = _read(conn_id, role, run_key)
    except NeliError as exc:
        body = f'<p class="error" id="error">{_e(str(exc))}</p>'
        return HTMLResponse(_document("NELI leadership", body), status_code=503)
    urls = _region_urls(conn_id) if run_key is not None else {}
    return HTMLResponse(_document("NELI leadership",
                                  _render(data, run_key, conn_id, urls, dag_id)))


def _region_urls(conn_id: str) -> dict[str, str]:
    """The connection's ``region_urls`` (empty when unset or unreadable: links are extras)."""
    try:
        return dict(getattr(_target(conn_id)[0], "region_urls", None) or {})
    except Exception as exc:  # noqa: BLE001 - the page shows the ledger without the links
        logger.warning("cannot read region_urls of connection %s: %s", conn_id, exc)
        return {}


# -- HTML -------------------------------------------------------------------------------------

def _e(text: object) -> str:
    return html.escape("" if text is None else str(text), quote=True)


def _when(epoch: float | None) -> str:
    return iso_time(epoch).replace("+00:00", "Z")


def _cells(values: Iterable[object]) -> str:
    return "".join(f"<td>{_e(v)}</td>" for v in values)


def _run_anchor(role: str, run_key: str) -> str:
    return f"run-{quote(role, safe='')}-{quote(run_key, safe='')}"


def _record_cells(entry: HistoryEntry) -> str:
    r = entry.record
    if r is None:
        return _cells([entry.run_key, "TOMBSTONE" if entry.tombstone else "UNREADABLE", "", "",
                       "", _when(entry.timestamp), entry.error or ""])
    return _cells([r.run_key, r.state.value, r.token, r.deployment, r.attempt, _when(r.at),
                   r.reason])


def _timeline_html(st: RoleStatus, now: float) -> str:
    if not st.timeline:
        return '<p class="muted">no leader heartbeat in the leader topic\'s tail</p>'
    start = min(s.start for s in st.timeline)
    span = max(now - start, 1e-3)
    colours: dict[str, str] = {}
    palette = ["#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2"]
    bars, rows = [], []
    for spell in st.timeline:
        who = spell.deployment or "?"
        colour = colours.setdefault(who, palette[len(colours) % len(palette)])
        left = 100 * (spell.start - start) / span
        width = max(0.5, 100 * (spell.end - spell.start) / span)
        bars.append(f'<div class="spell" style="left:{left:.2f}%;width:{width:.2f}%;'
                    f'background:{colour}" title="{_e(who)} {_e(spell.member)}"></div>')
        rows.append(f'<tr class="spell-row" data-deployment="{_e(spell.deployment or "")}" '
                    f'data-member="{_e(spell.member)}">'
                    + _cells([who, spell.member, _when(spell.start), _when(spell.end),
                              spell.heartbeats]) + "</tr>")
    legend = " ".join(f'<span class="key" style="background:{c}"></span>{_e(d)}'
                      for d, c in colours.items())
    return (f'<div class="bar">{"".join(bars)}</div><p class="muted">{_e(_when(start))} → now'
            f' &nbsp; {legend}</p><table class="timeline"><tr><th>deployment</th><th>member</th>'
            f'<th>from</th><th>last heartbeat</th><th>heartbeats</th></tr>{"".join(rows)}</table>')


def _ran_in_html(data: Overview, urls: dict[str, str], dag_id: str | None) -> str:
    """Which deployment completed the run key, with its token, and a link to its run there."""
    from neli_orchestrate.airflow.assets import ran_url
    from neli_orchestrate.observe import is_completed, skipped_by_task

    done = [e.record for e in data.run_history if is_completed(e.record)]
    if not done:
        return ""
    record = done[-1]
    where = "this deployment" if record.deployment == data.deployment else "another deployment"
    link = ""
    base = urls.get(record.deployment)
    if base and record.deployment != data.deployment:
        href = ran_url(base, role=record.role, run_key=record.run_key, token=record.token,
                       dag_id=dag_id)
        link = (f' · <a id="ran-in-link" href="{_e(href)}">open the run in '
                f'{_e(record.deployment)}\'s UI</a>')
    if skipped_by_task(record):
        # it produced nothing: no region has asset events of it, by proxy or not
        return (f'<p id="ran-in" data-deployment="{_e(record.deployment)}" '
                f'data-token="{_e(record.token)}" data-skipped-by-task="true">Skipped by the '
                f'task in deployment <b>{_e(record.deployment)}</b> ({where}) with fencing '
                f'token <b>{_e(record.token)}</b>, {_e(_when(record.at))}: '
                f'{_e(record.reason)}{link}</p>')
    return (f'<p id="ran-in" data-deployment="{_e(record.deployment)}" '
            f'data-token="{_e(record.token)}">Ran in deployment <b>{_e(record.deployment)}</b> '
            f'({where}) with fencing token <b>{_e(record.token)}</b>, completed '
            f'{_e(_when(record.at))}{link}</p>')


def _render(data: Overview, run_key: str | None, conn_id: str,
            urls: dict[str, str] | None = None, dag_id: str | None = None) -> str:
    parts = [f'<p class="muted">namespace <b id="namespace">{_e(data.namespace)}</b> at '
             f'{_e(data.bootstrap_servers)} · ledger {_e(data.ledger_topic)} · this deployment '
             f'<b id="deployment">{_e(data.deployment)}</b> (connection {_e(conn_id)}) · read '
             f'{_e(_when(data.read_at))}</p>']
    for text in data.warnings:
        parts.append(f'<p class="warning">{_e(text)}</p>')
    if run_key is not None:
        rows = "".join(
            f'<tr class="history-row" data-state="{_e(e.record.state.value if e.record else "")}"'
            f'>{_record_cells(e)}</tr>' for e in data.run_history)
        parts.append(
            f'<section id="run" data-run-key="{_e(run_key)}"><h2>Run {_e(run_key)}</h2>'
            + _ran_in_html(data, urls or {}, dag_id)
            + (f'<table><tr><th>run key</th><th>state</th><th>token</th><th>deployment</th>'
               f'<th>attempt</th><th>at</th><th>reason</th></tr>{rows}</table>' if rows else
               '<p class="muted">no ledger record of this run key (yet)</p>') + "</section>")
    if not data.roles:
        parts.append('<p class="muted">no role of this namespace has a consumer group or a '
                     'ledger record yet</p>')
    for item in data.roles:
        st = item.status
        leader = (
            f'<td class="leader-deployment">{_e(st.leader_deployment or "unknown")}</td>'
            f'<td class="leader-member">{_e(st.leader_member)}</td>'
            f'<td class="leader-since">{_e(_when(st.leader_since))}</td>'
            f'<td>{_e(f"{st.leader_heartbeat_age:.1f} s ago")}</td>'
            if st.leader_member else '<td colspan="4" class="no-leader">no leader</td>')
        notes = "".join(f'<p class="muted">{_e(n)}</p>' for n in st.notes)
        runs = "".join(
            f'<tr id="{_e(_run_anchor(st.role, e.run_key or ""))}" class="run-row'
            f'{" selected" if e.run_key == run_key else ""}" data-run-key="{_e(e.run_key)}" '
            f'data-state="{_e(e.record.state.value if e.record else "")}">{_record_cells(e)}</tr>'
            for e in item.runs)
        parts.append(
            f'<section class="role" id="role-{_e(quote(st.role, safe=""))}" '
            f'data-role="{_e(st.role)}" data-leader-member="{_e(st.leader_member or "")}" '
            f'data-leader-deployment="{_e(st.leader_deployment or "")}">'
            f'<h2>{_e(st.role)}</h2><p class="muted">group {_e(st.group)} · {_e(st.state)} · '
            f'protocol {_e(st.protocol)} · {len(st.members)} member(s)</p>'
            f'<h3>Leader</h3><table><tr><th>deployment</th><th>member</th><th>since</th>'
            f'<th>last heartbeat</th></tr><tr class="leader">{leader}</tr></table>{notes}'
            f'<h3>Recent runs</h3>'
            + (f'<table class="ledger"><tr><th>run key</th><th>state</th><th>token</th>'
               f'<th>deployment</th><th>attempt</th><th>at</th><th>reason</th></tr>{runs}'
               f'</table>' if runs else '<p class="muted">no ledger records</p>')
            + f'<h3>Leadership timeline</h3>{_timeline_html(st, data.read_at)}</section>')
    return "".join(parts)


_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#1a202c;background:#fff}
h1{font-size:1.4rem}h2{font-size:1.15rem;margin-top:1.8rem}h3{font-size:.95rem;color:#4a5568}
table{border-collapse:collapse;font-size:.85rem;margin:.3rem 0}
th,td{border-bottom:1px solid #e2e8f0;padding:.25rem .6rem;text-align:left}
th{background:#f7fafc}.muted{color:#718096;font-size:.85rem}.warning{color:#b7791f}
.error{color:#c53030}.selected{background:#fefcbf}section.role{max-width:70rem}
.bar{position:relative;height:1.2rem;background:#edf2f7;border-radius:3px;max-width:60rem}
.spell{position:absolute;top:0;bottom:0;border-radius:2px}
.key{display:inline-block;width:.8rem;height:.8rem;margin:0 .2rem 0 .6rem;border-radius:2px}
"""


def _document(title: str, body: str) -> str:
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}'
            f'</title><style>{_STYLE}</style></head><body><h1>{_e(title)}</h1>{body}'
            f'</body></html>')


class NeliPlugin(AirflowPlugin):
    """The NELI page (FastAPI app and menu entry) and the "NELI run" and "Ran in region" extra
    links."""

    name = "neli_orchestrate"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "NELI leadership"}]
    external_views = [{
        "name": "NELI leadership",
        "href": f"{URL_PREFIX}/",
        "url_route": "neli",
        "category": "browse",
    }]
    global_operator_extra_links = [NeliRunLink(), NeliRanInLink()]
    # Links a gate's proxy alias to its assets before Airflow registers its first events by
    # proxy, so two gates emitting them at once do not race (plugins/alias_links.py).
    fastapi_root_middlewares = [{"middleware": ProxyAliasLinks, "args": [], "kwargs": {},
                                 "name": "NELI proxy alias links"}]
    # The scheduler announces the deployment's liveness in Kafka (neli_orchestrate.liveness).
    listeners = [_liveness_listener]
