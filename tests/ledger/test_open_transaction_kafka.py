"""A producer left mid-transaction on the ledger (issue 31, KIP-664), on a real broker: the
replay it holds back names it, and ``neli-orchestrate doctor`` reports it once it hangs."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from neli_orchestrate.errors import KafkaUnavailableError
from neli_orchestrate.ledger.kafka import KafkaLedger, KafkaLedgerConfig
from neli_orchestrate.ledger.record import LedgerRecord, RunState
from tests.cli.cli_helpers import cli, new_namespace

pytestmark = pytest.mark.kafka


@pytest.fixture
def namespace() -> str:
    return new_namespace()


@pytest.fixture
def mid_transaction(kafka_broker: str, namespace: str) -> Iterator[tuple[Any, LedgerRecord]]:
    """A writer of role ``daily`` that wrote a claim in a transaction and never ended it (its
    transaction timeout, 60 s, is longer than the ledger's 10 s)."""
    ledger = KafkaLedger(KafkaLedgerConfig(bootstrap_servers=kafka_broker,
                                           topic=f"{namespace}.ledger",
                                           transactional_id_prefix=f"{namespace}.ledger:"))
    writer = ledger.begin("hourly")            # creates the topic; one committed record
    token = writer.replay().next_token
    writer.write(LedgerRecord("hourly", "h1", RunState.COMPLETED, token, "eu-west-1", "m0", 1,
                              time.time()))
    writer.close()
    ledger.close()
    producer = Producer({"bootstrap.servers": kafka_broker,
                         "transactional.id": f"{namespace}.ledger:daily",
                         "transaction.timeout.ms": 60000,
                         "logger": logging.getLogger("test.librdkafka")})
    producer.init_transactions(30)
    producer.begin_transaction()
    record = LedgerRecord("daily", "2013-01-01", RunState.CLAIMED, token + 1, "us-east-1",
                          "host-7_123", 1, time.time(), handoff_deadline=time.time() + 300)
    producer.produce(f"{namespace}.ledger", key=record.key, value=record.encode(), partition=0)
    assert producer.flush(30) == 0
    yield producer, record
    producer.abort_transaction(30)


def test_a_replay_held_back_by_an_open_transaction_names_its_writer(
    kafka_broker: str, namespace: str, mid_transaction: tuple[Any, LedgerRecord],
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = KafkaLedger(KafkaLedgerConfig(bootstrap_servers=kafka_broker,
                                           topic=f"{namespace}.ledger",
                                           transactional_id_prefix=f"{namespace}.ledger:",
                                           replay_timeout=4.0, replay_cache=False))
    try:
        with caplog.at_level(logging.WARNING, logger="neli_orchestrate.ledger.kafka"), \
                pytest.raises(KafkaUnavailableError) as caught:
            ledger.replay("hourly")            # another role of the same partition
    finally:
        ledger.close()
    message = str(caught.value)
    for named in (f"transactional id '{namespace}.ledger:daily'", "run '2013-01-01'",
                  "deployment 'us-east-1'", "member 'host-7_123'", "open since"):
        assert named in message, message
    # It said so while waiting, not only at the end.
    assert "replay of role 'hourly' waits: an open transaction of transactional id" in caplog.text


def test_doctor_reports_a_ledger_transaction_open_past_the_transaction_timeout(
    kafka_broker: str, namespace: str, mid_transaction: tuple[Any, LedgerRecord],
) -> None:
    producer, record = mid_transaction

    def transaction_findings() -> tuple[int, list[dict[str, str]]]:
        out = cli("doctor", "-b", kafka_broker, "-n", namespace, "--json")
        return out.code, [f for f in out.json()["findings"] if f["check"] == "transactions"]

    code, young = transaction_findings()
    if time.time() - record.at < 10:          # younger than the ledger's transaction timeout
        assert [f["level"] for f in young] == ["ok", "ok"], young
        assert "a claim in progress" in young[0]["message"]
    deadline = time.monotonic() + 60
    while time.time() - record.at <= 10.5:      # until it is older than the timeout
        assert time.monotonic() < deadline
        time.sleep(0.5)
    code, old = transaction_findings()
    assert code == 1, old
    (hanging,) = [f for f in old if f["level"] == "error"]
    assert "hanging transaction" in hanging["message"]
    assert f"transactional id '{namespace}.ledger:daily'" in hanging["message"]
    assert re.search(rf"kafka-transactions.sh --bootstrap-server {re.escape(kafka_broker)} abort"
                     rf" --topic {re.escape(namespace)}\.ledger --partition 0 --start-offset \d+",
                     hanging["fix"]), hanging["fix"]
    # Ended: nothing to report.
    producer.abort_transaction(30)
    producer.begin_transaction()                # the fixture's abort needs one open
    code, after = transaction_findings()
    assert [f["level"] for f in after] == ["ok"] and "no ledger transaction" in after[0]["message"]
