"""Ledger records, keys, replay folding and retention, without a broker."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import zlib
from dataclasses import replace

import pytest

from neli_orchestrate.errors import ConfigError, UnreadableRecordError
from neli_orchestrate.ledger.kafka import KafkaLedgerConfig
from neli_orchestrate.ledger.record import (
    LEDGER_SCHEMA_VERSION,
    LedgerError,
    LedgerRecord,
    MalformedRecordError,
    RunState,
    decode_key,
    encode_key,
    parse_record,
    role_key_prefix,
    role_partition,
)
from neli_orchestrate.ledger.replay import ReplayBuilder, expired_run_keys

NOW = 1_736_000_000.0


def record(state: RunState = RunState.COMPLETED, **overrides: object) -> LedgerRecord:
    fields: dict[str, object] = {
        "role": "daily_flights",
        "run_key": "2013-01-05",
        "state": state,
        "token": 7,
        "deployment": "us-east-1",
        "member": "host_1_2",
        "attempt": 1,
        "at": NOW,
        "reason": "",
        "handoff_deadline": NOW + 60 if state is RunState.CLAIMED else None,
    }
    fields.update(overrides)
    return LedgerRecord(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("state", list(RunState))
def test_every_state_survives_encode_then_decode(state: RunState) -> None:
    original = record(state, reason="why: ü ✓", handoff_deadline=NOW + 5)
    value = original.encode()
    assert json.loads(value)["v"] == LEDGER_SCHEMA_VERSION
    assert LedgerRecord.decode(value, key=original.key) == original


def test_value_is_the_documented_json_object() -> None:
    data = json.loads(record(RunState.CLAIMED).encode())
    assert data == {
        "v": 1, "role": "daily_flights", "run_key": "2013-01-05", "state": "CLAIMED",
        "token": 7, "deployment": "us-east-1", "member": "host_1_2", "attempt": 1,
        "reason": "", "at": NOW, "handoff_deadline": NOW + 60,
    }


APP = "standalone application driver-20130105000000-0000 on spark://10.0.0.5:6066"


def test_a_failed_record_names_an_application_that_may_still_run() -> None:
    running = record(RunState.RUNNING)
    failed = running.advance(RunState.FAILED, at=NOW + 1, reason="timeout", unstopped=(APP,))
    data = json.loads(failed.encode())
    assert data["unstopped"] == [APP]  # an additive field: v1 readers ignore it
    assert data["v"] == 1
    assert LedgerRecord.decode(failed.encode(), key=failed.key) == failed
    assert failed.describe().endswith(f"; {APP} may still be running")
    # written only when set: every other record keeps the documented object
    assert "unstopped" not in json.loads(running.encode())
    # the field's first writers wrote one name as a string
    data["unstopped"] = APP
    assert LedgerRecord.decode(json.dumps(data), key=failed.key) == failed
    data["unstopped"] = [APP, ""]
    assert LedgerRecord.decode(json.dumps(data), key=failed.key) is None  # malformed: ignored


def test_a_running_try_names_its_application_and_a_new_claim_inherits_it() -> None:
    from neli_orchestrate.decision import may_still_run

    running = record(RunState.RUNNING)
    named = running.advance(RunState.RUNNING, at=NOW + 1, application=APP)
    assert json.loads(named.encode())["application"] == APP
    assert LedgerRecord.decode(named.encode(), key=named.key) == named
    assert named.describe().endswith(f"; submitted {APP}")
    # a try that never recorded its end (died, fenced, cut off) leaves it to the next claim
    assert may_still_run(named) == (APP,)
    # COMPLETED, or FAILED with the kill confirmed: nothing to inherit
    assert may_still_run(named.advance(RunState.COMPLETED, at=NOW + 2)) == ()
    assert may_still_run(named.advance(RunState.FAILED, at=NOW + 2)) == ()
    # FAILED without the kill confirmed, or a claim that inherited it and has not stopped it
    assert may_still_run(named.advance(RunState.FAILED, at=NOW + 2, unstopped=(APP,))) == (APP,)
    inherited = replace(record(RunState.CLAIMED), unstopped=(APP,))
    assert may_still_run(inherited.advance(RunState.RUNNING, at=NOW + 2)) == (APP,)
    cleared = inherited.advance(RunState.RUNNING, at=NOW + 2).advance(
        RunState.RUNNING, at=NOW + 3, unstopped=())
    assert may_still_run(cleared) == ()
    # an inherited one this try could not reach, and its own, which it named, then died: both
    other = "standalone application driver-20130105000000-0009 on spark://10.9.9.9:7077"
    both = replace(record(RunState.CLAIMED), unstopped=(other,)).advance(
        RunState.RUNNING, at=NOW + 2).advance(RunState.RUNNING, at=NOW + 3, application=APP)
    assert may_still_run(both) == (other, APP)
    with pytest.raises(ValueError, match="names no application"):
        running.advance(RunState.FAILED, at=NOW + 1).advance(
            RunState.CLAIMED, at=NOW + 2, application=APP)


@pytest.mark.parametrize(
    ("role", "run_key"),
    [
        ("a", "b/c"),
        ("a/b", "c"),
        ('quote"role', "x"),
        ("role", '","'),
        ("daily_flights/{{ ds }}", "2013-01-05T00:00:00+00:00"),
        ("ünïcode", "日付"),
        ("sep\x00", "\x1f"),
    ],
)
def test_key_is_unambiguous_for_any_text(role: str, run_key: str) -> None:
    key = encode_key(role, run_key)
    assert decode_key(key) == (role, run_key)
    assert key.startswith(role_key_prefix(role))


def test_keys_of_different_splits_differ() -> None:
    # "a/b" + "c" and "a" + "b/c" must never collide, whatever the separator.
    assert encode_key("a/b", "c") != encode_key("a", "b/c")
    assert not encode_key("ab", "c").startswith(role_key_prefix("a"))
    assert not encode_key('a",', "c").startswith(role_key_prefix("a"))


def test_decode_key_rejects_what_is_not_a_ledger_key() -> None:
    for key in (b"plain", b"[]", b'["only"]', b'["a",1]', b'["","x"]', b"\xff"):
        assert decode_key(key) is None


def test_role_partition_is_crc32_and_the_same_in_every_process() -> None:
    assert role_partition("daily_flights", 7) == zlib.crc32(b"daily_flights") % 7
    code = ("from neli_orchestrate.ledger.record import role_partition as p; "
            "print(p('daily_flights', 12))")
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout.strip()
        for seed in ("1", "2", "3")
    }
    assert outputs == {str(zlib.crc32(b"daily_flights") % 12)}


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"v": 2, "state": "COMPLETED"}', "unknown schema version"),
        (b'{"state": "COMPLETED"}', "unknown schema version"),
        (b'{"v": true}', "unknown schema version"),
        (b'{"v": 1, "role": "r"}', "missing field"),
    ],
)
def test_malformed_record_is_ignored_with_a_warning(
    value: bytes, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="neli_orchestrate.ledger"):
        assert LedgerRecord.decode(value, offset=12) is None
    assert why in caplog.text
    assert "offset 12" in caplog.text


def _tampered(**changes: object) -> bytes:
    data = json.loads(record(RunState.COMPLETED).encode())
    data.update(changes)
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    "changes",
    [
        {"state": "DONE"},
        {"state": 3},
        {"token": "7"},
        {"token": True},
        {"token": -1},
        {"attempt": 0},
        {"at": "yesterday"},
        {"at": float("inf")},
        {"role": ""},
        {"member": None},
        {"state": "CLAIMED", "handoff_deadline": None},
    ],
)
def test_records_with_bad_fields_are_never_taken_as_anything(
    changes: dict[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="neli_orchestrate.ledger"):
        assert LedgerRecord.decode(_tampered(**changes)) is None
    assert "ignoring ledger record" in caplog.text
    with pytest.raises(MalformedRecordError):
        parse_record(_tampered(**changes))


def test_unknown_extra_fields_are_allowed_within_version_1() -> None:
    assert LedgerRecord.decode(_tampered(spark_app_id="app-1")) == record(RunState.COMPLETED)


def test_value_whose_key_names_another_run_is_ignored() -> None:
    value = record().encode()
    assert LedgerRecord.decode(value, key=encode_key("daily_flights", "2013-01-06")) is None


def test_claim_advances_to_running_then_a_terminal_state_keeping_its_token() -> None:
    claimed = record(RunState.CLAIMED)
    running = claimed.advance(RunState.RUNNING, at=NOW + 1, member="executor_9")
    assert (running.token, running.attempt, running.deployment) == (7, 1, "us-east-1")
    assert running.member == "executor_9" and running.handoff_deadline is None
    assert running.advance(RunState.COMPLETED, at=NOW + 2).state is RunState.COMPLETED
    failed = running.advance(RunState.FAILED, at=NOW + 2, reason="boom", handoff_deadline=NOW + 9)
    assert failed.reason == "boom" and failed.handoff_deadline == NOW + 9


@pytest.mark.parametrize(
    ("start", "target"),
    [
        (RunState.CLAIMED, RunState.COMPLETED),
        (RunState.RUNNING, RunState.CLAIMED),
        (RunState.COMPLETED, RunState.RUNNING),
        (RunState.FAILED, RunState.RUNNING),
    ],
)
def test_illegal_moves_of_a_claim_are_refused(start: RunState, target: RunState) -> None:
    with pytest.raises(ValueError, match="cannot move"):
        record(start).advance(target, at=NOW)


# -- replay folding --------------------------------------------------------------------------


def _msg(rec: LedgerRecord) -> tuple[bytes, bytes]:
    return rec.key, rec.encode()


def test_replay_keeps_the_latest_record_per_run_key_and_skips_other_roles() -> None:
    builder = ReplayBuilder("daily_flights")
    claimed = record(RunState.CLAIMED, token=0)
    builder.add(*_msg(claimed), 0)
    other = record(RunState.CLAIMED, role="daily_flights_v2", token=2)
    builder.add(*_msg(other), 2)
    running = claimed.advance(RunState.RUNNING, at=NOW + 1)
    builder.add(*_msg(running), 4)
    builder.add(b"not a ledger key", b"whatever", 6)
    builder.add(None, b"no key", 7)
    replay = builder.build(8, fenced=True)
    assert dict(replay.records) == {"2013-01-05": running}
    assert replay.latest("2013-01-05") == running
    assert replay.latest("2013-01-06") is None
    assert replay.next_token == 8
    assert replay.ignored == 0


def test_tombstone_removes_a_run_key() -> None:
    builder = ReplayBuilder("daily_flights")
    done = record(RunState.COMPLETED, token=0)
    builder.add(*_msg(done), 0)
    builder.add(done.key, None, 2)
    assert builder.build(3, fenced=False).records == {}


def test_unreadable_newest_record_leaves_the_previous_one_and_is_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    builder = ReplayBuilder("daily_flights")
    running = record(RunState.RUNNING, token=0)
    builder.add(*_msg(running), 0)
    with caplog.at_level(logging.WARNING, logger="neli_orchestrate.ledger"):
        builder.add(running.key, b'{"v": 9, "state": "COMPLETED"}', 2)
    replay = builder.build(3, fenced=True)
    # never taken as completion, nor decided from the older RUNNING: a clear error instead
    with pytest.raises(UnreadableRecordError, match=r"at offset 2 .*unknown schema version.*"
                                                    r"upgrade this deployment") as info:
        replay.latest("2013-01-05")
    assert (info.value.run_key, info.value.offset) == ("2013-01-05", 2)
    assert replay.records["2013-01-05"] == running  # observers may still see it
    assert replay.unreadable == ("2013-01-05",)
    assert replay.ignored == 1
    assert "unknown schema version" in caplog.text


def test_a_readable_record_after_an_unreadable_one_is_decided_from_again() -> None:
    builder = ReplayBuilder("daily_flights")
    builder.add(record(RunState.RUNNING, token=0).key, b"\x00garbage", 0)
    done = record(RunState.COMPLETED, token=1)
    builder.add(*_msg(done), 1)
    assert builder.build(2, fenced=True).latest("2013-01-05") == done


def test_a_record_whose_token_exceeds_its_offset_is_ignored() -> None:
    builder = ReplayBuilder("daily_flights")
    builder.add(*_msg(record(token=50)), 3)
    replay = builder.build(4, fenced=True)
    assert replay.records == {} and replay.ignored == 1
    with pytest.raises(UnreadableRecordError, match="token 50 above its own offset 3"):
        replay.latest("2013-01-05")


def test_a_token_needs_a_replay_taken_after_the_fence() -> None:
    builder = ReplayBuilder("daily_flights")
    builder.add(*_msg(record(token=0)), 0)
    with pytest.raises(LedgerError, match="after begin"):
        _ = builder.build(2, fenced=False).next_token


def test_a_token_that_would_go_backwards_is_a_clear_error() -> None:
    builder = ReplayBuilder("daily_flights")
    builder.add(*_msg(record(token=5)), 5)
    # The topic was recreated: the end offset is not above a token already in the ledger.
    with pytest.raises(LedgerError, match="go backwards"):
        _ = builder.build(5, fenced=True).next_token


def test_retention_expires_only_finished_run_keys_older_than_the_cutoff() -> None:
    builder = ReplayBuilder("daily_flights")
    rows = [
        record(RunState.COMPLETED, run_key="old-done", at=NOW - 100, token=0),
        record(RunState.FAILED, run_key="old-failed", at=NOW - 100, token=1),
        record(RunState.RUNNING, run_key="old-running", at=NOW - 100, token=2),
        record(RunState.CLAIMED, run_key="old-claimed", at=NOW - 100, token=3),
        record(RunState.COMPLETED, run_key="new-done", at=NOW, token=4),
    ]
    for offset, row in enumerate(rows):
        builder.add(*_msg(row), offset)
    replay = builder.build(len(rows), fenced=True)
    assert sorted(expired_run_keys(replay, NOW - 50)) == ["old-done", "old-failed"]


# -- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bootstrap_servers": ""}, "bootstrap_servers"),
        ({"topic": "bad topic"}, "legal Kafka topic"),
        ({"partitions": 0}, "partitions"),
        ({"replay_timeout": 0}, "replay_timeout"),
        ({"kafka_config": {"isolation.level": "read_uncommitted"}}, "isolation.level"),
        ({"kafka_config": {"transactional.id": "x"}}, "transactional.id"),
        ({"topic_config": {"cleanup.policy": "delete"}}, "compact"),
    ],
)
def test_invalid_ledger_config_names_the_field(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"bootstrap_servers": "127.0.0.1:9092"}
    base.update(kwargs)
    with pytest.raises(ConfigError, match=message):
        KafkaLedgerConfig(**base)  # type: ignore[arg-type]


def test_transactional_id_is_the_same_in_every_deployment() -> None:
    config = KafkaLedgerConfig(bootstrap_servers="b:9092", topic="neli.ledger")
    assert config.transactional_id("daily_flights") == "neli.ledger:daily_flights"
    custom = KafkaLedgerConfig(bootstrap_servers="b:9092", transactional_id_prefix="billing/")
    assert custom.transactional_id("export") == "billing/export"


@pytest.mark.parametrize(
    "run_key", ["x", "2013-01-05", "日付", 'a"b', "back\\slash", "new\nline", "tab\t", "]"]
)
def test_replay_reads_back_any_run_key(run_key: str) -> None:
    builder = ReplayBuilder("daily_flights")
    row = record(run_key=run_key, token=0)
    builder.add(*_msg(row), 0)
    assert dict(builder.build(1, fenced=True).records) == {run_key: row}
