"""The chaos history checker: a correct trial's history passes; a history broken on purpose in
each of the four ways is caught, each by its own rule (integration/chaos/history.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from integration.chaos.history import check, load, main, record, write

ROLE = "nycflights_daily/2013-01-03"


def good_history() -> list[dict[str, Any]]:
    """kill -9 mid-job in us-east-1 (token 6), eu-west-1 takes over with token 18."""
    ledger = [
        SimpleNamespace(role=ROLE, run_key="2013-01-03", state="CLAIMED", token=6,
                        deployment="us-east-1", at=10.0),
        SimpleNamespace(role=ROLE, run_key="2013-01-03", state="RUNNING", token=6,
                        deployment="us-east-1", at=11.0),
        SimpleNamespace(role=ROLE, run_key="2013-01-03", state="CLAIMED", token=18,
                        deployment="eu-west-1", at=30.0),
        SimpleNamespace(role=ROLE, run_key="2013-01-03", state="RUNNING", token=18,
                        deployment="eu-west-1", at=31.0),
        SimpleNamespace(role=ROLE, run_key="2013-01-03", state="COMPLETED", token=18,
                        deployment="eu-west-1", at=60.0),
    ]
    executions = [
        SimpleNamespace(region="us-east-1", date="2013-01-03", start=12.0, end=20.0, token=6,
                        pid=100),
        SimpleNamespace(region="eu-west-1", date="2013-01-03", start=32.0, end=59.0, token=18,
                        pid=200),
    ]
    fault = SimpleNamespace(kind="kill-mid-job", region="us-east-1", date="2013-01-03",
                            at=19.5, pids=[100])
    return record(ledger=ledger, executions=executions, role_of={"2013-01-03": ROLE},
                  run_key_of=lambda d: d, paused=lambda region, start, end: 0.0,
                  commits=[("t", "2013-01-03", 0, 18)], faults=[fault])


def test_a_correct_trial_has_no_violation_and_survives_the_file(tmp_path: Path) -> None:
    events = good_history()
    assert {e["kind"] for e in events} == {"ledger", "process", "commit", "fault"}
    assert check(events) == []
    write(events, tmp_path / "h.jsonl")
    assert load(tmp_path / "h.jsonl") == events
    assert main([str(tmp_path / "h.jsonl")]) == 0


def _ledger(events: list[dict[str, Any]], state: str, token: int) -> dict[str, Any]:
    return next(e for e in events if e["kind"] == "ledger" and e["state"] == state
                and e["token"] == token)


def completed_twice(events: list[dict[str, Any]]) -> None:
    again = copy.deepcopy(_ledger(events, "COMPLETED", 18))
    again.update(seq=99, token=18, deployment="us-east-1")
    events.append(again)


def token_went_back(events: list[dict[str, Any]]) -> None:
    # the S5 defect: a replay took an invalid end offset for the end and claimed token 0
    for e in events:
        if e["kind"] == "ledger" and e["token"] == 18:
            e["token"] = 0


def equal_token_reissued(events: list[dict[str, Any]]) -> None:
    for e in events:
        if e["kind"] == "ledger" and e["token"] == 18:
            e["token"] = 6


def two_tokens_alive(events: list[dict[str, Any]]) -> None:
    # the fence did not stop token 6's job: it ran on beside token 18's
    old = next(e for e in events if e["kind"] == "process" and e["token"] == 6)
    old["end"] = 45.0


def commit_went_back(events: list[dict[str, Any]]) -> None:
    events.append({"kind": "commit", "table": "t", "key": "2013-01-03", "version": 1,
                   "token": 6})


BROKEN = {
    "completed_twice": (completed_twice, "COMPLETED 2 times"),
    "token_went_back": (token_went_back, "not above the role's earlier token 6"),
    "equal_token_reissued": (equal_token_reissued, "reuses token 6"),
    "two_tokens_alive": (two_tokens_alive, "alive at once for 13.00 s"),
    "commit_went_back": (commit_went_back, "version 1 has token 6, below version 0's 18"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_broken_history_is_caught_by_its_rule(name: str, tmp_path: Path) -> None:
    events = good_history()
    breaker, expected = BROKEN[name]
    breaker(events)
    problems = check(events)
    assert problems and any(expected in p for p in problems), problems
    write(events, tmp_path / "h.jsonl")
    assert main([str(tmp_path / "h.jsonl")]) == 1


def test_frozen_time_and_the_fence_allowance_are_not_overlap() -> None:
    events = good_history()
    old = next(e for e in events if e["kind"] == "process" and e["token"] == 6)
    old["end"] = 33.5  # 1.5 s past the new job's start: a fenced JVM dying
    assert check(events) == []
    old["end"], old["paused"] = 50.0, 17.0  # SIGSTOPped for all but 1 s of the overlap
    assert check(events) == []
    assert check(events, allowance=0.5) != []
