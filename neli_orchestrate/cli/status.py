"""``neli-orchestrate status``: per role, who is in the group, who leads, and how the group runs.

Read-only; the data comes from the read model (:func:`neli_orchestrate.observe.collect_status`),
which the Airflow UI page reads as well.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import click

from neli_orchestrate.cli._context import Target, connection_options, setting_option
from neli_orchestrate.cli._output import emit, fail, json_option, progress, table, when
from neli_orchestrate.cli.liveness import liveness_json, print_liveness
from neli_orchestrate.errors import KafkaUnavailableError
from neli_orchestrate.observe import collect_liveness, collect_status

__all__ = ["status"]


#: What `status` fits in, a terminal's usual width (wider cells fold).
WIDTH = 120
#: Short cells that read badly broken; the role and member names fold instead.
WHOLE = ("state", "protocol", "since (UTC)", "heartbeat", "session", "lag")


def _age(value: float | None) -> str:
    return "" if value is None else f"{value:.1f} s ago"


def _utc(epoch: float | None) -> str:
    """``2026-11-27 20:58:35`` (UTC, the column says so), '' for None."""
    return when(epoch)[:19].replace("T", " ")


@click.command()
@connection_options
@click.option("--role", "-r", "roles", multiple=True,
              help="only this role (repeatable; default: every role group of the namespace)")
@setting_option("profile", "--profile",
                help="timing profile the deployments use (how fresh a leader's heartbeat must be)")
@json_option
def status(target: Target, roles: tuple[str, ...], profile: str, as_json: bool) -> int:
    """Per role: members, who leads (from heartbeats), group protocol, session, lag, and how
    its latest run ended (e.g. skipped by the task in us-east-1)."""
    try:
        with progress(f"describing namespace {target.namespace} at {target.bootstrap_servers}"):
            found = collect_status(target, list(roles), profile=profile)
    except KafkaUnavailableError as exc:
        raise fail(str(exc)) from None
    if as_json:
        try:
            deployments: Any = [
                {**d, "announcer_up": d["state"] == "ALIVE"}  # what neli.liveness_announcer_up says
                for d in liveness_json(collect_liveness(target))]
        except KafkaUnavailableError as exc:
            deployments = {"error": str(exc)}
        emit({"namespace": target.namespace, "leader_topic": target.names.leader_topic,
              "roles": [asdict(s) for s in found], "deployments": deployments})
        return 0
    try:
        liveness = collect_liveness(target)
    except KafkaUnavailableError as exc:
        click.echo(f"deployment liveness: not readable ({exc})")
        liveness = None
    if liveness is not None:
        print_liveness(target, liveness)
        for d in liveness:
            if d.state.value == "GONE":
                click.echo(
                    f"deployment {d.deployment}: no liveness announcer runs, so other regions take"
                    " its claims over.\n  It is down, or its announcer cannot run (Airflow: the"
                    " scheduler logs an error each minute, neli.liveness_announcer_up = 0).")
    if not found:
        click.echo(f"no role groups in namespace {target.namespace!r} at "
                   f"{target.bootstrap_servers}")
        return 0
    # Fits 120 columns: the group is '<namespace>.<role>' (in --json), the leading member's id
    # is in the members table (marked), times are UTC to the second.
    table(f"namespace {target.namespace}: {len(found)} role(s)",
          ["role", "state", "protocol", "members", "leader", "since (UTC)", "heartbeat",
           "session", "lag"],
          [(s.role, s.state, s.protocol, len(s.members),
            s.leader_deployment or (s.leader_member or "-"), _utc(s.leader_since),
            _age(s.leader_heartbeat_age),
            (f"{s.session_timeout_ms / 1000:g} s ({s.session_source})" if s.session_timeout_ms
             else s.session_source), "" if s.lag is None else s.lag)
           for s in found], width=WIDTH, whole=WHOLE)
    rows = [(s.role, (m.neli_member or m.client_id)
             + (" (leader)" if m.neli_member and m.neli_member == s.leader_member else ""),
             m.host, ",".join(map(str, m.partitions)) or "-", _age(m.heartbeat_age))
            for s in found for m in s.members]
    if rows:
        table("members", ["role", "member", "host", "partitions", "last heartbeat"], rows,
              width=WIDTH, whole=("last heartbeat",))
    runs = [(s.role, s.last_run) for s in found if s.last_run]
    if runs:
        # "run K: skipped by the task in us-east-1 (...)" says why no region has its data
        table("latest run", ["role", "run"], runs, width=WIDTH)
    for s in found:
        for note in s.notes:
            click.echo(f"{s.role}: {note}")
    return 0
