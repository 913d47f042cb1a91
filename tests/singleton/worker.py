"""A deployment in its own process, driven by the real-broker singleton tests.

    python worker.py many   '<json>'   # claim many (role, run key) pairs, record executions
    python worker.py hold   '<json>'   # claim one run, hold the work until a "go" file appears
    python worker.py zombie '<json>'   # raw ledger writer: RUNNING, then COMPLETED on "go"
    python worker.py execute '<json>'  # Singleton.execute(token): cancellable work until "go"

Each mode appends what happened to files named in the JSON, one line per fact, so the test
can assert on executions, tokens and errors after the fact (even after kill -9).
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import threading
import time
from pathlib import Path

from neli_orchestrate import FencedError, NeliConfig, Outcome, Singleton, SingletonConfig
from neli_orchestrate.errors import StaleTokenError
from neli_orchestrate.ledger.kafka import KafkaLedger
from neli_orchestrate.ledger.record import RunState

# Fast profile with wider margins than its defaults: the tests run on 2 busy cores, and a
# spurious fence would be a (safe) fault in tests that assert fault-free behaviour. The group
# protocol is the default ("auto": KIP-848 on the test broker) unless a test sets
# timings={"group_protocol": ...}; test_singleton_kafka.py runs under classic and consumer.
TIMINGS = {"profile": "fast", "session_timeout": 6.0, "heartbeat_timeout": 2.0}


def config(args: dict) -> SingletonConfig:  # type: ignore[type-arg]
    timings = {**TIMINGS, **args.get("timings", {})}
    neli = NeliConfig(bootstrap_servers=args["bootstrap"], **timings)
    return SingletonConfig(neli=neli, namespace=args["namespace"], deployment=args["deployment"],
                           ledger_topic=args["ledger_topic"],
                           acquire_timeout=args.get("acquire_timeout", 30.0),
                           handoff_timeout=30.0)


def append(path: str, line: str) -> None:
    # O_APPEND: concurrent small writes from several processes do not interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def wait_for(path: Path, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.02)
    return False


def many(args: dict) -> int:  # type: ignore[type-arg]
    """Claim every (role, run key) pair; one thread per role, run keys in a random order."""
    singleton = Singleton(config(args))
    by_role: dict[str, list[str]] = {}
    for role, run_key in args["pairs"]:
        by_role.setdefault(role, []).append(run_key)
    rng = random.Random(args["deployment"])
    errors: list[BaseException] = []

    def contend(role: str, run_keys: list[str]) -> None:
        pending = list(run_keys)
        rng.shuffle(pending)
        deadline = time.monotonic() + args.get("deadline", 240)
        while pending and time.monotonic() < deadline:
            run_key = pending.pop(0)
            try:
                with singleton.claim(role, run_key) as run:
                    if run.should_run:
                        append(args["executions"], f"{role} {run_key} {args['deployment']}"
                                                   f" {run.token}")
                    append(args["outcomes"], f"{role} {run_key} {args['deployment']}"
                                             f" {run.outcome}")
                    if run.outcome is Outcome.WAIT:
                        pending.append(run_key)
                        # busy role: ask again after a pause, as a gate or a Dagster step
                        # does; polling membership and the ledger flat out loads the broker
                        time.sleep(0.5)
            except FencedError as exc:
                # Safe, but a fault: the test decides whether it may happen. Try again later,
                # as an orchestrator's retry would.
                append(args["outcomes"], f"{role} {run_key} {args['deployment']} FENCED {exc!r}")
                pending.append(run_key)
            except BaseException as exc:  # noqa: BLE001 - reported to the test
                errors.append(exc)
                append(args["outcomes"], f"{role} {run_key} {args['deployment']} ERROR {exc!r}")
                return

    threads = [threading.Thread(target=contend, args=item) for item in by_role.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    singleton.close()
    return 1 if errors else 0


def hold(args: dict) -> int:  # type: ignore[type-arg]
    """Claim one run; in the work, report the token, wait for "go", publish through the guard.

    While the role is busy (a paused or killed holder stays in its group until its session
    times out) a claim answers WAIT without joining: ask again, as a gate does.
    """
    from neli_orchestrate.spark import TokenCommitGuard

    status, go = args["status"], Path(args["go"])
    singleton = Singleton(config(args))
    guard = TokenCommitGuard(args["output"])
    deadline = time.monotonic() + args.get("wait", 60)
    try:
        while True:
            with singleton.claim(args["role"], args["run_key"]) as run:
                if run.outcome is Outcome.WAIT and time.monotonic() < deadline:
                    time.sleep(0.1)
                    continue
                append(status, f"outcome {run.outcome} {run.token}")
                if not run.should_run:
                    return 0
                run.on_fence(lambda reason: append(status, "fence-callback"))
                append(status, f"started {run.token} {time.monotonic()}")
                if not wait_for(go, time.monotonic() + 120):
                    append(status, "no-go")
                    return 2
                # Deliberately no run.check() here: the sink must refuse a stale token itself.
                try:
                    with guard.stage(args["run_key"], token=run.token,
                                     role=args["role"]) as staged:
                        (staged.path / "part-0.txt").write_text(
                            f"{args['deployment']} {run.token}\n")
                    append(status, f"committed {run.token}")
                except StaleTokenError as exc:
                    append(status, f"stale {exc.token} {exc.committed}")
                    raise
            append(status, "completed")
            return 0
    except FencedError as exc:
        append(status, f"fenced {exc}")
        return 3


def zombie(args: dict) -> int:  # type: ignore[type-arg]
    """S2 with processes: a ledger writer that a newer leader's begin() must fence."""
    status, go = args["status"], Path(args["go"])
    ledger = KafkaLedger(config(args).ledger_config())
    writer = ledger.begin(args["role"])
    replay = writer.replay()
    from neli_orchestrate.decision import Claimant, DecisionPolicy, claim_record, decide

    me = Claimant(args["deployment"], "zombie")
    policy = DecisionPolicy(handoff_timeout=30.0)
    decision = decide(replay.latest(args["run_key"]), me, now=time.time(), policy=policy)
    record = claim_record(decision, replay, run_key=args["run_key"], me=me, now=time.time(),
                          policy=policy, state=RunState.RUNNING)
    writer.write(record)
    append(status, f"running {record.token}")
    if not wait_for(go, time.monotonic() + 120):
        append(status, "no-go")
        return 2
    try:
        writer.write(record.advance(RunState.COMPLETED, at=time.time()))
    except FencedError as exc:
        append(status, f"fenced {exc}")
        return 3
    append(status, "written")
    return 0


def execute(args: dict) -> int:  # type: ignore[type-arg]
    """One executor try with the gate's token; the work checks for a fence while it waits."""
    status, go = args["status"], Path(args["go"])
    singleton = Singleton(config(args))

    def work(run) -> None:  # type: ignore[no-untyped-def]
        append(status, f"started {run.token}")
        deadline = time.monotonic() + 120
        while not go.exists():
            run.check()  # cancellable work: stops at the fence
            if time.monotonic() > deadline:
                raise TimeoutError("no go")
            time.sleep(0.02)

    try:
        singleton.execute(args["role"], args["run_key"], args["token"], work)
    except FencedError as exc:
        append(status, f"fenced {exc}")
        return 3
    append(status, "completed")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(threadName)s %(name)s: %(message)s")
    mode, payload = sys.argv[1], json.loads(sys.argv[2])
    sys.exit({"many": many, "hold": hold, "zombie": zombie, "execute": execute}[mode](payload))
