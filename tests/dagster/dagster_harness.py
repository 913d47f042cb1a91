"""Helpers of the Dagster tests: start deployments as processes, read the ledger and evidence."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neli_orchestrate.ledger.record import LedgerRecord, parse_record

HERE = Path(__file__).resolve().parent
REGION_SCRIPT = HERE / "dagster_region.py"


@dataclass
class Deployment:
    """One simulated Dagster deployment: its name, home, environment, and process."""

    name: str
    home: Path
    env: dict[str, str]
    result_path: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self, job: str, executor: str, partitions: list[str], **extra: str) -> None:
        args = [
            sys.executable,
            str(REGION_SCRIPT),
            "--home",
            str(self.home),
            "--job",
            job,
            "--executor",
            executor,
            "--partitions",
            ",".join(partitions),
            "--result",
            str(self.result_path),
        ]
        for key, value in extra.items():
            args += [f"--{key.replace('_', '-')}", value]
        self.log_file = open(self.log_path, "wb")  # noqa: SIM115 - closed in wait()
        self.process = subprocess.Popen(
            args, env=self.env, stdout=self.log_file, stderr=subprocess.STDOUT
        )

    def wait(self, timeout: float) -> dict[str, Any]:
        assert self.process is not None
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(
                f"{self.name} did not finish in {timeout}s:\n{self.log_tail()}"
            ) from None
        finally:
            self.log_file.close()
        assert code == 0, f"{self.name} exited with {code}:\n{self.log_tail()}"
        return json.loads(self.result_path.read_text())

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def make_deployment(
    name: str,
    root: Path,
    bootstrap: str,
    namespace: str,
    extra_env: Mapping[str, str] | None = None,
) -> Deployment:
    home = root / name
    home.mkdir(parents=True)
    env = dict(os.environ)
    env.update(
        {
            "DAGSTER_HOME": str(home),
            "NELI_BOOTSTRAP_SERVERS": bootstrap,
            "NELI_DEPLOYMENT": name,
            "NELI_NAMESPACE": namespace,
            "NELI_TEST_DIR": str(root),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra_env or {})
    return Deployment(name, home, env, root / f"{name}.json", root / f"{name}.log")


def unique_namespace() -> str:
    return f"t-dagster-{uuid.uuid4().hex[:10]}"


def work_log(root: Path) -> list[tuple[str, str, str, int]]:
    """(role, run key, deployment, token) of every execution of work, in append order."""
    path = root / "work.log"
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        role, run_key, deployment, token, _pid = line.split(" ")
        entries.append((role, run_key, deployment, int(token)))
    return entries


def ledger_history(bootstrap: str, topic: str, timeout: float = 30.0) -> list[LedgerRecord]:
    """Every committed record of the ledger topic, in offset order (read_committed)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"t.reader.{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "logger": logging.getLogger("tests.dagster.librdkafka"),
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        partitions = list(metadata.topics[topic].partitions)
        ends = {}
        for partition in partitions:
            _low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=10
            )
            ends[partition] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records: list[LedgerRecord] = []
        positions = {p: 0 for p in partitions}
        deadline = time.monotonic() + timeout
        while any(positions[p] < ends[p] for p in partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"ledger {topic} not read to {ends} (at {positions})")
            message = consumer.poll(0.2)
            if message is None or message.error():
                # read_committed skips transaction markers: the position still moves on.
                for tp in consumer.position([TopicPartition(topic, p) for p in partitions]):
                    if tp.offset >= 0:
                        positions[tp.partition] = max(positions[tp.partition], tp.offset)
                continue
            positions[message.partition()] = message.offset() + 1
            if message.value() is not None:
                records.append(parse_record(message.value(), key=message.key()))
        return records
    finally:
        consumer.close()


def completed_by_run_key(records: list[LedgerRecord], role: str) -> Counter[str]:
    return Counter(r.run_key for r in records if r.role == role and r.state == "COMPLETED")
