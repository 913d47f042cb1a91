"""Read the ledger topic as it is, record by record, for people: the CLI and status pages.

Usage::

    entries = read_history(KafkaLedgerConfig(bootstrap_servers="127.0.0.1:9092",
                                             topic="neli.ledger"), roles=["daily_flights"])
    for entry in entries:
        print(entry.offset, entry.record.state if entry.record else entry.error)

Unlike :class:`~neli_orchestrate.ledger.replay.Replay` (the latest record per run key, what
decisions need) this keeps every committed record still in the topic, malformed ones included
(with the reason they cannot be read). Read-only: no group is joined, nothing is written.

.. note:: The topic is compacted: older states of a run key disappear once Kafka compacts the
   segment they are in, so a history may start at a later state than ``CLAIMED``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from neli_orchestrate.core.confluent import new_admin, new_consumer
from neli_orchestrate.errors import KafkaUnavailableError
from neli_orchestrate.ledger.cache import end_is_known
from neli_orchestrate.ledger.kafka import READER_REQUIRED, KafkaLedgerConfig, ledger_settings
from neli_orchestrate.ledger.record import (
    LedgerRecord,
    MalformedRecordError,
    decode_key,
    parse_record,
    role_key_prefix,
    role_partition,
)

__all__ = ["HistoryEntry", "LedgerHistory", "read_history"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HistoryEntry:
    """One committed message of the ledger topic."""

    partition: int
    offset: int
    #: Broker timestamp of the message, epoch seconds (None if the broker gave none).
    timestamp: float | None
    role: str | None
    run_key: str | None
    #: The record, or None for a tombstone or a message that cannot be read.
    record: LedgerRecord | None
    #: Why the message cannot be read (None if it can, or if it is a tombstone).
    error: str | None = None

    @property
    def tombstone(self) -> bool:
        return self.record is None and self.error is None


@dataclass(frozen=True)
class LedgerHistory:
    """Every committed message of the partitions read, in (partition, offset) order."""

    topic: str
    entries: tuple[HistoryEntry, ...]
    #: High watermark of each partition read.
    end_offsets: dict[int, int]

    def latest(self) -> dict[tuple[str, str], HistoryEntry]:
        """The newest readable entry of every (role, run key) still live (tombstones remove)."""
        result: dict[tuple[str, str], HistoryEntry] = {}
        for entry in self.entries:
            if entry.role is None or entry.run_key is None:
                continue
            if entry.tombstone:
                result.pop((entry.role, entry.run_key), None)
            elif entry.record is not None:
                result[(entry.role, entry.run_key)] = entry
        return result

    def malformed(self) -> list[HistoryEntry]:
        return [entry for entry in self.entries if entry.error is not None]

    def tokens_behind(self) -> dict[str, tuple[int, int]]:
        """Roles whose highest token is not below their partition's end offset.

        Tokens are offsets of the role's partition, so a token at or above the end offset means
        the topic was recreated or rewritten: the next claim's token would go backwards.
        Returns ``{role: (max token, end offset)}``.
        """
        highest: dict[str, tuple[int, int]] = {}
        for entry in self.entries:
            if entry.record is None or entry.role is None:
                continue
            token, partition = highest.get(entry.role, (-1, entry.partition))
            highest[entry.role] = (max(token, entry.record.token), entry.partition)
        return {role: (token, self.end_offsets.get(partition, 0))
                for role, (token, partition) in highest.items()
                if token >= self.end_offsets.get(partition, 0)}


def _kafka() -> Any:
    import confluent_kafka
    import confluent_kafka.admin  # noqa: F401

    return confluent_kafka


def _end_offsets(admin: Any, config: KafkaLedgerConfig, partitions: list[int],
                 deadline: float) -> dict[int, int]:
    """The read_committed end of each partition, offsets only: -1001 (a partition whose leader
    is changing) is asked again until ``deadline``, never read as "empty" (issue 31)."""
    ck = _kafka()
    spec = ck.admin.OffsetSpec.latest()
    ends: dict[int, int] = {}
    while True:
        tps = [ck.TopicPartition(config.topic, p) for p in partitions if p not in ends]
        try:
            futures = admin.list_offsets({tp: spec for tp in tps},
                                         isolation_level=ck.IsolationLevel.READ_COMMITTED,
                                         request_timeout=config.request_timeout)
            answers = {tp.partition: int(f.result(timeout=config.request_timeout * 2).offset)
                       for tp, f in futures.items()}
        except ck.KafkaException as exc:
            raise KafkaUnavailableError(
                f"cannot read the end offsets of ledger topic {config.topic!r}: {exc}"
            ) from exc
        ends.update({p: end for p, end in answers.items() if end_is_known(end)})
        unknown = sorted(p for p, end in answers.items() if not end_is_known(end))
        if not unknown:
            return ends
        if time.monotonic() > deadline:
            raise KafkaUnavailableError(
                f"ledger topic {config.topic!r}: partitions {unknown} answered no end offset"
                f" ({answers[unknown[0]]}: their leader is changing); nothing was read, retry")
        time.sleep(0.1)


def read_history(config: KafkaLedgerConfig, *, roles: Iterable[str] | None = None,
                 timeout: float | None = None) -> LedgerHistory:
    """Read every committed message of the ledger (or of ``roles``' partitions) up to its end.

    Raises :class:`KafkaUnavailableError` naming the topic and the fix when the topic does not
    exist, the cluster cannot be reached, or the read does not finish within ``timeout``
    (default ``config.replay_timeout``).
    """
    ck = _kafka()
    wanted = sorted(set(roles)) if roles is not None else None
    deadline = time.monotonic() + (timeout if timeout is not None else config.replay_timeout)
    admin = new_admin(ledger_settings(config))
    try:
        metadata = admin.list_topics(topic=config.topic, timeout=config.request_timeout)
    except ck.KafkaException as exc:
        raise KafkaUnavailableError(
            f"cannot reach Kafka at {config.bootstrap_servers} to read ledger topic "
            f"{config.topic!r}: {exc}; check the address, listeners and security settings"
        ) from exc
    meta = metadata.topics.get(config.topic)
    if meta is None or meta.error is not None or not meta.partitions:
        why = meta.error.str() if meta is not None and meta.error is not None else "no such topic"
        raise KafkaUnavailableError(
            f"ledger topic {config.topic!r} cannot be read at {config.bootstrap_servers} "
            f"({why}): nothing has run in this namespace yet, or the namespace or "
            f"--ledger-topic is wrong, or the principal lacks DESCRIBE on the topic"
        )
    count = len(meta.partitions)
    if wanted is None:
        partitions = list(range(count))
        prefixes: tuple[bytes, ...] | None = None
    else:
        partitions = sorted({role_partition(role, count) for role in wanted})
        prefixes = tuple(role_key_prefix(role) for role in wanted)

    ends = _end_offsets(admin, config, partitions, deadline)

    entries: list[HistoryEntry] = []
    todo = {p: end for p, end in ends.items() if end > 0}
    if todo:
        consumer = new_consumer(ledger_settings(config, required={
            "group.id": f"neli-ledger-history-{uuid.uuid4().hex}",  # never joins or commits
            **READER_REQUIRED,
        }, call={"auto.offset.reset": "earliest"}))
        try:
            consumer.assign([ck.TopicPartition(config.topic, p, 0) for p in todo])
            while todo:
                if time.monotonic() > deadline:
                    raise KafkaUnavailableError(
                        f"reading ledger topic {config.topic!r} did not finish in time; "
                        f"partitions {sorted(todo)} not read to their end (an open "
                        f"transaction, or a slow cluster: raise --timeout)"
                    )
                for message in consumer.consume(num_messages=1000, timeout=0.2):
                    error = message.error()
                    partition = message.partition()
                    if error is not None:
                        if error.code() == ck.KafkaError._PARTITION_EOF:
                            if message.offset() >= ends.get(partition, 0):
                                todo.pop(partition, None)
                            continue
                        if error.fatal() or not error.retriable():
                            raise KafkaUnavailableError(
                                f"reading ledger topic {config.topic!r}: {error.str()}")
                        continue
                    if message.offset() + 1 >= ends.get(partition, 0):
                        todo.pop(partition, None)
                    key = message.key()
                    if prefixes is not None and (key is None or not key.startswith(prefixes)):
                        continue
                    entries.append(_entry(message, key))
                # the position also passes transaction markers at the end
                for tp in consumer.position([ck.TopicPartition(config.topic, p) for p in todo]):
                    if tp.offset >= ends.get(tp.partition, 0):
                        todo.pop(tp.partition, None)
        finally:
            consumer.close()
    entries.sort(key=lambda e: (e.partition, e.offset))
    return LedgerHistory(topic=config.topic, entries=tuple(entries), end_offsets=ends)


def _entry(message: Any, key: bytes | None) -> HistoryEntry:
    ts_type, ts = message.timestamp()
    timestamp = ts / 1000 if ts_type and ts is not None and ts >= 0 else None
    names = decode_key(key) if key is not None else None
    role, run_key = names if names is not None else (None, None)
    value = message.value()
    common = {"partition": message.partition(), "offset": message.offset(),
              "timestamp": timestamp, "role": role, "run_key": run_key}
    if value is None:
        if names is None:
            return HistoryEntry(**common, record=None, error=f"tombstone with key {key!r}")
        return HistoryEntry(**common, record=None)
    try:
        record = parse_record(value, key=key)
    except MalformedRecordError as exc:
        return HistoryEntry(**common, record=None, error=str(exc))
    return HistoryEntry(**common, record=record)
