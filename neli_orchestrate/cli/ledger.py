"""``neli-orchestrate ledger list|show|history|reset``: what ran where, from the run ledger."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import click
from rich.markup import escape

from neli_orchestrate.cli._context import Target, connection_options, setting_option
from neli_orchestrate.cli._output import emit, fail, json_option, progress, stderr, table, when
from neli_orchestrate.errors import KafkaUnavailableError, NeliError
from neli_orchestrate.observe import entry_data, read_ledger, run_states, unstopped_note
from neli_orchestrate.settings import NeliSettings, parse

if TYPE_CHECKING:
    from neli_orchestrate.observe import LedgerHistory

__all__ = ["ledger"]

STATES = run_states()


def _read(target: Target, roles: list[str] | None) -> LedgerHistory:
    config = target.ledger_config()
    try:
        with progress(f"reading ledger topic {config.topic} at {target.bootstrap_servers}"):
            return read_ledger(target, roles)
    except KafkaUnavailableError as exc:
        raise fail(str(exc)) from None


_entry_json = entry_data


def _warn_about(history: LedgerHistory, as_json: bool, run_key: str | None = None) -> list[str]:
    """Problems a reader must know about: unreadable records, tokens that would go backwards,
    remote applications a failed try could not confirm stopped (of ``run_key`` if given)."""
    warnings = []
    for entry in history.entries:
        note = unstopped_note(entry)
        if note is not None and run_key in (None, entry.run_key):
            warnings.append(note)
    for entry in history.malformed():
        warnings.append(
            f"unreadable record at {history.topic}[{entry.partition}]@{entry.offset} "
            f"(role {entry.role!r}, run key {entry.run_key!r}): {entry.error}; deployments "
            f"ignore it and decide from the older readable record")
    for role, (token, end) in sorted(history.tokens_behind().items()):
        warnings.append(
            f"role {role!r} holds token {token} but its ledger partition ends at offset {end}: "
            f"the ledger topic was recreated or rewritten, so new claims would get smaller "
            f"tokens and token-checked sinks would refuse them; restore the topic or reset "
            f"the sinks' committed tokens deliberately")
    if not as_json:
        for text in warnings:
            stderr.print(f"[yellow]warning:[/] {escape(text)}", highlight=False)
    return warnings


def _in_range(run_key: str, start: str | None, end: str | None) -> bool:
    return (start is None or run_key >= start) and (end is None or run_key <= end)


@click.group()
def ledger() -> None:
    """The run ledger: which deployment claimed, ran and finished each run key."""


@ledger.command("list")
@connection_options
@click.option("--role", "-r", "roles", multiple=True, help="only these roles (repeatable)")
@click.option("--state", "-s", "states", multiple=True, type=click.Choice(STATES,
              case_sensitive=False), help="only runs whose latest state is this (repeatable)")
@click.option("--from", "start", metavar="RUN_KEY", help="run keys >= this (string order)")
@click.option("--to", "end", metavar="RUN_KEY", help="run keys <= this (string order)")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="at most this many rows")
@json_option
def list_runs(target: Target, roles: tuple[str, ...], states: tuple[str, ...],
              start: str | None, end: str | None, limit: int | None, as_json: bool) -> int:
    """The latest state of every run key, oldest role and run key first."""
    history = _read(target, list(roles) or None)
    wanted = {s.upper() for s in states}
    rows = []
    for (_role, run_key), entry in sorted(history.latest().items()):
        record = entry.record
        assert record is not None
        if wanted and record.state.value not in wanted:
            continue
        if not _in_range(run_key, start, end):
            continue
        rows.append(entry)
    if limit is not None:
        rows = rows[:limit]
    warnings = _warn_about(history, as_json)
    if as_json:
        emit({"ledger_topic": history.topic, "runs": [_entry_json(e) for e in rows],
              "warnings": warnings})
        return 0
    table(f"ledger {history.topic}: {len(rows)} run(s)",
          ["role", "run key", "state", "token", "deployment", "attempt", "at", "reason"],
          [(e.role, e.run_key, e.record.state.value, e.record.token, e.record.deployment,
            e.record.attempt, when(e.record.at), e.record.reason)
           for e in rows if e.record is not None])
    return 0


@ledger.command()
@connection_options
@click.argument("role")
@click.argument("run_key")
@json_option
def show(target: Target, role: str, run_key: str, as_json: bool) -> int:
    """The latest record of one run key (exit 1 if the ledger has none)."""
    history = _read(target, [role])
    entry = history.latest().get((role, run_key))
    warnings = _warn_about(history, as_json, run_key)
    if entry is None:
        if as_json:
            emit({"role": role, "run_key": run_key, "record": None, "warnings": warnings})
            return 1
        raise fail(f"the ledger {history.topic!r} has no record of role {role!r} run key "
                   f"{run_key!r} (never claimed, expired, or another namespace)")
    data = _entry_json(entry)
    if as_json:
        emit({**data, "warnings": warnings})
        return 0
    table(f"{role} / {run_key}", ["field", "value"],
          [(k, v) for k, v in data.items() if k not in ("role", "run_key")])
    return 0


@ledger.command()
@connection_options
@click.argument("role")
@click.argument("run_key")
@json_option
def history(target: Target, role: str, run_key: str, as_json: bool) -> int:
    """Every record of one run key still in the topic: token, deployment, times, reason."""
    read = _read(target, [role])
    entries = [e for e in read.entries if e.role == role and e.run_key == run_key]
    warnings = _warn_about(read, as_json, run_key)
    if as_json:
        emit({"role": role, "run_key": run_key, "ledger_topic": read.topic,
              "records": [_entry_json(e) for e in entries], "warnings": warnings})
        return 0 if entries else 1
    if not entries:
        raise fail(f"the ledger {read.topic!r} has no record of role {role!r} run key "
                   f"{run_key!r}")
    rows: list[tuple[object, ...]] = []
    for e in entries:
        r = e.record
        if r is None:
            rows.append((e.offset, "(tombstone)" if e.error is None else "(unreadable)", "",
                         "", "", "", when(e.timestamp), "", e.error or "expired"))
        else:
            rows.append((e.offset, r.state.value, r.token, r.deployment, r.member, r.attempt,
                         when(r.at), when(r.handoff_deadline), r.reason))
    table(f"{role} / {run_key}: {len(entries)} record(s) in {read.topic} (compaction keeps "
          f"only the newest once a segment is cleaned)",
          ["offset", "state", "token", "deployment", "member", "attempt", "at",
           "handoff until", "reason"], rows)
    return 0


@ledger.command()
@connection_options
@click.argument("role")
@click.argument("run_key")
@click.option("--reason", required=True,
              help="who asks and why; written to the ledger for the audit trail")
@setting_option("deployment", "--deployment", envvar="NELI_DEPLOYMENT", show_envvar=True,
                required=False, default=lambda: f"cli@{socket.gethostname()}",
                show_default="cli@<host>", help="who is recorded as resetting it")
@setting_option("profile", "--profile", help="timing profile of the role's group")
@setting_option("group_protocol", "--group-protocol", help="group protocol of the role's group")
@setting_option("acquire_timeout", "--acquire-timeout",
                help="seconds to wait to lead the role (only the leader writes the ledger)")
@json_option
def reset(target: Target, role: str, run_key: str, reason: str, deployment: str, profile: str,
          group_protocol: str | None, acquire_timeout: float, as_json: bool) -> int:
    """Reset a COMPLETED or FAILED run key so its next run starts over (Singleton.reset)."""
    from neli_orchestrate.singleton.singleton import Singleton

    try:
        settings = parse(NeliSettings, {**dict(target), "deployment": deployment,
                                        "profile": profile, "group_protocol": group_protocol,
                                        "acquire_timeout": acquire_timeout}, where="option")
        with progress(f"leading role {role} to reset {run_key}"), \
                Singleton(settings.singleton_config()) as single:
            record = single.reset(role, run_key, reason)
    except NeliError as exc:
        raise fail(str(exc)) from None
    data = {"role": record.role, "run_key": record.run_key, "state": record.state.value,
            "token": record.token, "deployment": record.deployment, "member": record.member,
            "at": when(record.at), "reason": record.reason}
    if as_json:
        emit(data)
    else:
        table(f"reset {role} / {run_key}", ["field", "value"], list(data.items()))
    return 0
