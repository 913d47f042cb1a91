"""Name the open transaction that holds a ledger partition's last stable offset back.

confluent-kafka 2.16 offers no ``DescribeTransactions`` / ``ListTransactions`` (KIP-664), so the
transaction is found in the partition itself: its first record lies at the last stable offset
(ListOffsets ``latest`` read_committed), and, read read_uncommitted, that record says which
role (so which ``transactional.id``), run key, deployment and member wrote it, and when (the
record's timestamp). Used by a stuck replay's error and by ``neli-orchestrate doctor``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from neli_orchestrate.ledger.record import LedgerRecord, decode_key

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpenTransaction:
    """A transaction open on a ledger partition: it holds read_committed readers at
    ``start_offset`` until it commits or aborts."""

    topic: str
    partition: int
    #: The partition's last stable offset: the first offset of the open transaction.
    start_offset: int
    high_watermark: int
    #: Epoch seconds of the transaction's first record (None: not read).
    since: float | None = None
    role: str | None = None
    run_key: str | None = None
    #: ``transactional.id`` of the writer (None: not a ledger record).
    transactional_id: str | None = None
    #: The ledger record at ``start_offset`` (None: unreadable or not a ledger record).
    record: LedgerRecord | None = None

    def age(self, now: float) -> float | None:
        """Seconds the transaction has been open at ``now`` (None: unknown)."""
        return None if self.since is None else max(0.0, now - self.since)

    def describe(self, now: float) -> str:
        """One sentence naming the writer, for logs and errors."""
        who = (f"transactional id {self.transactional_id!r} (role {self.role!r}, run"
               f" {self.run_key!r}" if self.transactional_id is not None
               else "a writer that is not a ledger role (")
        if self.record is not None:
            who += (f", {self.record.state} token {self.record.token} by deployment"
                    f" {self.record.deployment!r}, member {self.record.member!r}")
        who += ")"
        age = self.age(now)
        since = "" if age is None else (
            f", open since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(self.since))}"
            f" ({age:.0f} s)")
        return (f"an open transaction of {who} holds ledger partition {self.topic}"
                f"[{self.partition}] at offset {self.start_offset} (high watermark"
                f" {self.high_watermark}){since}")

    def abort_command(self, bootstrap_servers: str) -> str:
        """The Kafka command (KIP-664) that aborts it, for an operator."""
        return (f"kafka-transactions.sh --bootstrap-server {bootstrap_servers} abort --topic"
                f" {self.topic} --partition {self.partition} --start-offset {self.start_offset}")


def find_open_transaction(admin: Any, make_consumer: Callable[[dict[str, Any]], Any],
                          topic: str, partition: int, prefix: str, *,
                          timeout: float) -> OpenTransaction | None:
    """The transaction holding ``topic[partition]``'s last stable offset below its high
    watermark, or None when none does. ``make_consumer(settings)`` builds a consumer with the
    caller's client settings plus ``settings``. Raises ``KafkaException`` when the broker does
    not answer; a first record that cannot be read only leaves its fields None."""
    import confluent_kafka as ck
    from confluent_kafka.admin import OffsetSpec

    tp = ck.TopicPartition(topic, partition)
    ends = {}
    for isolation in (ck.IsolationLevel.READ_COMMITTED, ck.IsolationLevel.READ_UNCOMMITTED):
        ends[isolation] = int(admin.list_offsets(
            {tp: OffsetSpec.latest()}, isolation_level=isolation, request_timeout=timeout,
        )[tp].result(timeout=timeout + 1).offset)
    stable = ends[ck.IsolationLevel.READ_COMMITTED]
    high = ends[ck.IsolationLevel.READ_UNCOMMITTED]
    if stable < 0 or high < 0 or stable >= high:
        return None
    open_txn = OpenTransaction(topic, partition, stable, high)
    consumer = make_consumer({"group.id": f"neli-ledger-txn-{uuid.uuid4().hex}",
                              "isolation.level": "read_uncommitted",
                              "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([ck.TopicPartition(topic, partition, stable)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = consumer.poll(0.1)
            if message is None or message.error() is not None:
                continue
            if message.offset() < stable:
                continue
            return _named(open_txn, message, prefix)
    finally:
        consumer.close()
    logger.debug("could not read the first record of the open transaction at %s[%d]@%d",
                 topic, partition, stable)
    return open_txn


def _named(open_txn: OpenTransaction, message: Any, prefix: str) -> OpenTransaction:
    from dataclasses import replace

    kind, stamp = message.timestamp()
    since = stamp / 1000 if kind != 0 and stamp > 0 else None
    key = message.key()
    parts = decode_key(key) if key is not None else None
    if parts is None:
        return replace(open_txn, since=since)
    role, run_key = parts
    value = message.value()
    record = (LedgerRecord.decode(value, key=key, offset=message.offset())
              if value is not None else None)
    return replace(open_txn, since=since, role=role, run_key=run_key,
                   transactional_id=prefix + role, record=record)
