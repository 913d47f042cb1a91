"""Benchmark an uncontended claim on a real broker: join → leader → fence → replay → CLAIMED.

Usage::

    python integration/bench/claim.py --trials 20                      # starts a LocalKafka
    python integration/bench/claim.py --bootstrap 127.0.0.1:9092

Each trial calls ``Singleton.reserve(role, run_key)`` for a fresh run key of a role nobody else
contends for, and times it end to end: the member joins the role's group, leads, begins the
role's transactional ledger writer (``init_transactions()``), replays the ledger, decides,
commits the CLAIMED record and leaves the group. ``claim`` (``Singleton.claim`` with empty
work: RUNNING + COMPLETED) is timed the same way. Both group protocols, side by side in one
run. Target (issue 4): reserve p50 < 500 ms on this machine.

Writes ``integration/bench/results/claim.json`` and ``claim.md`` and prints the table.

Ledger size (issue 12, goal 4)::

    python integration/bench/claim.py --ledger-records 1000000 --trials 20

Two namespaces on one broker: one with an empty ledger, one whose ledger (one partition, as
by default) already holds ``--ledger-records`` records of ``--roles`` roles, among them three
years of daily runs (CLAIMED, RUNNING, COMPLETED) of the measured role, written fast with a
raw producer. Trials alternate between the two, side by side, in two set-ups: a long-lived
``Singleton`` (Dagster, a service: the replay checkpoint stays in memory) and a new
``Singleton`` per reserve (every Airflow task is a new process: the checkpoint comes from
the per-host file). Reserves with ``ledger_replay_cache=False`` show the cost of replaying
from offset 0: on the empty ledger in every round (the cache's own overhead), on the full one
``--full-replays`` times after the rounds (each takes seconds). Writes
``claim_ledger_size.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from benchlib import broker, percentile

RESULTS = Path(__file__).resolve().parent / "results"


def run(bootstrap: str, trials: int, protocols: list[str]) -> dict[str, Any]:
    from neli_orchestrate import NeliConfig, Outcome, Singleton, SingletonConfig

    results: dict[str, Any] = {}
    for protocol in protocols:
        ns = f"bench{uuid.uuid4().hex[:6]}"
        neli = NeliConfig(bootstrap_servers=bootstrap, profile="fast", group_protocol=protocol)
        singleton = Singleton(SingletonConfig(neli=neli, namespace=ns, deployment="bench"))
        # one untimed claim: creates the leader and ledger topics and loads the coordinators
        singleton.reserve("warm-up", "0")
        for kind in ("reserve", "claim"):
            samples = []
            for i in range(trials):
                start = time.perf_counter()
                if kind == "reserve":
                    reservation = singleton.reserve(f"role-{kind}", f"k{i}")
                    outcome, reason = reservation.outcome, reservation.reason
                else:
                    with singleton.claim(f"role-{kind}", f"k{i}") as r:
                        outcome, reason = r.outcome, r.reason
                samples.append((time.perf_counter() - start) * 1000)
                if outcome is not Outcome.RUN:
                    raise RuntimeError(f"uncontended {kind} answered {outcome}: {reason}")
            results[f"{protocol}/{kind}"] = {
                "trials": trials, "p50_ms": round(statistics.median(samples), 1),
                "p99_ms": round(percentile(samples, 0.99), 1),
                "min_ms": round(min(samples), 1), "samples_ms": [round(s, 1) for s in samples],
            }
        singleton.close()
    return results


def populate(bootstrap: str, namespace: str, records: int, roles: int, role: str) -> int:
    """Fill ``namespace``'s ledger (partition 0) with ``records`` records; returns the count."""
    from confluent_kafka import Producer

    from neli_orchestrate.core.namespace import derive
    from neli_orchestrate.ledger.kafka import KafkaLedger, KafkaLedgerConfig
    from neli_orchestrate.ledger.record import LedgerRecord, RunState

    topic = derive(namespace).ledger_topic
    KafkaLedger(KafkaLedgerConfig(bootstrap_servers=bootstrap, topic=topic,
                                  replay_cache=False)).partition_for(role)  # creates the topic
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50,
                         "batch.num.messages": 10000, "queue.buffering.max.messages": 500000,
                         "enable.idempotence": True, "compression.type": "lz4"})
    now = time.time()
    offset = 0

    def send(key: bytes, value: bytes) -> None:
        while True:
            try:
                producer.produce(topic, key=key, value=value, partition=0)
                return
            except BufferError:
                producer.poll(0.1)

    # The measured role: three years of daily runs; tokens are the offsets they land at.
    days = 3 * 365
    for day in range(days):
        run_key = f"history-{day:04d}"
        at = now - (days - day) * 86400
        claimed = LedgerRecord(role, run_key, RunState.CLAIMED, offset, "us-east-1", "m", 1,
                               at, handoff_deadline=at + 300)
        running = claimed.advance(RunState.RUNNING, at=at)
        for record in (claimed, running, running.advance(RunState.COMPLETED, at=at)):
            send(record.key, record.encode())
            offset += 1
    # Every other role: one finished record per run key (never decoded by the measured role).
    others = max(1, roles - 1)
    per_role = max(1, (records - offset) // others)
    for r in range(others):
        other = f"role-{r:04d}"
        value = LedgerRecord(other, "template", RunState.COMPLETED, 0, "eu-west-1", "m", 1,
                             now).encode()
        for i in range(per_role):
            if offset >= records:
                break
            send(f'["{other}","{i:07d}"]'.encode(), value)
            offset += 1
    producer.flush(120)
    return offset


def run_ledger_size(bootstrap: str, trials: int, records: int, roles: int,
                    full_replays: int) -> dict[str, Any]:
    import random
    import tempfile

    from neli_orchestrate import NeliConfig, Outcome, Singleton, SingletonConfig

    role = "daily_flights"
    run = uuid.uuid4().hex[:6]
    spaces = {"empty": f"benchE{run}", "full": f"benchF{run}"}
    started = time.perf_counter()
    written = populate(bootstrap, spaces["full"], records, roles, role)
    populate_s = time.perf_counter() - started
    cache_dir = tempfile.mkdtemp(prefix="neli-bench-cache-")
    neli = NeliConfig(bootstrap_servers=bootstrap, profile="fast")

    def config(space: str, **kwargs: Any) -> SingletonConfig:
        return SingletonConfig(neli=neli, namespace=spaces[space], deployment="bench",
                               ledger_replay_cache_dir=cache_dir, **kwargs)

    outcomes: dict[str, list[str]] = {}

    def reserve(singleton: Singleton, key: str, *, strict: bool = True,
                name: str = "") -> float:
        start = time.perf_counter()
        reservation = singleton.reserve(role, key)
        elapsed = (time.perf_counter() - start) * 1000
        outcomes.setdefault(name, []).append(
            f"{reservation.outcome}" + ("" if reservation.outcome is Outcome.RUN
                                        else f": {reservation.reason}"))
        if strict and reservation.outcome is not Outcome.RUN:
            raise RuntimeError(f"uncontended reserve answered {reservation.outcome}:"
                               f" {reservation.reason}")
        return elapsed

    samples: dict[str, list[float]] = {}
    first: dict[str, float] = {}
    long_lived = {space: Singleton(config(space)) for space in spaces}
    for space in spaces:   # untimed: topics, coordinators; the first replay has no checkpoint
        name = f"{space}/first reserve (no checkpoint)"
        first[name] = reserve(long_lived[space], "warm", strict=False, name=name)
    loads = [os.getloadavg()[0]]
    # The cache's own cost: the empty ledger without it, in the same rounds.
    setups = [(space, setup) for space in spaces for setup in ("long-lived", "per-process")]
    setups.append(("empty", "no cache (replay from 0)"))
    for i in range(trials):
        random.shuffle(setups)
        for space, setup in setups:
            key = f"{setup}-{i}"
            if setup == "long-lived":
                elapsed = reserve(long_lived[space], key)
            else:
                cache = {} if setup == "per-process" else {"ledger_replay_cache": False}
                with Singleton(config(space, **cache)) as fresh:
                    elapsed = reserve(fresh, key)
            samples.setdefault(f"{space}/{setup}", []).append(elapsed)
        loads.append(os.getloadavg()[0])
    for singleton in long_lived.values():
        singleton.close()
    # Without the cache (as before): the replay from offset 0 may outlast the member's lease
    # (it holds the GIL while the watchdog should pulse); such a reserve answers WAIT.
    for i in range(full_replays):
        name = "full/no cache (replay from 0)"
        with Singleton(config("full", ledger_replay_cache=False)) as blind:
            samples.setdefault(name, []).append(
                reserve(blind, f"blind-{i}", strict=False, name=name))
    replay_from_zero = []
    for _ in range(full_replays):
        from neli_orchestrate.ledger.kafka import KafkaLedger

        ledger = KafkaLedger(dataclasses.replace(config("full").ledger_config(),
                                                 replay_cache=False, replay_timeout=300.0))
        start = time.perf_counter()
        replay = ledger.replay(role)
        replay_from_zero.append(round(time.perf_counter() - start, 2))
        ledger.close()
        missing = [d for d in range(3 * 365) if f"history-{d:04d}" not in replay.records]
        if missing:
            raise RuntimeError(f"replay from offset 0 lost {len(missing)} history run keys")

    def stats(values: list[float]) -> dict[str, Any]:
        return {"n": len(values), "p50_ms": round(statistics.median(values), 1),
                "p90_ms": round(percentile(values, 0.9), 1),
                "min_ms": round(min(values), 1), "samples_ms": [round(v, 1) for v in values]}

    results = {name: stats(values) for name, values in samples.items()}
    ratios = {setup: round(results[f"full/{setup}"]["p50_ms"]
                           / results[f"empty/{setup}"]["p50_ms"], 2)
              for setup in ("long-lived", "per-process", "no cache (replay from 0)")
              if f"full/{setup}" in results}
    return {"records": written, "roles": roles, "populate_seconds": round(populate_s, 1),
            "first_reserve_ms": {k: round(v, 1) for k, v in first.items()},
            "results": results, "p50_ratio_full_over_empty": ratios,
            "outcomes": {k: sorted(set(v)) for k, v in outcomes.items()},
            "full_ledger_replay_from_zero_seconds": replay_from_zero,
            "load_avg_1min": {"min": min(loads), "mean": round(statistics.mean(loads), 2),
                              "max": max(loads)}}


PHASES = (
    # (object path, method, label) in the order a reserve passes them
    ("neli_orchestrate.singleton.singleton:Singleton", "_busy", "busy check (DescribeGroups)"),
    ("neli_orchestrate.singleton.singleton:Singleton", "_warm",
     "prepare: first checkpoint (if none), connect producer"),
    ("neli_orchestrate.singleton.leadership:_Leadership", "__init__",
     "member start (admin checks, producer, consumer, subscribe)"),
    ("neli_orchestrate.singleton.leadership:_Leadership", "acquire",
     "join, assignment, own heartbeat read back"),
    ("neli_orchestrate.ledger.kafka:KafkaLedger", "begin", "ledger producer + init_transactions"),
    ("neli_orchestrate.ledger.kafka:KafkaLedger", "_replay", "replay (tail)"),
    ("neli_orchestrate.ledger.kafka:KafkaLedgerWriter", "write", "CLAIMED transaction commit"),
    ("neli_orchestrate.singleton.leadership:_Leadership", "close",
     "leave the group, close clients"),
)


def run_phases(bootstrap: str, trials: int, protocol: str) -> dict[str, Any]:
    """Time each phase of an uncontended reserve (wrapping the methods; trials in sequence)."""
    import importlib

    from neli_orchestrate import NeliConfig, Outcome, Singleton, SingletonConfig

    timings: dict[str, list[float]] = {}
    restore = []
    for path, method, label in PHASES:
        module, cls = path.split(":")
        owner = getattr(importlib.import_module(module), cls)
        original = getattr(owner, method)

        def timed(*args: Any, __original: Any = original, __label: str = label,
                  **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return __original(*args, **kwargs)
            finally:
                timings.setdefault(__label, []).append((time.perf_counter() - start) * 1000)

        setattr(owner, method, timed)
        restore.append((owner, method, original))
    try:
        neli = NeliConfig(bootstrap_servers=bootstrap, profile="fast", group_protocol=protocol)
        with Singleton(SingletonConfig(neli=neli, namespace=f"phases{uuid.uuid4().hex[:6]}",
                                       deployment="bench")) as singleton:
            singleton.reserve("warm-up", "0")
            timings.clear()
            totals = []
            for i in range(trials):
                start = time.perf_counter()
                reservation = singleton.reserve("role", f"k{i}")
                totals.append((time.perf_counter() - start) * 1000)
                if reservation.outcome is not Outcome.RUN:
                    raise RuntimeError(f"uncontended reserve answered {reservation.outcome}:"
                                       f" {reservation.reason}")
    finally:
        for owner, method, original in restore:
            setattr(owner, method, original)
    phases = {label: round(statistics.median(timings.get(label, [0.0])), 1)
              for _, _, label in PHASES}
    return {"protocol": protocol, "trials": trials,
            "total_p50_ms": round(statistics.median(totals), 1), "phase_p50_ms": phases}


def ledger_size_table(data: dict[str, Any]) -> str:
    rows = ["| set-up | empty ledger: n, p50 / p90 ms | "
            f"{data['records']:,} records: n, p50 / p90 ms | p50 ratio |", "|---|---|---|---|"]
    for setup, ratio in data["p50_ratio_full_over_empty"].items():
        empty, full = data["results"][f"empty/{setup}"], data["results"][f"full/{setup}"]
        rows.append(f"| {setup} | {empty['n']}, {empty['p50_ms']} / {empty['p90_ms']} |"
                    f" {full['n']}, {full['p50_ms']} / {full['p90_ms']} | {ratio}x |")
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="existing cluster (default: start a LocalKafka)")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--protocols", nargs="+", default=["classic", "consumer"])
    parser.add_argument("--phases", action="store_true",
                        help="instead: where the time of an uncontended reserve goes")
    parser.add_argument("--ledger-records", type=int, default=0,
                        help="instead: reserve on an empty ledger vs one with this many records")
    parser.add_argument("--roles", type=int, default=1000,
                        help="roles in the full ledger (with --ledger-records)")
    parser.add_argument("--full-replays", type=int, default=3,
                        help="reserves without the replay cache, per ledger")
    args = parser.parse_args()
    with broker(args.bootstrap) as (bootstrap, _):
        if args.phases:
            profiles = [run_phases(bootstrap, args.trials, protocol)
                        for protocol in args.protocols]
        elif args.ledger_records:
            data = run_ledger_size(bootstrap, args.trials, args.ledger_records, args.roles,
                                   args.full_replays)
        else:
            results = run(bootstrap, args.trials, args.protocols)
    if args.phases:
        load = os.getloadavg()
        rows = ["| phase | " + " | ".join(f"{p['protocol']} p50 ms" for p in profiles) + " |",
                "|---|" + "---|" * len(profiles)]
        for _, _, label in PHASES:
            rows.append(f"| {label} | "
                        + " | ".join(str(p["phase_p50_ms"][label]) for p in profiles) + " |")
        rows.append("| **reserve, end to end** | "
                    + " | ".join(f"**{p['total_p50_ms']}**" for p in profiles) + " |")
        table = "\n".join(rows) + "\n"
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "claim_phases.json").write_text(json.dumps(
            {"profiles": profiles, "load_avg": load, "cpus": os.cpu_count()}, indent=2))
        (RESULTS / "claim_phases.md").write_text(
            f"# Where an uncontended reserve spends its time\n\n`python"
            f" integration/bench/claim.py --phases --trials {args.trials}`; load average"
            f" {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on {os.cpu_count()} cores.\n\n"
            + table)
        print(table)
        return
    if args.ledger_records:
        data["meta"] = {"machine": platform.platform(), "cpus": os.cpu_count(),
                        "python": platform.python_version(), "profile": "fast",
                        "group_protocol": "classic", "when": time.time(),
                        "command": "python integration/bench/claim.py --ledger-records"
                                   f" {args.ledger_records} --roles {args.roles} --trials"
                                   f" {args.trials} --full-replays {args.full_replays}"}
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "claim_ledger_size.json").write_text(json.dumps(data, indent=2))
        table = ledger_size_table(data)
        load = data["load_avg_1min"]
        (RESULTS / "claim_ledger_size.md").write_text(
            f"# Uncontended reserve: empty ledger vs {data['records']:,} records\n\n"
            f"`{data['meta']['command']}`; {data['meta']['cpus']} cores, load average (1 min)"
            f" min {load['min']:.1f} / mean {load['mean']:.1f} / max {load['max']:.1f}.\n\n"
            + table + f"\nFirst reserve (no checkpoint yet): {data['first_reserve_ms']}\n\n"
            f"Replay of the full ledger from offset 0 (no cache, no leadership):"
            f" {data['full_ledger_replay_from_zero_seconds']} s\n\n"
            f"Outcomes: {data['outcomes']}\n")
        print(table)
        print(json.dumps({k: v for k, v in data.items() if k != "results"}, indent=2))
        return
    meta = {"machine": platform.machine(), "cpus": os.cpu_count(),
            "load_avg": os.getloadavg(), "profile": "fast", "when": time.time()}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "claim.json").write_text(json.dumps({"meta": meta, "results": results},
                                                   indent=2))
    rows = ["| protocol / call | trials | p50 ms | p99 ms | min ms |", "|---|---|---|---|---|"]
    for name, r in results.items():
        rows.append(f"| {name} | {r['trials']} | {r['p50_ms']} | {r['p99_ms']} | {r['min_ms']} |")
    table = "\n".join(rows) + "\n"
    (RESULTS / "claim.md").write_text(
        f"# Uncontended claim latency\n\n`python integration/bench/claim.py --trials "
        f"{args.trials}`; load average {meta['load_avg'][0]:.1f} on {meta['cpus']} cores.\n\n"
        + table)
    print(table)


if __name__ == "__main__":
    main()
