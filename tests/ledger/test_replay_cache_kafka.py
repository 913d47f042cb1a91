"""The replay cache against a real broker: tails, recreated topics, compacted tombstones."""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from neli_orchestrate.errors import UnreadableRecordError
from neli_orchestrate.ledger import kafka as ledger_kafka
from neli_orchestrate.ledger.cache import Judgement, Verdict
from neli_orchestrate.ledger.kafka import KafkaLedger
from neli_orchestrate.ledger.record import LedgerError, LedgerRecord, RunState, encode_key
from tests.ledger.ledger_helpers import open_ledger as shared_open_ledger

pytestmark = pytest.mark.kafka

ROLE = "daily_flights"
OTHER = "billing_export"


def open_ledger(ledgers: list[KafkaLedger], bootstrap: str, topic: str,
                **kwargs: Any) -> KafkaLedger:
    return shared_open_ledger(ledgers, bootstrap, topic, **{"replay_timeout": 20.0, **kwargs})


def write(ledger: KafkaLedger, role: str, run_key: str, state: RunState) -> LedgerRecord:
    """Fence, replay, write one record under the next token (what a leader does)."""
    writer = ledger.begin(role)
    try:
        token = writer.replay().next_token
        deadline = time.time() + 300 if state is RunState.CLAIMED else None
        record = LedgerRecord(role, run_key, state, token, "us-east-1", "m", 1, time.time(),
                              handoff_deadline=deadline)
        writer.write(record)
        return record
    finally:
        writer.close()


@pytest.fixture
def fold_starts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The offset every fold of a partition started at."""
    starts: list[int] = []
    original = KafkaLedger._fold

    def spy(self: KafkaLedger, builder: Any, role: str, tp: Any, start: int, high: int,
            deadline: float) -> int:
        starts.append(start)
        return original(self, builder, role, tp, start, high, deadline)

    monkeypatch.setattr(KafkaLedger, "_fold", spy)
    return starts


def test_a_new_process_continues_from_the_host_checkpoint_and_reads_only_the_tail(
    kafka_broker: str, ledgers: list[KafkaLedger], topic: str, tmp_path: Path,
    fold_starts: list[int],
) -> None:
    first = open_ledger(ledgers, kafka_broker, topic, replay_cache_dir=str(tmp_path))
    for day in ("01", "02", "03"):
        write(first, ROLE, f"2013-01-{day}", RunState.COMPLETED)
        write(first, OTHER, f"2013-01-{day}", RunState.COMPLETED)
    checkpoint_end = first.replay(ROLE).end_offset
    write(first, OTHER, "2013-01-04", RunState.COMPLETED)
    write(first, ROLE, "2013-01-04", RunState.CLAIMED)
    write(first, ROLE, "2013-01-01", RunState.COMPLETED)          # a newer record of a cached key
    # An unreadable newest record after the checkpoint still stops the decision.
    producer = Producer({"bootstrap.servers": kafka_broker})
    producer.produce(topic, key=encode_key(ROLE, "2013-01-02"), value=b'{"v": 7}', partition=0)
    producer.flush(10)

    fold_starts.clear()
    second = open_ledger(ledgers, kafka_broker, topic, replay_cache_dir=str(tmp_path))
    cached = second.replay(ROLE)
    assert fold_starts and fold_starts[0] >= checkpoint_end > 0
    uncached = open_ledger(ledgers, kafka_broker, topic, replay_cache=False).replay(ROLE)
    assert fold_starts[-1] == 0
    assert dict(cached.records) == dict(uncached.records)
    assert (cached.end_offset, cached.max_token, cached.unreadable) == (
        uncached.end_offset, uncached.max_token, uncached.unreadable)
    with pytest.raises(UnreadableRecordError):
        cached.latest("2013-01-02")
    assert cached.latest("2013-01-04").state is RunState.CLAIMED  # type: ignore[union-attr]
    # A third process reads nothing new: the checkpoint is the end.
    fold_starts.clear()
    third = open_ledger(ledgers, kafka_broker, topic, replay_cache_dir=str(tmp_path))
    again = third.replay(ROLE)
    assert fold_starts == [] and again == cached
    with pytest.raises(UnreadableRecordError):
        again.latest("2013-01-02")


def test_a_recreated_ledger_topic_is_detected_and_old_tokens_are_not_reissued(
    kafka_broker: str, kafka_admin: Any, ledgers: list[KafkaLedger], topic: str,
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    before = open_ledger(ledgers, kafka_broker, topic, replay_cache_dir=str(tmp_path))
    for day in ("01", "02", "03", "04"):
        issued = write(before, ROLE, f"2013-01-{day}", RunState.COMPLETED)
    before.close()
    kafka_admin.delete_topics([topic], operation_timeout=15)[topic].result(timeout=30)
    deadline = time.monotonic() + 30
    while topic in kafka_admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, "the deleted topic never went away"
        time.sleep(0.1)

    after = open_ledger(ledgers, kafka_broker, topic, replay_cache_dir=str(tmp_path))
    writer = None
    deadline = time.monotonic() + 30
    while writer is None:   # the recreated topic's partition needs a leader first
        try:
            writer = after.begin(ROLE)
        except Exception:  # noqa: BLE001
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    try:
        with caplog.at_level(logging.WARNING, logger="neli_orchestrate.ledger.kafka"):
            replay = writer.replay()
        assert "recreated" in caplog.text
        assert dict(replay.records) == {}           # nothing of the old topic is believed
        assert replay.end_offset <= issued.token
        with pytest.raises(LedgerError, match="backwards"):
            _ = replay.next_token
    finally:
        writer.close()
    # Without the host's memory of the old topic, the same replay would issue an old token.
    blind = open_ledger(ledgers, kafka_broker, topic, replay_cache=False)
    blind_writer = blind.begin(ROLE)
    try:
        assert blind_writer.replay().next_token <= issued.token
    finally:
        blind_writer.close()


def keys_in_log(bootstrap: str, topic: str) -> list[bytes | None]:
    """Every key still in partition 0 (records and tombstones), read_uncommitted."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{uuid.uuid4().hex}",
                         "enable.partition.eof": True, "auto.offset.reset": "earliest",
                         "isolation.level": "read_uncommitted"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    keys: list[bytes | None] = []
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF:
                    return keys
                continue
            keys.append(message.key())
        raise AssertionError("never reached the end of the partition")
    finally:
        consumer.close()


def test_a_tombstone_removed_by_compaction_after_the_checkpoint_is_not_missed(
    kafka_broker: str, new_topic: Any, ledgers: list[KafkaLedger], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = new_topic(1, {"cleanup.policy": "compact", "segment.ms": "100",
                          "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "1000",
                          "min.compaction.lag.ms": "0"})
    gone = encode_key(ROLE, "2013-01-01")
    ledger = open_ledger(ledgers, kafka_broker, topic, replay_cache_dir=str(tmp_path / "a"),
                         create_topic=False)
    write(ledger, ROLE, "2013-01-01", RunState.COMPLETED)
    write(ledger, ROLE, "2013-01-02", RunState.COMPLETED)
    assert sorted(ledger.replay(ROLE).records) == ["2013-01-01", "2013-01-02"]  # checkpoint
    # The same checkpoint, for the deliberately broken variant below. Its replay consumer
    # does not stay assigned (keep_clients=False): one that did would fetch the tombstone as
    # soon as it is written, before compaction could remove it.
    stale = open_ledger(ledgers, kafka_broker, topic, replay_cache_dir=str(tmp_path / "b"),
                        create_topic=False, keep_clients=False)
    assert sorted(stale.replay(ROLE).records) == ["2013-01-01", "2013-01-02"]

    writer = ledger.begin(ROLE)
    writer.tombstone(["2013-01-01"])        # expiry: the run key may run again
    writer.close()
    # Other roles keep writing; segments roll and the cleaner removes the record, then the
    # tombstone (delete.retention.ms 1 s).
    filler = Producer({"bootstrap.servers": kafka_broker, "linger.ms": 0})
    deadline = time.monotonic() + 120
    while gone in keys_in_log(kafka_broker, topic):
        assert time.monotonic() < deadline, "compaction never removed the tombstone"
        for i in range(20):
            filler.produce(topic, key=encode_key(OTHER, f"k{i}"), value=None, partition=0)
            filler.flush(10)
            time.sleep(0.05)

    # The checkpoint predates the tombstone by more than half of delete.retention.ms: refused.
    replay = ledger.replay(ROLE)
    assert sorted(replay.records) == ["2013-01-02"]
    # Broken on purpose: trusting the same checkpoint misses the tombstone it can no longer see.
    monkeypatch.setattr(ledger_kafka, "judge",
                        lambda checkpoint, **facts: Judgement(Verdict.CONTINUE))
    assert sorted(stale.replay(ROLE).records) == ["2013-01-01", "2013-01-02"]


def test_a_replay_that_reassigns_the_kept_consumer_reads_its_own_role_whole(
    kafka_broker: str, ledgers: list[KafkaLedger], topic: str,
) -> None:
    """Two roles share the ledger's one partition and the process's replay consumer. After a
    replay of one role leaves the consumer kept at the partition's end, the other role's
    first replay assigns it at offset 0: until librdkafka has started that fetch, the
    consumer's position still says the old end, which is this replay's end too. A fold that
    believed it read nothing and decided RUN on a completed run key (a duplicate run, seen in
    the three-deployment test). Every round must see every record of the role."""
    ledger = open_ledger(ledgers, kafka_broker, topic)
    for day in range(1, 7):
        write(ledger, ROLE, f"2013-01-{day:02d}", RunState.COMPLETED)
    for round_ in range(20):
        other = f"{OTHER}-{round_}"
        write(ledger, other, "2013-01-01", RunState.COMPLETED)
        assert ledger.replay(other).latest("2013-01-01") is not None
        # The role's checkpoint (in memory) is older than the kept position: reassigned.
        ledger._cache.forget(ledger._cluster_id, topic, ROLE)  # type: ignore[union-attr]
        replay = ledger.replay(ROLE)
        missing = [day for day in range(1, 7) if replay.latest(f"2013-01-{day:02d}") is None]
        assert missing == [], f"round {round_}: the replay missed days {missing}"
