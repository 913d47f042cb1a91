"""KafkaLedger against a real broker: compaction, read_committed replay, fencing, tokens, expiry."""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import ConfigResource, OffsetSpec, ResourceType

from neli_orchestrate.decision import Claimant, DecisionPolicy, Outcome, claim_record, decide
from neli_orchestrate.errors import (
    FencedError,
    KafkaUnavailableError,
    TopicMismatchError,
)
from neli_orchestrate.ledger.kafka import KafkaLedger
from neli_orchestrate.ledger.record import LedgerRecord, RunState, encode_key, role_partition
from neli_orchestrate.ledger.store import expire
from tests.ledger.ledger_helpers import open_ledger

pytestmark = pytest.mark.kafka

POLICY = DecisionPolicy(handoff_timeout=60.0)
US = Claimant("us-east-1", "us-member")
EU = Claimant("eu-west-1", "eu-member")


def claim(ledger: KafkaLedger, role: str, run_key: str, me: Claimant) -> LedgerRecord:
    """What a new leader does: fence, replay, decide, write the claim."""
    writer = ledger.begin(role)
    try:
        replay = writer.replay()
        now = time.time()
        decision = decide(replay.latest(run_key), me, now=now, policy=POLICY)
        assert decision.claims, decision
        record = claim_record(decision, replay, run_key=run_key, me=me, now=now, policy=POLICY)
        writer.write(record)
        return record
    finally:
        writer.close()


def high_watermark(admin, topic: str, partition: int) -> int:  # type: ignore[no-untyped-def]
    tp = TopicPartition(topic, partition)
    futures = admin.list_offsets(
        {tp: OffsetSpec.latest()}, isolation_level=IsolationLevel.READ_UNCOMMITTED
    )
    return int(futures[tp].result(timeout=10).offset)


def test_the_ledger_topic_is_created_compacted(
    kafka_broker: str, kafka_admin, ledgers: list[KafkaLedger], topic: str  # type: ignore[no-untyped-def]
) -> None:
    ledger = open_ledger(ledgers, kafka_broker, topic, partitions=3)
    assert ledger.replay("daily_flights").records == {}
    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = kafka_admin.describe_configs([resource])[resource].result(timeout=10)
    assert configs["cleanup.policy"].value == "compact"
    assert configs["segment.ms"].value == "3600000"  # compaction reaches recent records
    metadata = kafka_admin.list_topics(topic=topic, timeout=10)
    assert len(metadata.topics[topic].partitions) == 3
    assert ledger.partition_for("daily_flights") == role_partition("daily_flights", 3)


def test_an_existing_topic_with_another_partition_count_is_refused(
    kafka_broker: str, new_topic, ledgers: list[KafkaLedger]  # type: ignore[no-untyped-def]
) -> None:
    existing = new_topic(partitions=2, config={"cleanup.policy": "compact"})
    ledger = open_ledger(ledgers, kafka_broker, existing, partitions=1)
    with pytest.raises(TopicMismatchError, match="2 partitions"):
        ledger.replay("daily_flights")


def test_a_topic_another_deployment_just_created_has_its_count_read_back_not_assumed(
    kafka_broker: str, new_topic, ledgers: list[KafkaLedger],  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The metadata lags a topic created a moment ago: the create then finds it existing.

    The ledger must read the count back, not assume its own (a Kafka 4.4 CI run met this).
    """
    existing = new_topic(partitions=2, config={"cleanup.policy": "compact"})
    ledger = open_ledger(ledgers, kafka_broker, existing, partitions=1)
    real = ledger._topic_partitions
    reads: list[int | None] = []

    def lagging(admin):  # type: ignore[no-untyped-def]
        reads.append(None if not reads else real(admin))  # the first read misses the topic
        return reads[-1]

    monkeypatch.setattr(ledger, "_topic_partitions", lagging)
    with pytest.raises(TopicMismatchError, match="2 partitions"):
        ledger.replay("daily_flights")
    assert reads[0] is None and reads[-1] == 2, reads


def test_an_existing_topic_that_deletes_by_retention_is_refused(
    kafka_broker: str, new_topic, ledgers: list[KafkaLedger]  # type: ignore[no-untyped-def]
) -> None:
    existing = new_topic(partitions=1, config={"cleanup.policy": "delete"})
    ledger = open_ledger(ledgers, kafka_broker, existing)
    with pytest.raises(TopicMismatchError, match="cleanup.policy=delete"):
        ledger.begin("daily_flights")


def test_a_missing_topic_without_permission_to_create_is_a_clear_error(
    kafka_broker: str, ledgers: list[KafkaLedger], topic: str
) -> None:
    ledger = open_ledger(ledgers, kafka_broker, topic, create_topic=False)
    with pytest.raises(TopicMismatchError, match="does not exist"):
        ledger.replay("daily_flights")


def test_replay_reaches_the_high_watermark_and_keeps_the_latest_record_per_run_key(
    kafka_broker: str, kafka_admin, ledgers: list[KafkaLedger], topic: str  # type: ignore[no-untyped-def]
) -> None:
    writer_side = open_ledger(ledgers, kafka_broker, topic)
    writer = writer_side.begin("daily_flights")
    other = writer_side.begin("billing")  # shares the partition: its records are skipped
    expected: dict[str, RunState] = {}
    for day in range(1, 6):
        run_key = f"2013-01-0{day}"
        record = claim_record(
            decide(None, US, now=time.time(), policy=POLICY), writer.replay(),
            run_key=run_key, me=US, now=time.time(), policy=POLICY,
        )
        writer.write(record)
        other.write(
            LedgerRecord("billing", run_key, RunState.COMPLETED, 0, "eu-west-1", "m", 1, 1.0)
        )
        running = record.advance(RunState.RUNNING, at=time.time())
        writer.write(running)
        if day % 2:
            writer.write(running.advance(RunState.COMPLETED, at=time.time()))
            expected[run_key] = RunState.COMPLETED
        else:
            expected[run_key] = RunState.RUNNING
    writer.close()
    other.close()

    reader = open_ledger(ledgers, kafka_broker, topic)  # another process, cold
    replay = reader.replay("daily_flights")
    assert {k: r.state for k, r in replay.records.items()} == expected
    assert replay.end_offset == high_watermark(kafka_admin, topic, 0)
    assert not replay.fenced


def test_a_second_begin_fences_the_first_writer(
    kafka_broker: str, ledgers: list[KafkaLedger], topic: str
) -> None:
    us = open_ledger(ledgers, kafka_broker, topic)
    eu = open_ledger(ledgers, kafka_broker, topic)
    old_leader = us.begin("daily_flights")
    claimed = claim_record(
        decide(None, US, now=time.time(), policy=POLICY), old_leader.replay(),
        run_key="2013-01-05", me=US, now=time.time(), policy=POLICY,
    )
    old_leader.write(claimed)

    new_leader = eu.begin("daily_flights")  # init_transactions(): the broker fences us
    running = claimed.advance(RunState.RUNNING, at=time.time())
    with pytest.raises(FencedError) as fenced:
        old_leader.write(running)
    assert fenced.value.role == "daily_flights"
    assert fenced.value.token == claimed.token
    with pytest.raises(FencedError):  # dead for good: only a new begin() writes again
        old_leader.write(running)

    replay = new_leader.replay()
    assert replay.latest("2013-01-05") == claimed  # the zombie's RUNNING never landed
    new_leader.write(
        LedgerRecord("daily_flights", "2013-01-06", RunState.COMPLETED, replay.next_token,
                     "eu-west-1", "eu-member", 1, time.time())
    )
    new_leader.close()
    old_leader.close()


def test_tokens_strictly_increase_across_leaders(
    kafka_broker: str, ledgers: list[KafkaLedger], topic: str
) -> None:
    tokens = []
    for leader in range(4):
        ledger = open_ledger(ledgers, kafka_broker, topic)
        me = US if leader % 2 else EU
        tokens.append(claim(ledger, "daily_flights", f"2013-01-0{leader + 1}", me).token)
        # Another role on the same partition writes in between.
        claim(ledger, "billing", f"2013-01-0{leader + 1}", me)
        # And a leader whose claim was superseded: take over the run key once more.
    ledger = open_ledger(ledgers, kafka_broker, topic)
    writer = ledger.begin("daily_flights")
    replay = writer.replay()
    latest = replay.latest("2013-01-01")
    assert latest is not None and latest.state is RunState.CLAIMED
    takeover = decide(latest, US, now=latest.at + 61, policy=POLICY)
    assert takeover.outcome is Outcome.TAKE_OVER
    record = claim_record(takeover, replay, run_key="2013-01-01", me=US, now=latest.at + 61,
                          policy=POLICY)
    writer.write(record)
    writer.close()
    tokens.append(record.token)
    assert tokens == sorted(set(tokens)), tokens
    assert record.token > latest.token


def test_aborted_records_are_invisible_and_open_ones_block_replay_until_they_end(
    kafka_broker: str, ledgers: list[KafkaLedger], topic: str
) -> None:
    ledger = open_ledger(ledgers, kafka_broker, topic, replay_timeout=1.5)
    ledger.replay("daily_flights")  # creates the topic
    completed = LedgerRecord("daily_flights", "2013-01-05", RunState.COMPLETED, 0, "us-east-1",
                             "m", 1, time.time())
    # An aborted transaction never counts.
    producer = Producer({"bootstrap.servers": kafka_broker, "transactional.id": f"x-{topic}"})
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.produce(topic, key=completed.key, value=completed.encode(), partition=0)
    producer.flush(10)
    producer.abort_transaction(10)
    assert ledger.replay("daily_flights").latest("2013-01-05") is None

    # An open transaction of another role on the partition holds the last stable offset:
    # replay must not decide on a prefix, so it waits and then says why.
    producer.begin_transaction()
    producer.produce(topic, key=completed.key, value=completed.encode(), partition=0)
    producer.flush(10)
    with pytest.raises(KafkaUnavailableError, match="open transaction"):
        ledger.replay("daily_flights")
    producer.abort_transaction(10)
    replay = ledger.replay("daily_flights")
    assert replay.latest("2013-01-05") is None
    assert replay.ignored == 0


def test_a_writer_that_died_mid_transaction_is_aborted_by_the_next_leader(
    kafka_broker: str, ledgers: list[KafkaLedger], topic: str
) -> None:
    # The dead writer's own transaction timeout (60 s) is far beyond the replay timeout, so
    # the replay below can only succeed if begin() aborted that transaction.
    ledger = open_ledger(ledgers, kafka_broker, topic, replay_timeout=20.0)
    ledger.replay("daily_flights")
    config = ledger.config
    dead = Producer({
        "bootstrap.servers": kafka_broker,
        "transactional.id": config.transactional_id("daily_flights"),
        "transaction.timeout.ms": 60000,
    })
    dead.init_transactions(10)
    dead.begin_transaction()
    zombie = LedgerRecord("daily_flights", "2013-01-05", RunState.COMPLETED, 0, "us-east-1",
                          "zombie", 1, time.time())
    dead.produce(config.topic, key=zombie.key, value=zombie.encode(), partition=0)
    dead.flush(10)  # ...and the process dies before commit_transaction()

    writer = ledger.begin("daily_flights")  # aborts the dead writer's transaction
    replay = writer.replay()
    assert replay.latest("2013-01-05") is None
    with pytest.raises(KafkaException) as fenced:  # had it lived on, it could not commit
        dead.commit_transaction(10)
    assert fenced.value.args[0].code() == KafkaError._FENCED
    writer.close()


def test_expiry_tombstones_only_finished_run_keys_older_than_retention(
    kafka_broker: str, ledgers: list[KafkaLedger], topic: str
) -> None:
    ledger = open_ledger(ledgers, kafka_broker, topic)
    writer = ledger.begin("daily_flights")
    now = time.time()
    rows = [
        ("old-done", RunState.COMPLETED, now - 1000),
        ("old-failed", RunState.FAILED, now - 1000),
        ("old-running", RunState.RUNNING, now - 1000),
        ("new-done", RunState.COMPLETED, now),
    ]
    for run_key, state, at in rows:
        token = writer.replay().next_token
        writer.write(LedgerRecord("daily_flights", run_key, state, token, "us-east-1", "m", 1, at))
    assert sorted(expire(writer, older_than=now - 500)) == ["old-done", "old-failed"]
    assert sorted(writer.replay().records) == ["new-done", "old-running"]
    writer.close()

    consumer = Consumer({
        "bootstrap.servers": kafka_broker, "group.id": f"check-{topic}",
        "isolation.level": "read_committed", "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
    })
    consumer.assign([TopicPartition(topic, 0, 0)])
    tombstones = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        if message.error():
            break  # end of partition
        if message.value() is None:
            tombstones.append(message.key())
    consumer.close()
    assert sorted(tombstones) == sorted(
        [encode_key("daily_flights", "old-done"), encode_key("daily_flights", "old-failed")]
    )


def test_a_malformed_record_in_the_topic_is_ignored_not_fatal(
    kafka_broker: str, ledgers: list[KafkaLedger], topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = open_ledger(ledgers, kafka_broker, topic)
    claim(ledger, "daily_flights", "2013-01-05", US)
    producer = Producer({"bootstrap.servers": kafka_broker})
    producer.produce(topic, key=encode_key("daily_flights", "2013-01-06"), value=b'{"v": 7}',
                     partition=0)
    producer.produce(topic, key=encode_key("daily_flights", "2013-01-07"), value=b"\x00garbage",
                     partition=0)
    producer.flush(10)
    with caplog.at_level(logging.WARNING, logger="neli_orchestrate.ledger"):
        replay = ledger.replay("daily_flights")
    assert sorted(replay.records) == ["2013-01-05"]
    assert replay.ignored == 2
    assert sorted(replay.unreadable) == ["2013-01-06", "2013-01-07"]
    assert "unknown schema version" in caplog.text
