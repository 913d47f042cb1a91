"""A replay never takes an unknown end offset as the end (issue 31, S5), on a real broker.

The broker's answer for the partition's end is replaced, for a few questions, by what a
partition whose leader is changing answers: -1001 (OFFSET_INVALID), an end below what this
host already read, or an error. Everything else is the real broker. The multi-broker test
(tests/ledger/test_ledger_leader_kill_cluster.py) kills the leader for real.
"""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import ListOffsetsResultInfo, OffsetSpec

from neli_orchestrate.errors import KafkaUnavailableError
from neli_orchestrate.ledger import cache as ledger_cache
from neli_orchestrate.ledger import kafka as ledger_kafka
from neli_orchestrate.ledger.kafka import KafkaLedger
from neli_orchestrate.ledger.record import LedgerError, LedgerRecord, RunState
from tests.ledger.ledger_helpers import open_ledger as shared_open_ledger

pytestmark = pytest.mark.kafka

ROLE = "daily_flights"


class LeaderChange:
    """The ledger's admin client, except that the next answers for the partition's end are
    ``answers`` (an int offset, or an exception to raise) instead of the broker's."""

    def __init__(self, admin: Any) -> None:
        self._admin = admin
        self.answers: list[int | BaseException] = []
        self.asked = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._admin, name)

    def list_offsets(self, request: dict[Any, Any], **kwargs: Any) -> dict[Any, Any]:
        ((tp, spec),) = request.items()
        if type(spec) is not type(OffsetSpec.latest()) or not self.answers:
            return self._admin.list_offsets(request, **kwargs)
        self.asked += 1
        answer = self.answers.pop(0)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if isinstance(answer, BaseException):
            future.set_exception(answer)
        else:
            future.set_result(ListOffsetsResultInfo(answer, -1, -1))
        return {tp: future}


def open_ledger(ledgers: list[KafkaLedger], bootstrap: str, topic: str,
                **kwargs: Any) -> tuple[KafkaLedger, LeaderChange]:
    kwargs.setdefault("replay_timeout", 20.0)
    ledger = shared_open_ledger(ledgers, bootstrap, topic, **kwargs)
    ledger.partition_for(ROLE)          # creates the topic and the admin client
    change = LeaderChange(ledger._admin)
    ledger._admin = change
    return ledger, change


def claim(ledger: KafkaLedger, run_key: str) -> LedgerRecord:
    """Fence, replay, write a claim under the next token (what a gate does)."""
    writer = ledger.begin(ROLE)
    try:
        token = writer.replay().next_token
        record = LedgerRecord(ROLE, run_key, RunState.CLAIMED, token, "us-east-1", "m", 1,
                              time.time(), handoff_deadline=time.time() + 300)
        writer.write(record)
        return record
    finally:
        writer.close()


@pytest.mark.parametrize("cache", ["shared", "separate", "none"])
def test_a_replay_waits_through_invalid_end_offsets_and_tokens_keep_increasing(
    kafka_broker: str, ledgers: list[KafkaLedger], topic: str, tmp_path: Path, cache: str,
) -> None:
    first, _ = open_ledger(ledgers, kafka_broker, topic,
                           replay_cache=cache != "none", replay_cache_dir=str(tmp_path / "a"))
    issued = [claim(first, f"2013-01-0{day}").token for day in (1, 2, 3)]
    second, change = open_ledger(
        ledgers, kafka_broker, topic, replay_cache=cache != "none",
        replay_cache_dir=str(tmp_path / ("a" if cache == "shared" else "b")))
    if cache == "separate":
        claim(second, "2013-01-04")        # a checkpoint of its own, then more claims elsewhere
        issued.append(claim(first, "2013-01-05").token)
    # The leader is changing: -1001 twice, and an error, before the new leader answers.
    leaderless = ledger_kafka._kafka().KafkaException(
        ledger_kafka._kafka().KafkaError(ledger_kafka._kafka().KafkaError.NOT_LEADER_FOR_PARTITION))
    change.answers = [-1001, leaderless, -1001]
    record = claim(second, "2013-01-06")
    assert change.asked == 3 and change.answers == []
    assert record.token > max(issued), (record.token, issued)


def test_an_end_offset_that_never_becomes_known_fails_the_replay_and_decides_nothing(
    kafka_broker: str, ledgers: list[KafkaLedger], topic: str, tmp_path: Path,
) -> None:
    ledger, change = open_ledger(ledgers, kafka_broker, topic, replay_timeout=1.0,
                                 replay_cache_dir=str(tmp_path))
    token = claim(ledger, "2013-01-01").token
    checkpoint = ledger._cache.get(ledger._cluster_id, topic, ROLE)  # type: ignore[union-attr]
    # The broker says which leader epoch answered: an older one's answer is never a fact.
    assert checkpoint is not None and checkpoint.leader_epoch is not None
    change.answers = [-1001] * 1000
    writer = ledger.begin(ROLE)
    try:
        started = time.monotonic()
        with pytest.raises(KafkaUnavailableError, match=r"-1001.*not an offset") as caught:
            writer.replay()
        assert 1.0 <= time.monotonic() - started < 5.0
        assert "recreated" not in str(caught.value)
    finally:
        writer.close()
    # The failed replay left the host's checkpoint as it was, and the ledger unwritten.
    assert ledger._cache.get(ledger._cluster_id, topic, ROLE) == checkpoint  # type: ignore[union-attr]
    change.answers = []
    replay = ledger.replay(ROLE)
    assert replay.end_offset > token and replay.max_token == token


def test_an_unconfirmed_end_below_the_checkpoint_is_asked_again_not_judged_recreated(
    kafka_broker: str, ledgers: list[KafkaLedger], topic: str, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger, change = open_ledger(ledgers, kafka_broker, topic, replay_cache_dir=str(tmp_path))
    issued = [claim(ledger, f"2013-01-0{day}").token for day in (1, 2, 3, 4)]
    # A deposed leader answers 0 once; asked again, the current leader answers the truth.
    change.answers = [0]
    with caplog.at_level("INFO", logger="neli_orchestrate.ledger.kafka"):
        record = claim(ledger, "2013-01-05")
    assert record.token > max(issued)
    assert "asking the broker again" in caplog.text and "recreated" not in caplog.text
    assert "truncated" not in caplog.text


def test_deliberately_broken_a_replay_that_takes_minus_1001_as_the_end(
    kafka_broker: str, ledgers: list[KafkaLedger], topic: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The defect of issue 31, re-introduced: both of its symptoms appear."""
    monkeypatch.setattr(ledger_kafka, "end_is_known", lambda offset: True)
    monkeypatch.setattr(ledger_cache, "end_is_known", lambda offset: True)
    # ...and an end below the checkpoint is believed at once, unconfirmed.
    judge = ledger_cache.judge
    monkeypatch.setattr(ledger_kafka, "judge",
                        lambda checkpoint, **facts: judge(checkpoint, **{**facts,
                                                                         "earlier": facts["end"]}))
    cached, cached_change = open_ledger(ledgers, kafka_broker, topic,
                                        replay_cache_dir=str(tmp_path))
    blind, blind_change = open_ledger(ledgers, kafka_broker, topic, replay_cache=False)
    issued = [claim(cached, f"2013-01-0{day}").token for day in (1, 2, 3)]
    # With the host's checkpoint: the false "recreated" error.
    cached_change.answers = [-1001]
    with pytest.raises(LedgerError, match="ends at offset 0 .* recreated or rewritten"):
        claim(cached, "2013-01-04")
    # Without one: the replay reads nothing and issues token 0 over the issued tokens.
    blind_change.answers = [-1001]
    assert claim(blind, "2013-01-05").token == 0 < max(issued)


def test_the_ledger_history_waits_through_invalid_end_offsets(
    kafka_broker: str, ledgers: list[KafkaLedger], topic: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`neli-orchestrate ledger`/status read the whole history: -1001 is not "empty" there
    either."""
    from neli_orchestrate.ledger import history

    ledger, _ = open_ledger(ledgers, kafka_broker, topic, replay_cache=False)
    issued = claim(ledger, "2013-01-01").token
    config = ledger.config
    answers: list[int | BaseException] = [-1001, -1001]
    make_admin = history.new_admin

    def flaky(conf: Any) -> LeaderChange:
        change = LeaderChange(make_admin(conf))
        change.answers = answers
        return change

    # history's admin client (made by the core's seam) answers -1001 for the ends
    monkeypatch.setattr(history, "new_admin", flaky)
    read = history.read_history(config)
    assert answers == []
    assert [e.record.token for e in read.entries if e.record is not None] == [issued]
    answers.extend([-1001] * 1000)
    with pytest.raises(KafkaUnavailableError, match="answered no end offset"):
        history.read_history(config, timeout=1.0)
