"""Benchmark replaying a 100k-run-key ledger on a real broker (target: < 2 s).

Usage::

    python integration/bench/ledger_replay.py                       # starts a LocalKafka
    python integration/bench/ledger_replay.py --bootstrap 127.0.0.1:9092 --keys 100000

Cases, each a fresh ledger topic (one partition) written by the role's transactional producer
in batches, so it holds transaction markers like a real ledger:

- ``compacted``: one COMPLETED record per run key (a ledger after compaction);
- ``history``: CLAIMED, RUNNING, COMPLETED per run key (3x the messages: before compaction);
- ``shared``: the role's run keys plus as many records of another role on the same partition
  (replay reads the whole partition and skips the other role's keys without decoding them).

For each case: ``cold`` = a new :class:`KafkaLedger` per trial (client start-up, topic check,
consumer creation included), ``warm`` = a second replay on the same ledger. Wall and CPU time
(``time.process_time``, all threads of this process) are reported, because a loaded machine
inflates wall time. Every replay is checked: all run keys present and COMPLETED.

Writes ``integration/bench/results/ledger_replay.json`` and ``ledger_replay.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
import timeit
import uuid
from pathlib import Path
from typing import Any

from neli_orchestrate.ledger.kafka import KafkaLedger, KafkaLedgerConfig
from neli_orchestrate.ledger.record import LedgerRecord, RunState, role_partition

RESULTS = Path(__file__).resolve().parent / "results"
ROLE = "daily_flights"
OTHER = "billing_export"
BATCH = 5000
TARGET_SECONDS = 2.0


def populate(bootstrap: str, topic: str, keys: int, case: str) -> int:
    """Write the case's records; returns the number of data messages."""
    from confluent_kafka import Producer

    config = KafkaLedgerConfig(bootstrap_servers=bootstrap, topic=topic)
    ledger = KafkaLedger(config)
    assert ledger.partition_for(ROLE) == role_partition(ROLE, 1) == 0  # creates the topic
    ledger.close()
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "transactional.id": config.transactional_id(ROLE),
        "linger.ms": 20,
        "batch.num.messages": 10000,
        "queue.buffering.max.messages": 1_000_000,
        "logger": logging.getLogger("bench.librdkafka"),
    })
    producer.init_transactions(30)
    now = time.time()
    offset = 0
    messages = 0

    def records(i: int) -> list[tuple[str, LedgerRecord]]:
        run_key = f"{i:06d}"
        done = LedgerRecord(ROLE, run_key, RunState.COMPLETED, 0, "us-east-1",
                            "host_12345_1736000000", 1, now - i)
        if case == "history":
            claimed = LedgerRecord(ROLE, run_key, RunState.CLAIMED, 0, "us-east-1",
                                   "host_12345_1736000000", 1, now - i,
                                   handoff_deadline=now - i + 300)
            running = claimed.advance(RunState.RUNNING, at=now - i)
            return [("claim", claimed), ("advance", running), ("advance", done)]
        if case == "shared":
            other = LedgerRecord(OTHER, run_key, RunState.COMPLETED, 0, "eu-west-1",
                                 "host_999_1736000000", 1, now - i)
            return [("claim", done), ("other", other)]
        return [("claim", done)]

    pending: list[LedgerRecord] = []
    for i in range(keys):
        for _, record in records(i):
            pending.append(record)
        if len(pending) >= BATCH or i == keys - 1:
            producer.begin_transaction()
            for record in pending:
                # Offsets are known (one writer): the token of each record is the offset it
                # lands at, within the rule token <= offset.
                stamped = LedgerRecord(
                    record.role, record.run_key, record.state, offset, record.deployment,
                    record.member, record.attempt, record.at, record.reason,
                    record.handoff_deadline,
                )
                producer.produce(topic, key=stamped.key, value=stamped.encode(), partition=0)
                offset += 1
            producer.commit_transaction(60)
            offset += 1  # the commit marker
            messages += len(pending)
            pending = []
    producer.flush(30)
    return messages


def replay_once(ledger: KafkaLedger, keys: int) -> tuple[float, float, int]:
    wall, cpu = time.perf_counter(), time.process_time()
    replay = ledger.replay(ROLE)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert len(replay.records) == keys, (len(replay.records), keys)
    assert all(r.state is RunState.COMPLETED for r in replay.records.values())
    return wall, cpu, replay.end_offset


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def run_case(bootstrap: str, keys: int, case: str, trials: int) -> dict[str, Any]:
    topic = f"bench.ledger.{case}.{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    messages = populate(bootstrap, topic, keys, case)
    populate_s = time.perf_counter() - started
    cold_wall, cold_cpu, warm_wall, warm_cpu = [], [], [], []
    end_offset = 0
    for _ in range(trials):
        ledger = KafkaLedger(KafkaLedgerConfig(bootstrap_servers=bootstrap, topic=topic,
                                               replay_timeout=120.0))
        wall, cpu, end_offset = replay_once(ledger, keys)
        cold_wall.append(wall)
        cold_cpu.append(cpu)
        wall, cpu, _ = replay_once(ledger, keys)
        warm_wall.append(wall)
        warm_cpu.append(cpu)
        ledger.close()
    return {
        "case": case,
        "topic": topic,
        "run_keys": keys,
        "messages": messages,
        "end_offset": end_offset,
        "populate_seconds": populate_s,
        "trials": trials,
        "cold_wall": summary(cold_wall),
        "cold_cpu": summary(cold_cpu),
        "warm_wall": summary(warm_wall),
        "warm_cpu": summary(warm_cpu),
        "records_per_second_warm": messages / statistics.median(warm_wall),
        "meets_target": statistics.median(cold_wall) < TARGET_SECONDS,
    }


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Ledger replay ({results['run_keys']} run keys, target < {TARGET_SECONDS:.0f} s)",
        "",
        f"{results['machine']['cpus']} CPUs, load average {results['machine']['load_before']}"
        f" before / {results['machine']['load_after']} after; CPU speed reference"
        f" `sum(range(1000))` = {results['machine']['reference_us']:.1f} µs wall,"
        f" {results['machine']['reference_cpu_us']:.1f} µs CPU (an idle modern core: ~8 µs)."
        " Wall times on a loaded machine include waiting for a CPU; CPU times do not.",
        "",
        "| case | messages | cold wall p50 (max) | cold CPU p50 | warm wall p50 (max) |"
        " warm CPU p50 | records/s warm | < 2 s |",
        "|---|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for case in results["cases"]:
        lines.append(
            f"| {case['case']} | {case['messages']} |"
            f" {case['cold_wall']['p50']:.2f} s ({case['cold_wall']['max']:.2f}) |"
            f" {case['cold_cpu']['p50']:.2f} s |"
            f" {case['warm_wall']['p50']:.2f} s ({case['warm_wall']['max']:.2f}) |"
            f" {case['warm_cpu']['p50']:.2f} s |"
            f" {case['records_per_second_warm']:.0f} |"
            f" {'yes' if case['meets_target'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("NELI_TEST_BOOTSTRAP_SERVERS"))
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--cases", default="compacted,history,shared")
    args = parser.parse_args(argv)

    kafka = None
    bootstrap = args.bootstrap
    if not bootstrap:
        from neli_orchestrate.testing import LocalKafka

        kafka = LocalKafka()
        kafka.start()
        bootstrap = kafka.bootstrap_servers
    try:
        load_before = os.getloadavg()[0]
        reference = min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000 * 1e6
        reference_cpu = min(
            timeit.repeat("sum(range(1000))", number=2000, repeat=5, timer=time.process_time)
        ) / 2000 * 1e6
        cases = [run_case(bootstrap, args.keys, case, args.trials)
                 for case in args.cases.split(",")]
    finally:
        if kafka is not None:
            kafka.stop()
    from confluent_kafka import libversion

    results = {
        "benchmark": "ledger_replay",
        "run_keys": args.keys,
        "target_seconds": TARGET_SECONDS,
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "librdkafka": libversion()[0],
            "load_before": round(load_before, 2),
            "load_after": round(os.getloadavg()[0], 2),
            "reference_us": reference,
            "reference_cpu_us": reference_cpu,
        },
        "cases": cases,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ledger_replay.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    (RESULTS / "ledger_replay.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
