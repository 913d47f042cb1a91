"""The broker the whole suite stands on is a real Kafka: topics, groups, transactions."""

from __future__ import annotations

import time
import uuid
import warnings

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

pytestmark = pytest.mark.kafka


def _wait(predicate, timeout: float, what: str, poll=None) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if poll:
            poll()
        if predicate():
            return
        if not poll:
            time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_topic_create_produce_consume_round_trip(kafka_broker: str, new_topic) -> None:
    topic = new_topic(partitions=3)
    producer = Producer({"bootstrap.servers": kafka_broker})
    sent = {f"k{i}".encode(): f"v{i}".encode() for i in range(30)}
    for k, v in sent.items():
        producer.produce(topic, v, key=k)
    assert producer.flush(15) == 0
    consumer = Consumer({"bootstrap.servers": kafka_broker, "group.id": f"g-{uuid.uuid4()}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: dict[bytes, bytes] = {}
    try:
        deadline = time.monotonic() + 30
        while len(got) < len(sent) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got[msg.key()] = msg.value()
    finally:
        consumer.close()
    assert got == sent


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_two_consumer_group_rebalance_assigns_both(kafka_broker: str, new_topic,
                                                   protocol: str) -> None:
    topic = new_topic(partitions=2)
    group = f"g-{uuid.uuid4()}"
    assigned: dict[str, set[int]] = {"a": set(), "b": set()}
    callbacks: dict[str, int] = {"a": 0, "b": 0}

    def make(name: str) -> Consumer:
        conf = {"bootstrap.servers": kafka_broker, "group.id": group,
                "group.protocol": protocol, "auto.offset.reset": "earliest"}
        if protocol == "classic":
            conf.update({"partition.assignment.strategy": "cooperative-sticky",
                         "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
        c = Consumer(conf)

        def on_assign(consumer, partitions):  # type: ignore[no-untyped-def]
            callbacks[name] += 1
            assigned[name].update(p.partition for p in partitions)

        def on_revoke(consumer, partitions):  # type: ignore[no-untyped-def]
            assigned[name].difference_update(p.partition for p in partitions)

        c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
        return c

    a = make("a")
    try:
        _wait(lambda: assigned["a"] == {0, 1}, 30, "a to own both partitions",
              poll=lambda: a.poll(0.1))
        b = make("b")
        try:
            def both() -> None:
                a.poll(0.05)
                b.poll(0.05)

            _wait(lambda: len(assigned["a"]) == 1 and len(assigned["b"]) == 1, 60,
                  "the two consumers to share the partitions", poll=both)
            shared = assigned["a"] | assigned["b"]
        finally:
            b.close()
    finally:
        a.close()
    assert callbacks["a"] >= 1 and callbacks["b"] >= 1
    assert shared == {0, 1}


def test_second_init_transactions_fences_first_producer(kafka_broker: str, new_topic) -> None:
    topic = new_topic()
    txn_id = f"txn-{uuid.uuid4()}"
    conf = {"bootstrap.servers": kafka_broker, "transactional.id": txn_id}
    first = Producer(conf)
    second = Producer(conf)
    try:
        first.init_transactions(30)
        first.begin_transaction()
        first.produce(topic, b"from-first")
        first.commit_transaction(30)

        second.init_transactions(30)  # bumps the epoch: the broker now fences `first`

        with pytest.raises(KafkaException) as info:
            first.begin_transaction()
            first.produce(topic, b"zombie")
            first.commit_transaction(30)
        error = info.value.args[0]
        assert error.code() == KafkaError._FENCED, error
        assert error.fatal()

        second.begin_transaction()
        second.produce(topic, b"from-second")
        second.commit_transaction(30)
    finally:
        # The zombie's message stays queued: drop it and close both now, not at interpreter
        # exit after the broker stopped (librdkafka would print to stderr then).
        first.purge()
        with warnings.catch_warnings():
            # closing aborts the open transaction, which a fenced producer cannot do
            warnings.simplefilter("ignore", RuntimeWarning)
            first.close()
        second.close()

    seen: list[bytes] = []
    consumer = Consumer({"bootstrap.servers": kafka_broker, "group.id": f"g-{uuid.uuid4()}",
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    consumer.subscribe([topic])
    try:
        _wait(lambda: len(seen) >= 2, 30, "both committed records",
              poll=lambda: (m := consumer.poll(0.2)) is not None and m.error() is None
              and seen.append(m.value()))
    finally:
        consumer.close()
    assert seen == [b"from-first", b"from-second"]


def test_local_kafka_start_failure_is_an_error_not_a_hang(tmp_path) -> None:
    """A port already in use (fixed port) must raise quickly with the broker's log tail."""
    import socket

    from neli_orchestrate.testing import LocalKafka
    from neli_orchestrate.testing.local_kafka import LocalKafkaError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        kafka = LocalKafka(workdir=tmp_path / "k", port=port)
        t0 = time.monotonic()
        with pytest.raises(LocalKafkaError) as info:
            kafka.start(timeout=60)
        kafka.stop()
    assert time.monotonic() - t0 < 60
    assert "Address already in use" in str(info.value) or "exited" in str(info.value)
    assert kafka.process is None
