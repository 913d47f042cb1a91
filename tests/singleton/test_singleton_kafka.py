"""Exactly-once against the real broker, with deployments as separate processes.

Each test asserts on what happened — executions recorded by the workers, the ledger's
records, the committed output — never on how long it took.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from neli_orchestrate.ledger.record import LedgerRecord, RunState, decode_key

pytestmark = pytest.mark.kafka

WORKER = Path(__file__).with_name("worker.py")


STARTED: list[subprocess.Popen[bytes]] = []


def start(mode: str, args: dict, log: Path) -> subprocess.Popen[bytes]:  # type: ignore[type-arg]
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, str(WORKER), mode, json.dumps(args)],
                                stdout=out, stderr=subprocess.STDOUT)
    STARTED.append(proc)
    return proc


@pytest.fixture(autouse=True)
def _no_worker_left_behind():  # type: ignore[no-untyped-def]
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait(10)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def wait_line(path: Path, prefix: str, timeout: float, proc=None) -> str:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in lines(path):
            if line.startswith(prefix):
                return line
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"no line {prefix!r} in {path}: {lines(path)}")


def ledger_records(bootstrap: str, topic: str) -> list[LedgerRecord]:
    """Every committed record of the ledger topic, in order (not just the latest per key)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"audit-{uuid.uuid4()}",
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                         "enable.partition.eof": True})
    consumer.subscribe([topic])
    records: list[LedgerRecord] = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == msg.error()._PARTITION_EOF:
                    return records
                raise AssertionError(msg.error())
            record = LedgerRecord.decode(msg.value(), key=msg.key())
            assert record is not None, f"unreadable ledger record {msg.value()!r}"
            records.append(record)
    finally:
        consumer.close()
    raise AssertionError("ledger audit did not reach the end of the topic")


@pytest.fixture(params=["classic", "consumer"])
def env(request: pytest.FixtureRequest, kafka_broker: str, tmp_path: Path) -> dict:  # type: ignore[type-arg]
    """One namespace per test, under each group protocol: both are default paths ("auto")."""
    ns = f"t{uuid.uuid4().hex[:8]}"
    return {"bootstrap": kafka_broker, "namespace": ns, "ledger_topic": f"{ns}.ledger",
            "tmp": tmp_path, "timings": {"group_protocol": request.param}}


def args_for(env: dict, deployment: str, **extra: object) -> dict:  # type: ignore[type-arg]
    base = {k: v for k, v in env.items() if k != "tmp"}
    return {**base, "deployment": deployment, **extra}


def test_three_deployments_fifty_run_keys_each_completes_exactly_once(env) -> None:
    tmp = env["tmp"]
    pairs = [[f"flights.shard{i % 5}", f"2013-01-{i:02d}"] for i in range(1, 51)]
    files = {"executions": str(tmp / "executions"), "outcomes": str(tmp / "outcomes")}
    procs = [start("many", args_for(env, region, pairs=pairs, **files), tmp / f"{region}.log")
             for region in ("us-east-1", "eu-west-1", "ap-south-1")]
    for proc in procs:
        assert proc.wait(timeout=400) == 0, (tmp / "outcomes").read_text()

    executions = [line.split() for line in lines(tmp / "executions")]
    ran = Counter((role, key) for role, key, _, _ in executions)
    assert sorted(ran) == sorted(map(tuple, pairs)), "every run key ran"
    assert set(ran.values()) == {1}, f"some run key ran twice: {ran.most_common(3)}"

    records = ledger_records(env["bootstrap"], env["ledger_topic"])
    completed = Counter((r.role, r.run_key) for r in records if r.state is RunState.COMPLETED)
    assert sorted(completed) == sorted(map(tuple, pairs))
    assert set(completed.values()) == {1}, "at most one COMPLETED per run key"
    tokens = {(r.role, r.run_key): r.token for r in records if r.state is RunState.COMPLETED}
    for role, key, _, token in executions:
        assert tokens[(role, key)] == int(token), "the execution's token is the completed one"

    # A deployment that starts after everything completed runs nothing.
    late = start("many", args_for(env, "late-region", pairs=pairs, **files), tmp / "late.log")
    assert late.wait(timeout=300) == 0
    late_outcomes = [line.split()[3] for line in lines(tmp / "outcomes")
                     if line.split()[2] == "late-region"]
    assert late_outcomes == ["SKIP_DONE"] * 50
    assert len(lines(tmp / "executions")) == 50


def test_kill_9_of_the_runner_mid_work_is_taken_over_with_a_larger_token(env) -> None:
    tmp = env["tmp"]
    common = {"role": "billing", "run_key": "2013-02-01", "output": str(tmp / "out")}
    a = start("hold", args_for(env, "us-east-1", status=str(tmp / "a"), go=str(tmp / "a.go"),
                               **common), tmp / "a.log")
    token_a = int(wait_line(tmp / "a", "started", 120, a).split()[1])
    a.send_signal(signal.SIGKILL)
    a.wait(30)
    (tmp / "b.go").touch()
    b = start("hold", args_for(env, "eu-west-1", status=str(tmp / "b"), go=str(tmp / "b.go"),
                               **common), tmp / "b.log")
    assert b.wait(timeout=120) == 0, lines(tmp / "b")
    outcome = wait_line(tmp / "b", "outcome", 1).split()
    assert outcome[1] == "TAKE_OVER" and int(outcome[2]) > token_a
    assert "completed" in lines(tmp / "b")

    records = [r for r in ledger_records(env["bootstrap"], env["ledger_topic"])
               if r.run_key == "2013-02-01"]
    assert [(r.deployment, r.state) for r in records] == [
        ("us-east-1", RunState.RUNNING), ("eu-west-1", RunState.RUNNING),
        ("eu-west-1", RunState.COMPLETED)]
    assert (tmp / "out" / "2013-02-01" / "part-0.txt").read_text() == f"eu-west-1 {outcome[2]}\n"


def test_paused_runner_cannot_commit_after_takeover(env) -> None:
    """SIGSTOP past the session timeout; on SIGCONT the sink refuses the stale token."""
    tmp = env["tmp"]
    common = {"role": "compaction", "run_key": "2013-03-01", "output": str(tmp / "out")}
    a = start("hold", args_for(env, "us-east-1", status=str(tmp / "a"), go=str(tmp / "a.go"),
                               **common), tmp / "a.log")
    try:
        token_a = int(wait_line(tmp / "a", "started", 120, a).split()[1])
        os.kill(a.pid, signal.SIGSTOP)
        (tmp / "b.go").touch()
        b = start("hold", args_for(env, "eu-west-1", status=str(tmp / "b"),
                                   go=str(tmp / "b.go"), **common), tmp / "b.log")
        assert b.wait(timeout=120) == 0, lines(tmp / "b")
        token_b = int(wait_line(tmp / "b", "committed", 1).split()[1])
        assert token_b > token_a
    finally:
        os.kill(a.pid, signal.SIGCONT)
    (tmp / "a.go").touch()
    assert a.wait(timeout=60) == 3, lines(tmp / "a")  # FencedError
    status_a = lines(tmp / "a")
    assert f"stale {token_a} {token_b}" in status_a or any(
        line.startswith("fenced") for line in status_a)
    assert not any(line.startswith("committed") for line in status_a)
    assert (tmp / "out" / "2013-03-01" / "part-0.txt").read_text() == f"eu-west-1 {token_b}\n"
    records = [r for r in ledger_records(env["bootstrap"], env["ledger_topic"])
               if r.run_key == "2013-03-01"]
    assert [(r.deployment, r.state) for r in records][-1] == ("eu-west-1", RunState.COMPLETED)
    assert sum(r.state is RunState.COMPLETED for r in records) == 1


def test_a_writer_fenced_by_a_newer_leader_cannot_write_from_another_process(env) -> None:
    """S2 across processes: a newer leader's begin() makes the old process's write fail."""
    tmp = env["tmp"]
    common = {"role": "export", "run_key": "2013-04-01"}
    zombie = start("zombie", args_for(env, "us-east-1", status=str(tmp / "z"),
                                      go=str(tmp / "z.go"), **common), tmp / "z.log")
    token_z = int(wait_line(tmp / "z", "running", 120, zombie).split()[1])
    (tmp / "b.go").touch()
    b = start("hold", args_for(env, "eu-west-1", status=str(tmp / "b"), go=str(tmp / "b.go"),
                               output=str(tmp / "out"), **common), tmp / "b.log")
    assert b.wait(timeout=120) == 0, lines(tmp / "b")
    assert int(wait_line(tmp / "b", "outcome TAKE_OVER", 1).split()[2]) > token_z
    (tmp / "z.go").touch()
    assert zombie.wait(timeout=60) == 3, lines(tmp / "z")
    assert any(line.startswith("fenced") for line in lines(tmp / "z"))
    keys = {decode_key(r.key) for r in ledger_records(env["bootstrap"], env["ledger_topic"])}
    assert keys == {("export", "2013-04-01")}


def test_role_members_counts_contenders_without_joining(env) -> None:
    from neli_orchestrate import Neli, NeliConfig, Singleton, SingletonConfig

    neli = NeliConfig(bootstrap_servers=env["bootstrap"],
                      profile="fast", session_timeout=6.0, heartbeat_timeout=2.0,
                      **env["timings"])
    singleton = Singleton(SingletonConfig(neli=neli, namespace=env["namespace"],
                                          deployment="us-east-1"))
    assert singleton.role_members("observed") == 0
    member = Neli(singleton.config.role_neli("observed"))
    try:
        deadline = time.monotonic() + 30
        while not member.pulse(0.05):
            assert time.monotonic() < deadline, "the only member never led"
        assert singleton.role_members("observed") == 1
        assert member.pulse(0.05), "observing did not disturb the leader"
    finally:
        member.close()
    deadline = time.monotonic() + 30
    while singleton.role_members("observed") != 0:
        assert time.monotonic() < deadline, "the closed member never left the group"
        time.sleep(0.1)
