"""A trial's history as data, and the checker every chaos trial runs over it (issue #31).

In the spirit of Jepsen's Elle: the trial records what happened, as plain events, into
``<trial>.history.jsonl``; :func:`check` then decides from that file alone, without the world
that produced it, so a stored history can be checked again (``python -m
integration.chaos.history FILE...``) and a checker change can be tried on old trials.

Events (one JSON object a line, ``kind`` first):

- ``ledger``: a committed ledger record, in the order of its partition (``seq``): ``role``,
  ``run_key``, ``state``, ``token``, ``deployment``, ``at``;
- ``process``: one execution of the work seen alive (a Spark driver JVM, from /proc):
  ``role``, ``run_key``, ``token``, ``region``, ``pid``, ``start``, ``end`` and ``paused``,
  the seconds of it the region was frozen by a SIGSTOP fault (a frozen zombie is the sink's to
  refuse, not a second live execution);
- ``commit``: a sink commit: ``table``, ``key``, ``version``, ``token``;
- ``fault``: what was injected (``fault``: its kind), for the reader.

The properties (:func:`check`):

1. at most one ``COMPLETED`` per (role, run key);
2. tokens strictly increase per role: every new claim (the first record of a token) carries a
   token above every token the role's ledger held before it (an equal one is a violation too);
3. no two tokens' work alive at once per role: executions of different tokens overlap, not
   counting frozen time, for no longer than the observer's resolution (``allowance``);
4. sink commit tokens never go back: per (table, key), in version order.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["check", "load", "record", "write"]

#: Seconds two executions may overlap before it counts: the observer samples /proc about
#: twice a second, and a fenced JVM takes a moment to die after its kill.
DEFAULT_ALLOWANCE = 2.0


def record(*, ledger: Iterable[Any], executions: Iterable[Any], role_of: Mapping[str, str],
           run_key_of: Any, paused: Any, commits: Iterable[tuple[str, str, int, int | None]] = (),
           faults: Iterable[Any] = ()) -> list[dict[str, Any]]:
    """The events of one trial: ``ledger`` (LedgerRecords in partition order), ``executions``
    (the observer's Spans, by date), ``role_of`` (date -> role), ``run_key_of(date)``,
    ``paused(region, start, end)`` (frozen seconds), ``commits`` ((table, key, version, token))."""
    events: list[dict[str, Any]] = []
    for seq, r in enumerate(ledger):
        events.append({"kind": "ledger", "seq": seq, "role": r.role, "run_key": r.run_key,
                       "state": str(r.state), "token": r.token, "deployment": r.deployment,
                       "at": r.at})
    for span in executions:
        if span.date not in role_of:
            continue
        events.append({"kind": "process", "role": role_of[span.date],
                       "run_key": run_key_of(span.date), "token": span.token,
                       "region": span.region, "pid": span.pid, "start": span.start,
                       "end": span.end, "paused": paused(span.region, span.start, span.end)})
    for table, key, version, token in commits:
        events.append({"kind": "commit", "table": table, "key": key, "version": version,
                       "token": token})
    for fault in faults:
        plain = {k: v for k, v in vars(fault).items()
                 if isinstance(v, (str, int, float, type(None)))}
        events.append({**plain, "kind": "fault", "fault": plain.get("kind")})
    return events


def write(events: Sequence[Mapping[str, Any]], path: Path) -> None:
    path.write_text("".join(json.dumps(e, default=str) + "\n" for e in events))


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check(events: Iterable[Mapping[str, Any]],
          allowance: float = DEFAULT_ALLOWANCE) -> list[str]:
    """Every violation of the four properties in ``events`` (empty: the history is fine)."""
    events = list(events)
    ledger = sorted((e for e in events if e["kind"] == "ledger"), key=lambda e: e["seq"])
    return [*_completed_once(ledger), *_tokens_increase(ledger),
            *_one_token_alive([e for e in events if e["kind"] == "process"], allowance),
            *_commits_never_go_back([e for e in events if e["kind"] == "commit"])]


def _completed_once(ledger: Sequence[Mapping[str, Any]]) -> list[str]:
    completed: dict[tuple[str, str], list[int]] = defaultdict(list)
    for e in ledger:
        if e["state"] == "COMPLETED":
            completed[(e["role"], e["run_key"])].append(e["token"])
    return [f"{role} {key}: COMPLETED {len(tokens)} times (tokens {tokens})"
            for (role, key), tokens in completed.items() if len(tokens) > 1]


def _tokens_increase(ledger: Sequence[Mapping[str, Any]]) -> list[str]:
    problems = []
    seen: dict[str, set[int]] = defaultdict(set)
    highest: dict[str, int] = {}
    for e in ledger:
        role, token = e["role"], e["token"]
        if token in seen[role]:
            if e["state"] == "CLAIMED":  # a new claim that reuses a token already issued
                problems.append(f"{role}: a new claim of {e['run_key']} (ledger #{e['seq']}) "
                                f"reuses token {token}")
            continue
        if role in highest and token <= highest[role]:
            problems.append(f"{role}: the claim of {e['run_key']} (ledger #{e['seq']}) has token "
                            f"{token}, not above the role's earlier token {highest[role]}")
        seen[role].add(token)
        highest[role] = max(token, highest.get(role, token))
    return problems


def _one_token_alive(processes: Sequence[Mapping[str, Any]], allowance: float) -> list[str]:
    problems = []
    by_role: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for p in processes:
        by_role[p["role"]].append(p)
    for role, spans in by_role.items():
        spans = sorted(spans, key=lambda p: p["start"])
        for i, first in enumerate(spans):
            for second in spans[i + 1:]:
                if first["token"] == second["token"]:
                    continue  # one token's work, seen as several processes
                start, end = max(first["start"], second["start"]), min(first["end"],
                                                                         second["end"])
                if end <= start:
                    continue
                live = (end - start) - max(first["paused"], second["paused"])
                if live > allowance:
                    problems.append(
                        f"{role}: token {first['token']} ({first['region']}) and token "
                        f"{second['token']} ({second['region']}) were alive at once for "
                        f"{live:.2f} s")
    return problems


def _commits_never_go_back(commits: Sequence[Mapping[str, Any]]) -> list[str]:
    problems = []
    by_key: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for c in commits:
        by_key[(c["table"], c["key"])].append(c)
    for (table, key), found in by_key.items():
        highest: Mapping[str, Any] | None = None
        for c in sorted(found, key=lambda c: c["version"]):
            if c["token"] is None:
                problems.append(f"{table} {key}: version {c['version']} carries no token")
                continue
            if highest is not None and c["token"] < highest["token"]:
                problems.append(f"{table} {key}: version {c['version']} has token {c['token']}, "
                                f"below version {highest['version']}'s {highest['token']}")
            if highest is None or c["token"] >= highest["token"]:
                highest = c
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m integration.chaos.history",
                                     description="Check stored chaos histories.")
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--allowance", type=float, default=DEFAULT_ALLOWANCE)
    args = parser.parse_args(argv)
    bad = 0
    for path in args.files:
        problems = check(load(path), args.allowance)
        bad += bool(problems)
        print(f"{path}: {'ok' if not problems else f'{len(problems)} violation(s)'}")
        for problem in problems:
            print(f"  {problem}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
