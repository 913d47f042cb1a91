"""A ledger writer kept from one claim to the next (KafkaLedger.resume) against a real broker.

The kept producer's fence is the ``init_transactions()`` of an earlier claim. A newer leader's
``init_transactions()`` (in another deployment) bumps the producer epoch at the broker, so the
kept producer — a zombie from then on — cannot commit, even when that leader wrote nothing
(the replay then looks unchanged). The broken variant at the end shows what the shared
``transactional.id`` buys: a "newer leader" on another id fences nothing, and the zombie's
claim lands.
"""

from __future__ import annotations

import time
import uuid

import pytest

from neli_orchestrate.decision import Claimant, DecisionPolicy, claim_record, decide
from neli_orchestrate.errors import FencedError
from neli_orchestrate.ledger.kafka import KafkaLedger, KafkaLedgerWriter
from neli_orchestrate.ledger.record import LedgerRecord, RunState
from tests.ledger.ledger_helpers import open_ledger as shared_open_ledger

pytestmark = pytest.mark.kafka

ROLE = "flights"
POLICY = DecisionPolicy(handoff_timeout=60.0)
US = Claimant("us-east-1", "us-member")


def open_ledger(ledgers: list[KafkaLedger], bootstrap: str, topic: str,
                **kwargs: object) -> KafkaLedger:
    return shared_open_ledger(ledgers, bootstrap, topic, replay_cache_dir="", **kwargs)


def claim_with(writer: KafkaLedgerWriter, run_key: str) -> LedgerRecord:
    """Replay through ``writer``, decide, write the claim (what Singleton does)."""
    replay = writer.replay()
    now = time.time()
    decision = decide(replay.latest(run_key), US, now=now, policy=POLICY)
    record = claim_record(decision, replay, run_key=run_key, me=US, now=now, policy=POLICY,
                          state=RunState.CLAIMED)
    writer.write(record)
    return record


def test_a_kept_writer_is_fenced_by_a_newer_leader_that_wrote_nothing(
    kafka_broker: str, ledgers: list[KafkaLedger],
) -> None:
    topic = f"ledger.{uuid.uuid4().hex[:10]}"
    us = open_ledger(ledgers, kafka_broker, topic)
    eu = open_ledger(ledgers, kafka_broker, topic)  # another deployment, same ledger
    first = us.resume(ROLE)
    assert not first.reused  # nothing kept yet: a new producer, fenced
    one = claim_with(first, "2013-01-01")
    first.release()

    # Kept: the next claim in this process needs no init_transactions() ...
    kept = us.resume(ROLE)
    assert kept.reused
    two = claim_with(kept, "2013-01-02")
    assert two.token > one.token
    kept.release()

    # ... until a newer leader fences it. This one writes nothing (a gate that found the run
    # key claimed), so the zombie's replay sees no new token and goes ahead to its commit.
    newer = eu.begin(ROLE)
    assert newer.replay().max_token == two.token
    newer.close()

    zombie = us.resume(ROLE)
    assert zombie.reused
    with pytest.raises(FencedError):
        claim_with(zombie, "2013-01-03")
    zombie.release()  # a fenced writer is never kept
    assert "2013-01-03" not in eu.replay(ROLE).records  # nothing of the zombie's claim landed

    # The next claim fences anew and claims under a larger token.
    fresh = us.resume(ROLE)
    assert not fresh.reused
    three = claim_with(fresh, "2013-01-03")
    assert three.token > two.token
    fresh.close()


def test_a_kept_writer_fences_again_when_another_leader_wrote(
    kafka_broker: str, ledgers: list[KafkaLedger],
) -> None:
    """The cheap case: the replay shows a token this producer never saw, so it fences again
    before deciding (no doomed commit)."""
    topic = f"ledger.{uuid.uuid4().hex[:10]}"
    us = open_ledger(ledgers, kafka_broker, topic)
    eu = open_ledger(ledgers, kafka_broker, topic)
    first = us.resume(ROLE)
    one = claim_with(first, "2013-01-01")
    first.release()
    other = eu.begin(ROLE)
    theirs = claim_with(other, "2013-01-02")
    other.close()
    kept = us.resume(ROLE)
    assert kept.reused
    replay = kept.replay()
    assert not kept.reused  # fenced again: a new producer, init_transactions()
    assert replay.max_token == theirs.token > one.token
    mine = claim_with(kept, "2013-01-03")
    assert mine.token > theirs.token
    kept.close()


def test_broken_variant_without_a_shared_transactional_id_the_zombie_commits(
    kafka_broker: str, ledgers: list[KafkaLedger],
) -> None:
    """The check above, with the fence removed: the newer leader uses another
    ``transactional.id``, its init_transactions() fences nothing, the zombie's claim lands."""
    topic = f"ledger.{uuid.uuid4().hex[:10]}"
    us = open_ledger(ledgers, kafka_broker, topic)
    unfenced = open_ledger(ledgers, kafka_broker, topic, transactional_id_prefix="elsewhere:")
    first = us.resume(ROLE)
    claim_with(first, "2013-01-01")
    first.release()
    unfenced.begin(ROLE).close()
    zombie = us.resume(ROLE)
    assert zombie.reused
    claim_with(zombie, "2013-01-02")  # no FencedError: nothing fenced it
    zombie.close()
    assert "2013-01-02" in unfenced.replay(ROLE).records


def test_a_producer_kept_too_long_is_dropped_and_the_next_claim_fences_anew(
    kafka_broker: str, ledgers: list[KafkaLedger],
) -> None:
    topic = f"ledger.{uuid.uuid4().hex[:10]}"
    us = open_ledger(ledgers, kafka_broker, topic)
    first = us.resume(ROLE)
    one = claim_with(first, "2013-01-01")
    first.release()
    later = time.monotonic() + 3600  # an hour idle (the broker may have expired the id)
    us._monotonic = lambda: later
    fresh = us.resume(ROLE)
    assert not fresh.reused
    assert claim_with(fresh, "2013-01-02").token > one.token
    fresh.close()


@pytest.mark.parametrize(("waited", "same"), [(0.0, True), (60.0, False)])
def test_a_producer_prepared_before_a_wait_is_not_the_one_that_fences(
        kafka_broker: str, ledgers: list[KafkaLedger], topic: str, waited: float,
        same: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # prepare() connects the role's producer while the gate joins; a gate that then waited
    # (the role was busy) must not fence with it: what it learnt of the cluster may be a lost
    # broker's (docs/internals/chaos.md, the region-loss trials)
    us = open_ledger(ledgers, kafka_broker, topic)
    made: list[object] = []
    producer = us._producer
    monkeypatch.setattr(us, "_producer", lambda role: made.append(producer(role)) or made[-1])
    now = time.monotonic()
    us._monotonic = lambda: now
    us.prepare(ROLE)
    us._monotonic = lambda: now + waited
    writer = us.begin(ROLE)
    try:
        assert writer.replay().next_token >= 0
        assert (len(made), writer._producer is made[0]) == ((1, True) if same else (2, False))
    finally:
        writer.close()


def _connect_thread_done(role: str, timeout: float = 30.0) -> None:
    import threading

    for thread in threading.enumerate():
        if thread.name == f"neli-ledger-connect-{role}":
            thread.join(timeout)
            assert not thread.is_alive(), "prepare()'s connecting thread did not end"


def test_prepare_connects_the_replay_consumer_the_replay_then_uses(
        kafka_broker: str, ledgers: list[KafkaLedger], topic: str) -> None:
    # A new process (a gate's task) has no replay consumer: made after the fence, its
    # connections would cost about three round trips on the claim's path. prepare() makes and
    # connects it while the gate joins; the replay after the fence uses that one.
    us = open_ledger(ledgers, kafka_broker, topic)
    assert us._consumer is None
    us.prepare(ROLE)
    _connect_thread_done(ROLE)
    prepared = us._consumer
    assert prepared is not None, "prepare() left the replay consumer to the replay"
    writer = us.begin(ROLE)
    try:
        first = claim_with(writer, "2013-01-01")
        assert us._consumer is prepared
        assert writer.replay().latest("2013-01-01") == first
    finally:
        writer.close()


def test_a_ledger_closed_while_it_prepares_keeps_no_replay_consumer(
        kafka_broker: str, ledgers: list[KafkaLedger], topic: str) -> None:
    us = open_ledger(ledgers, kafka_broker, topic)
    us.prepare(ROLE)
    us.close()
    _connect_thread_done(ROLE)
    assert us._consumer is None
