"""Unreadable records stop the decision, against the real broker.

A record this library cannot read is produced into the ledger topic above a readable one. No
deployment may decide from the older record: reserve, claim and status raise an error that
names the record's offset and the fix, and nothing is written.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
from confluent_kafka import Producer

from neli_orchestrate import NeliConfig, Outcome, Singleton, SingletonConfig
from neli_orchestrate.errors import UnreadableRecordError
from neli_orchestrate.ledger.record import RunState, encode_key, role_partition
from neli_orchestrate.ledger.replay import Replay

pytestmark = pytest.mark.kafka

ROLE = "daily_flights"


def deployment(bootstrap: str, ns: str, name: str, **kwargs: object) -> Singleton:
    neli = NeliConfig(bootstrap_servers=bootstrap, profile="fast", session_timeout=6.0,
                      heartbeat_timeout=2.0)
    return Singleton(SingletonConfig(neli=neli, namespace=ns, deployment=name,
                                     handoff_timeout=30.0, acquire_timeout=60.0),
                     **kwargs)  # type: ignore[arg-type]


def produce(bootstrap: str, topic: str, run_key: str, value: bytes) -> int:
    """Write one raw message into the role's ledger partition; return its offset."""
    offsets: list[int] = []
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, key=encode_key(ROLE, run_key), value=value,
                     partition=role_partition(ROLE, 1),
                     on_delivery=lambda err, msg: offsets.append(msg.offset()))
    assert producer.flush(30) == 0
    return offsets[0]


def idle(singleton: Singleton) -> None:
    deadline = time.monotonic() + 30
    while singleton.role_members(ROLE):
        assert time.monotonic() < deadline, "the role's group never emptied"
        time.sleep(0.1)


@pytest.fixture
def ns() -> str:
    return f"unr{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize(("value", "why"), [
    (json.dumps({"v": 2, "state": "COMPLETED"}).encode(), "unknown schema version"),
    (b"\x00\x01 not json", "not"),
])
def test_an_unreadable_newest_record_stops_reserve_claim_and_status(
        kafka_broker: str, ns: str, value: bytes, why: str) -> None:
    east = deployment(kafka_broker, ns, "us-east-1")
    # west's clock is far ahead: east's CLAIMED looks abandoned, so deciding from it would
    # take the run over (and run a run that the unreadable record may say is COMPLETED)
    west = deployment(kafka_broker, ns, "eu-west-1", wall_clock=lambda: time.time() + 3600)
    try:
        claimed = east.reserve(ROLE, "2013-01-05")
        assert claimed.should_run
        offset = produce(kafka_broker, f"{ns}.ledger", "2013-01-05", value)
        idle(east)

        for attempt in (lambda: west.reserve(ROLE, "2013-01-05"),
                        lambda: west.status(ROLE, "2013-01-05"),
                        lambda: west.claim(ROLE, "2013-01-05").__enter__()):
            with pytest.raises(UnreadableRecordError, match=f"at offset {offset} .*{why}.*Fix:"
                               ) as info:
                attempt()
            assert (info.value.role, info.value.run_key, info.value.offset) == (
                ROLE, "2013-01-05", offset)
        # nothing was decided or written: the unreadable record is still the newest
        replay = west.ledger.replay(ROLE)
        assert replay.end_offset == offset + 1
        assert replay.records["2013-01-05"].state is RunState.CLAIMED
        # other run keys of the role are unaffected
        assert west.reserve(ROLE, "2013-01-06").should_run
    finally:
        east.close()
        west.close()


def test_a_record_whose_token_is_above_its_offset_stops_the_decision(
        kafka_broker: str, ns: str) -> None:
    east = deployment(kafka_broker, ns, "us-east-1")
    try:
        with east.claim(ROLE, "2013-01-05") as run:
            assert run.should_run
        done = east.status(ROLE, "2013-01-05")
        assert done is not None and done.state is RunState.COMPLETED
        copied = json.loads(done.encode())
        copied["token"] = 10**9  # copied in from another ledger
        offset = produce(kafka_broker, f"{ns}.ledger", "2013-01-05", json.dumps(copied).encode())
        idle(east)
        with pytest.raises(UnreadableRecordError, match=f"token {10**9} above its own offset "
                                                        f"{offset}"):
            east.reserve(ROLE, "2013-01-05")
    finally:
        east.close()


def test_the_check_catches_a_singleton_that_decides_from_the_older_record(
        kafka_broker: str, ns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The deliberately broken variant: latest() falls back to the older readable record. The
    # deployment then takes over a run that a newer writer recorded as COMPLETED.
    monkeypatch.setattr(Replay, "latest", lambda self, run_key: self.records.get(run_key))
    east = deployment(kafka_broker, ns, "us-east-1")
    west = deployment(kafka_broker, ns, "eu-west-1", wall_clock=lambda: time.time() + 3600)
    try:
        assert east.reserve(ROLE, "2013-01-05").should_run
        produce(kafka_broker, f"{ns}.ledger", "2013-01-05",
                json.dumps({"v": 2, "state": "COMPLETED"}).encode())
        idle(east)
        taken = west.reserve(ROLE, "2013-01-05")
        assert taken.outcome is Outcome.TAKE_OVER and taken.should_run
    finally:
        east.close()
        west.close()
