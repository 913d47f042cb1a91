"""Issue 9 against the real broker, under both group protocols: retries with the gate's token,
a fence that fails the try but not the run, and a fenced member that leaves at once.

Each test asserts on what happened (who ran with which token, the ledger's records), not on
how long it took.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from test_singleton_kafka import (
    _no_worker_left_behind,  # noqa: F401 - autouse fixture: kill the workers we started
    ledger_records,
    lines,
    start,
    wait_line,
)
from worker import TIMINGS

from neli_orchestrate import NeliConfig, Singleton, SingletonConfig, SkippedRun
from neli_orchestrate.ledger.record import RunState

pytestmark = pytest.mark.kafka

PROTOCOLS = ["classic", "consumer"]


@pytest.fixture(params=PROTOCOLS)
def env(request: pytest.FixtureRequest, kafka_broker: str, tmp_path: Path) -> dict:  # type: ignore[type-arg]
    ns = f"t{uuid.uuid4().hex[:8]}"
    return {"bootstrap": kafka_broker, "namespace": ns, "ledger_topic": f"{ns}.ledger",
            "tmp": tmp_path, "timings": {"group_protocol": request.param}}


def args_for(env: dict, deployment: str, **extra: object) -> dict:  # type: ignore[type-arg]
    return {**{k: v for k, v in env.items() if k != "tmp"}, "deployment": deployment, **extra}


def singleton(env: dict, deployment: str) -> Singleton:  # type: ignore[type-arg]
    # In-process tests inject no fault: wider margins than the workers', so that a loaded
    # build machine does not fence them spuriously.
    neli = NeliConfig(bootstrap_servers=env["bootstrap"],
                      **{**TIMINGS, "session_timeout": 12.0, "heartbeat_timeout": 5.0,
                         **env["timings"]})
    return Singleton(SingletonConfig(neli=neli, namespace=env["namespace"], deployment=deployment,
                                     ledger_topic=env["ledger_topic"], acquire_timeout=60.0,
                                     handoff_timeout=30.0))


def history(env: dict, run_key: str) -> list[tuple[str, RunState, int]]:  # type: ignore[type-arg]
    return [(r.deployment, r.state, r.token)
            for r in ledger_records(env["bootstrap"], env["ledger_topic"])
            if r.run_key == run_key]


def test_the_third_try_with_the_gates_token_runs_and_completes(env) -> None:
    """The issue's transcript: reserve; execute(token) fails twice; the third try runs."""
    with singleton(env, "us-east-1") as region:
        token = region.reserve("flights", "2013-01-05").token
        assert token is not None
        tokens: list[int] = []

        def spark_job_fails(run) -> None:  # type: ignore[no-untyped-def]
            tokens.append(run.token)
            raise RuntimeError("spark-submit exited with 1")

        for _ in range(2):  # Airflow retries=2: every try pulls the gate's token from XCom
            with pytest.raises(RuntimeError, match="spark-submit"):
                region.execute("flights", "2013-01-05", token, spark_job_fails)
        assert region.execute("flights", "2013-01-05", token,
                              lambda run: tokens.append(run.token) or "done") == "done"
        with pytest.raises(SkippedRun):  # a fourth try (or a cleared task) does not run again
            region.execute("flights", "2013-01-05", token, spark_job_fails)

    assert tokens[0] == token and tokens == sorted(set(tokens)), f"tokens {tokens}"
    states = [(d, s) for d, s, _ in history(env, "2013-01-05")]
    assert states == [("us-east-1", s) for s in (
        RunState.CLAIMED, RunState.RUNNING, RunState.FAILED, RunState.RUNNING, RunState.FAILED,
        RunState.RUNNING, RunState.COMPLETED)]


def test_a_fence_from_a_blip_fails_the_try_and_the_next_try_finishes_the_run(env) -> None:
    """One region left; its executor is paused past its lease (a network blip): that try fails
    with the reason, and the next try with the same gate token completes the run."""
    tmp = env["tmp"]
    with singleton(env, "us-east-1") as region:
        token = region.reserve("billing", "2013-02-01").token
    assert token is not None
    common = {"role": "billing", "run_key": "2013-02-01", "token": token}
    a = start("execute", args_for(env, "us-east-1", status=str(tmp / "a"), go=str(tmp / "a.go"),
                                  **common), tmp / "a.log")
    assert int(wait_line(tmp / "a", "started", 120, a).split()[1]) == token
    os.kill(a.pid, signal.SIGSTOP)  # longer than heartbeat_timeout, shorter than the session
    time.sleep(TIMINGS["heartbeat_timeout"] * 2)
    os.kill(a.pid, signal.SIGCONT)
    assert a.wait(timeout=60) == 3, lines(tmp / "a")
    fenced = wait_line(tmp / "a", "fenced", 1)
    assert "lost" in fenced or "fenced" in fenced.split(maxsplit=1)[1], fenced
    assert history(env, "2013-02-01")[-1][1] is RunState.RUNNING  # the try failed, not the run

    (tmp / "b.go").touch()
    b = start("execute", args_for(env, "us-east-1", status=str(tmp / "b"), go=str(tmp / "b.go"),
                                  **common), tmp / "b.log")
    assert b.wait(timeout=120) == 0, lines(tmp / "b")
    token_b = int(wait_line(tmp / "b", "started", 1).split()[1])
    assert token_b > token
    assert [(s, t) for _, s, t in history(env, "2013-02-01")] == [
        (RunState.CLAIMED, token), (RunState.RUNNING, token), (RunState.RUNNING, token_b),
        (RunState.COMPLETED, token_b)]


def test_a_fenced_member_leaves_at_once_though_its_work_cannot_be_cancelled(env) -> None:
    """The successor leads within its acquire_timeout (20 s), below max_poll_interval (30 s)
    that an abandoned, unpolled member would hold the role for."""
    tmp = env["tmp"]
    common = {"role": "export", "run_key": "2013-04-01", "output": str(tmp / "out")}
    a = start("hold", args_for(env, "us-east-1", status=str(tmp / "a"), go=str(tmp / "a.go"),
                               **common), tmp / "a.log")
    token_a = int(wait_line(tmp / "a", "started", 120, a).split()[1])
    os.kill(a.pid, signal.SIGSTOP)
    time.sleep(TIMINGS["heartbeat_timeout"] * 2)
    os.kill(a.pid, signal.SIGCONT)
    wait_line(tmp / "a", "fence-callback", 30, a)  # the work ignores it and keeps running
    assert a.poll() is None
    (tmp / "b.go").touch()
    b = start("hold", args_for(env, "eu-west-1", status=str(tmp / "b"), go=str(tmp / "b.go"),
                               acquire_timeout=20.0, **common), tmp / "b.log")
    assert b.wait(timeout=120) == 0, lines(tmp / "b")
    outcome = wait_line(tmp / "b", "outcome", 1).split()
    assert outcome[1] == "TAKE_OVER" and int(outcome[2]) > token_a, outcome
    assert a.poll() is None, "the successor finished while the fenced work still ran"
    (tmp / "a.go").touch()
    assert a.wait(timeout=60) == 3, lines(tmp / "a")
    assert f"stale {token_a} {outcome[2]}" in lines(tmp / "a")
    assert (tmp / "out" / "2013-04-01" / "part-0.txt").read_text() == f"eu-west-1 {outcome[2]}\n"


def test_reset_reruns_a_completed_run_key_once_with_a_larger_token(env) -> None:
    """Issue 10 item 3: an audited reset; the token keeps growing; other regions skip after."""
    with singleton(env, "us-east-1") as east, singleton(env, "eu-west-1") as west:
        first = east.run("flights", "2013-01-07", lambda run: run.token)
        assert first is not None
        reset = east.reset("flights", "2013-01-07", "alice: upstream data was re-delivered")
        assert reset.state is RunState.RESET and reset.token > first
        again = west.run("flights", "2013-01-07", lambda run: (run.outcome, run.token))
        assert again is not None and again[1] > reset.token and str(again[0]) == "RUN"
        assert east.run("flights", "2013-01-07", lambda run: "ran a third time") is None
    assert [(d, s) for d, s, _ in history(env, "2013-01-07")] == [
        ("us-east-1", RunState.RUNNING), ("us-east-1", RunState.COMPLETED),
        ("us-east-1", RunState.RESET), ("eu-west-1", RunState.RUNNING),
        ("eu-west-1", RunState.COMPLETED)]
    assert [r.reason for r in ledger_records(env["bootstrap"], env["ledger_topic"])
            if r.state is RunState.RESET] == ["alice: upstream data was re-delivered"]
