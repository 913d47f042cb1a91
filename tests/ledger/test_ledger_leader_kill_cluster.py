"""Tokens strictly increase per role while the ledger partition's leader is killed (issue 31, S5).

A real 3-node KRaft cluster (RF 3, min ISR 2) on Kafka's default broker session
(``broker.session.timeout.ms`` 9000, heartbeat 2000). Two roles, each claimed in a tight loop by
two deployments (two :class:`KafkaLedger` clients, each with its own transactional producer per
claim, fencing the other): role ``shared`` by deployments that share one replay-cache directory
(two deployments on one host), role ``separate`` by deployments with a directory each. While they
claim and replay, the leader of the ledger partition is killed with SIGKILL, twice (the second
time the new leader), each time restarted afterwards.

Asserted: every successful claim's token is above every token of the role whose claim was
written before it began; the ledger itself holds the role's claims with strictly increasing
tokens in offset order; no claim fails with the false "recreated or rewritten" error, or any
error but KafkaUnavailableError (the end could not be established in time) and FencedError
(the other deployment began later); claims go on after each kill.

``NELI_TEST_BREAK_END_CHECK=1`` re-introduces the defect (an end offset of -1001 is taken as
the end, an end below the checkpoint is believed at once) to show this test can fail.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from neli_orchestrate.errors import FencedError, KafkaUnavailableError
from neli_orchestrate.ledger import cache as ledger_cache
from neli_orchestrate.ledger import kafka as ledger_kafka
from neli_orchestrate.ledger.kafka import KafkaLedger, KafkaLedgerConfig
from neli_orchestrate.ledger.record import LedgerRecord, RunState, role_key_prefix
from neli_orchestrate.testing.local_kafka import LocalKafkaCluster

pytestmark = [pytest.mark.kafka]

log = logging.getLogger(__name__)

#: Kafka's own defaults (the fixture's fast 3000/500 would hide the 9 s leaderless window).
DEFAULT_BROKER_SESSION = {"broker.session.timeout.ms": "9000",
                          "broker.heartbeat.interval.ms": "2000"}


@dataclass
class Claim:
    deployment: str
    began: float
    written: float
    token: int
    run_key: str


@dataclass
class Book:
    """What the deployments of one role saw."""

    role: str
    claims: list[Claim] = field(default_factory=list)
    attempts: list[tuple[float, float]] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)
    fenced: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def claims_after(self, moment: float) -> int:
        with self.lock:
            return sum(1 for c in self.claims if c.began > moment)


def claim_loop(ledger: KafkaLedger, book: Book, name: str, stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        run_key = f"{name}-{n}"
        began = time.monotonic()
        try:
            writer = ledger.begin(book.role)
            try:
                token = writer.replay().next_token
                now = time.time()
                writer.write(LedgerRecord(book.role, run_key, RunState.CLAIMED, token, name,
                                          name, 1, now, handoff_deadline=now + 300))
                with book.lock:
                    book.claims.append(Claim(name, began, time.monotonic(), token, run_key))
            finally:
                writer.close()
        except FencedError:
            with book.lock:
                book.fenced += 1
        except KafkaUnavailableError as exc:
            with book.lock:
                book.unavailable.append(str(exc))
            time.sleep(0.2)
        except Exception as exc:  # noqa: BLE001 - every other error is a finding
            with book.lock:
                book.errors.append(f"{name}: {type(exc).__name__}: {exc}")
            time.sleep(0.2)
        finally:
            with book.lock:
                book.attempts.append((began, time.monotonic()))


def committed_claims(bootstrap: str, topic: str, role: str) -> list[tuple[int, int]]:
    """(offset, token) of every committed claim of ``role`` in the ledger, in offset order."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap,  # type: ignore[dict-item]
                         "group.id": f"check-{uuid.uuid4().hex}",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "auto.offset.reset": "earliest",
                         "logger": logging.getLogger("test.librdkafka")})
    consumer.assign([TopicPartition(topic, 0, 0)])
    prefix = role_key_prefix(role)
    found: list[tuple[int, int]] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "never reached the end of the ledger partition"
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return found
                continue
            key, value, offset = message.key(), message.value(), message.offset()
            if key is None or not key.startswith(prefix) or value is None or offset is None:
                continue
            record = LedgerRecord.decode(value, key=key, offset=offset)
            assert record is not None, value
            found.append((offset, record.token))
    finally:
        consumer.close()


def wait_for(what: str, condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def partition_state(cluster: LocalKafkaCluster, topic: str) -> tuple[int, int]:
    """(leader, ISR size) of the ledger partition; (-1, 0) while unknown."""
    from confluent_kafka.admin import AdminClient

    conf: dict[str, Any] = {"bootstrap.servers": cluster.bootstrap_servers,
                            "logger": logging.getLogger("test.librdkafka")}
    admin = AdminClient(conf)
    try:
        partition = admin.list_topics(topic, timeout=5).topics[topic].partitions[0]
    except Exception:  # noqa: BLE001 - a node is down: ask again
        return -1, 0
    return int(partition.leader), len(partition.isrs)


@pytest.fixture
def broken(monkeypatch: pytest.MonkeyPatch) -> bool:
    if os.environ.get("NELI_TEST_BREAK_END_CHECK") != "1":
        return False
    monkeypatch.setattr(ledger_kafka, "end_is_known", lambda offset: True)
    monkeypatch.setattr(ledger_cache, "end_is_known", lambda offset: True)
    judge = ledger_cache.judge
    monkeypatch.setattr(ledger_kafka, "judge",
                        lambda checkpoint, **facts: judge(checkpoint, **{**facts,
                                                                         "earlier": facts["end"]}))
    return True


class EndAnswers(logging.Handler):
    """Counts the replays' unknown end offsets (KafkaLedger._end_offset asking again), by kind."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.kinds: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if "not known yet" not in record.msg:
            return
        answer = str(record.args[2]) if isinstance(record.args, tuple) else ""
        kind = ("-1001" if "-1001" in answer else "no answer" if "no answer" in answer
                else answer.split(":")[0][:60])
        self.kinds[kind] = self.kinds.get(kind, 0) + 1


@pytest.fixture
def end_answers() -> Iterator[EndAnswers]:
    handler = EndAnswers()
    logger = logging.getLogger("neli_orchestrate.ledger.kafka")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.fixture
def cluster() -> Iterator[LocalKafkaCluster]:
    with LocalKafkaCluster(properties=DEFAULT_BROKER_SESSION) as started:
        yield started


# ~2 minutes; a run that takes five has hung (pytest-timeout then prints every thread's stack)
@pytest.mark.timeout(300)
def test_tokens_strictly_increase_while_the_ledger_leader_is_killed(
    cluster: LocalKafkaCluster, tmp_path: Path, broken: bool, end_answers: EndAnswers,
) -> None:
    topic = f"ledger-{uuid.uuid4().hex[:8]}"
    shared, separate = Book("shared"), Book("separate")
    plans = [(shared, "host-a", tmp_path / "host"), (shared, "host-b", tmp_path / "host"),
             (separate, "east", tmp_path / "east"), (separate, "west", tmp_path / "west")]
    ledgers: list[KafkaLedger] = []
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        for book, _name, directory in plans:
            ledger = KafkaLedger(KafkaLedgerConfig(
                bootstrap_servers=cluster.bootstrap_servers, topic=topic,
                replay_cache_dir=str(directory)))
            ledger.partition_for(book.role)          # topic created (RF 3) and checked
            ledgers.append(ledger)
        wait_for("three in-sync replicas", lambda: partition_state(cluster, topic)[1] == 3, 60)
        for (book, name, _), ledger in zip(plans, ledgers, strict=True):
            thread = threading.Thread(target=claim_loop, args=(ledger, book, name, stop),
                                      name=f"claims-{name}", daemon=True)
            thread.start()
            threads.append(thread)
        wait_for("claims before the first kill",
                 lambda: min(shared.claims_after(0), separate.claims_after(0)) >= 5, 120)

        kills: list[float] = []
        for _round in range(2):
            leader, _ = partition_state(cluster, topic)
            assert leader in cluster.nodes, leader
            killed_at = time.monotonic()
            cluster.kill(leader)
            kills.append(killed_at)
            log.info("killed node %d, the ledger partition's leader", leader)
            wait_for("a new leader", lambda old=leader: partition_state(cluster, topic)[0]
                     not in (old, -1), 60)
            elected = time.monotonic()
            wait_for("claims under the new leader",
                     lambda t=elected: min(shared.claims_after(t),
                                           separate.claims_after(t)) >= 3, 120)
            cluster.restart(leader)
            wait_for("the killed node back in sync",
                     lambda: partition_state(cluster, topic)[1] == 3, 120)
            restarted = time.monotonic()
            wait_for("claims after the restart",
                     lambda t=restarted: min(shared.claims_after(t),
                                             separate.claims_after(t)) >= 3, 120)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        for ledger in ledgers:
            ledger.close()

    # The kills were felt: replays met ends they could not take (and asked again).
    print(f"unknown end offsets met by replays, by answer: {end_answers.kinds}")
    assert broken or end_answers.kinds, "no replay ever met an unknown end offset"
    for book in (shared, separate):
        summary = (f"{book.role}: {len(book.claims)} claims, {book.fenced} fenced,"
                   f" {len(book.unavailable)} unavailable {sorted(set(book.unavailable))[:4]},"
                   f" errors {book.errors[:3]}"
                   f" (broken={broken})")
        log.info(summary)
        print(summary)
        assert not book.errors, summary
        # Claims in flight when the leader died (the loop runs without pause).
        assert all(any(a <= k <= b for a, b in book.attempts) for k in kills), summary
        # Every claim's token is above every token written before it began (and no two equal).
        ordered = sorted(book.claims, key=lambda c: c.written)
        for earlier, later in zip(ordered, ordered[1:], strict=False):
            assert later.token > earlier.token, (earlier, later, summary)
        for claim in book.claims:
            before = [c.token for c in book.claims if c.written < claim.began]
            assert not before or claim.token > max(before), (claim, max(before), summary)
        # The ledger agrees: the role's committed claims, in offset order, strictly increase.
        ledger_tokens = [token for _, token in
                         committed_claims(cluster.bootstrap_servers, topic, book.role)]
        assert all(b > a for a, b in zip(ledger_tokens, ledger_tokens[1:], strict=False)), (
            ledger_tokens, summary)
        assert {c.token for c in book.claims} <= set(ledger_tokens)
