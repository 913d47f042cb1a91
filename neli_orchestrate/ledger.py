"""Run ledger: who claimed, ran and finished each run of a role, fenced by Kafka transactions.

Usage (what ``singleton.py`` does once this member leads ``role``)::

    ledger = KafkaLedger(KafkaLedgerConfig(bootstrap_servers="127.0.0.1:9092"))
    writer = ledger.begin(role)            # init_transactions(): fences every earlier leader
    replay = writer.replay()               # read_committed, up to the high watermark
    latest = replay.latest(run_key)        # feed to neli_orchestrate.decision.decide(...)
    writer.write(record)                   # one committed transaction, or FencedError

The ledger is a compacted Kafka topic. One record per state change of a run:

- **key**: the UTF-8 JSON array ``["<role>","<run key>"]`` (:func:`encode_key`). JSON string
  quoting makes the pair unambiguous whatever characters either part holds, and the key stays
  readable in console tools. Compaction keeps the latest record per (role, run key).
- **value**: a JSON object with the schema version ``"v": 1`` (:class:`LedgerRecord`); ``null``
  (a tombstone) deletes the run key after its retention (:func:`expired_run_keys`).
- **partition**: every record of a role goes to partition ``crc32(role) % partitions``
  (:func:`role_partition`), so a role's history is one totally ordered log.

Fencing token: the token of a new claim is the read_committed end offset of the role's
partition, observed by the new leader *after* its ``init_transactions()`` and a replay that
reached the partition's high watermark as of that moment (:attr:`Replay.next_token`). Every
earlier leader's committed record sits at an offset below that end offset (its commit either
finished before the fence, or was aborted by it), and each record's token is at most its own
offset, so tokens of successive claims of a role strictly increase. Offsets are never reused,
so the rule survives compaction and tombstones. See ``docs/ledger.md``.

.. note:: The ledger does not decide anything; :mod:`neli_orchestrate.decision` does. Nor does
   it prove leadership: only the member that currently leads ``role`` may call :meth:`begin`,
   and the broker, not timing, makes every earlier writer's next write fail.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
import uuid
import warnings
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from neli_orchestrate.errors import ConfigError, FencedError, KafkaUnavailableError, NeliError

logger = logging.getLogger(__name__)

#: Schema version written into every ledger value as ``"v"``.
LEDGER_SCHEMA_VERSION = 1

DEFAULT_LEDGER_TOPIC = "neli.ledger"


class LedgerError(NeliError):
    """The ledger's contents break a rule the protocol relies on; read the message for the fix."""


class RunState(StrEnum):
    """State of one run (role, run key) in the ledger."""

    #: A leader decided to run and reserved the run; its executor is about to start.
    CLAIMED = "CLAIMED"
    #: The work is running under the claim's token, by a member that holds leadership.
    RUNNING = "RUNNING"
    #: The work finished and its output is committed. Terminal.
    COMPLETED = "COMPLETED"
    #: The work raised. Retried according to the decision policy.
    FAILED = "FAILED"


# Legal moves of one claim (same token). A new claim (new token) may follow any state; that is
# the decision table's business, not the record's.
_TRANSITIONS: Mapping[RunState, frozenset[RunState]] = MappingProxyType(
    {
        RunState.CLAIMED: frozenset({RunState.RUNNING, RunState.FAILED}),
        RunState.RUNNING: frozenset({RunState.COMPLETED, RunState.FAILED}),
        RunState.COMPLETED: frozenset(),
        RunState.FAILED: frozenset(),
    }
)

_STATES: Mapping[str, RunState] = MappingProxyType({s.value: s for s in RunState})


_NUMBERS = (int, float)
_INF = math.inf


def _check_text(name: str, value: object, *, empty_ok: bool = False) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    if not empty_ok and not value:
        raise ValueError(f"{name} must not be empty")


def _check_time(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")


def _check_count(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


@dataclass(frozen=True, slots=True)
class LedgerRecord:
    """One state change of a run: build it with :func:`neli_orchestrate.decision.claim_record`
    or :meth:`advance`, write it with :meth:`LedgerWriter.write`.

    ``at`` and ``handoff_deadline`` are wall-clock epoch seconds of the writer's host (other
    deployments compare them with their own clocks, allowing ``max_clock_error``).
    ``handoff_deadline`` is required for ``CLAIMED`` (until then another deployment waits for
    this claimant's executor) and optional for ``FAILED`` (until then the failing deployment
    retries first).
    """

    role: str
    run_key: str
    state: RunState
    token: int
    deployment: str
    member: str
    attempt: int
    at: float
    reason: str = ""
    handoff_deadline: float | None = None

    def __post_init__(self) -> None:
        # One combined test for the common, valid case keeps replays of large ledgers fast;
        # anything else goes through the checks that explain what is wrong.
        deadline = self.handoff_deadline
        if (
            type(self.role) is str and self.role
            and type(self.run_key) is str and self.run_key
            and type(self.state) is RunState
            and type(self.token) is int and self.token >= 0
            and type(self.deployment) is str and self.deployment
            and type(self.member) is str and self.member
            and type(self.attempt) is int and self.attempt >= 1
            and type(self.at) in _NUMBERS and -_INF < self.at < _INF
            and type(self.reason) is str
            and (
                (deadline is None and self.state is not RunState.CLAIMED)
                or (type(deadline) in _NUMBERS and -_INF < deadline < _INF)  # type: ignore[operator]
            )
        ):
            return
        self._explain()

    def _explain(self) -> None:
        _check_text("role", self.role)
        _check_text("run_key", self.run_key)
        if not isinstance(self.state, RunState):
            raise TypeError(f"state must be a RunState, got {self.state!r}")
        _check_count("token", self.token, 0)
        _check_text("deployment", self.deployment)
        _check_text("member", self.member)
        _check_count("attempt", self.attempt, 1)
        _check_time("at", self.at)
        _check_text("reason", self.reason, empty_ok=True)
        if self.handoff_deadline is not None:
            _check_time("handoff_deadline", self.handoff_deadline)
        elif self.state is RunState.CLAIMED:
            raise ValueError("a CLAIMED record needs a handoff_deadline")

    @property
    def key(self) -> bytes:
        """The Kafka message key of this record's run: :func:`encode_key` (role, run key)."""
        return encode_key(self.role, self.run_key)

    @property
    def terminal(self) -> bool:
        """True for ``COMPLETED``; whether a ``FAILED`` run is final depends on the policy."""
        return self.state is RunState.COMPLETED

    def encode(self) -> bytes:
        """The record as the UTF-8 JSON value written to the ledger topic."""
        value: dict[str, Any] = {
            "v": LEDGER_SCHEMA_VERSION,
            "role": self.role,
            "run_key": self.run_key,
            "state": self.state.value,
            "token": self.token,
            "deployment": self.deployment,
            "member": self.member,
            "attempt": self.attempt,
            "reason": self.reason,
            "at": self.at,
            "handoff_deadline": self.handoff_deadline,
        }
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    @classmethod
    def decode(
        cls, value: bytes | str, *, key: bytes | None = None, offset: int | None = None
    ) -> LedgerRecord | None:
        """Parse a ledger value; a malformed or unknown-version one logs a warning and gives None.

        A record that cannot be read is never taken as anything (least of all as completion),
        and never raises: one bad record must not stop every deployment's replay.
        ``key`` (the message key) is checked against the value's role and run key.
        """
        try:
            return parse_record(value, key=key)
        except MalformedRecordError as exc:
            where = f" at offset {offset}" if offset is not None else ""
            logger.warning("ignoring ledger record%s (key %r): %s", where, key, exc)
            return None

    def advance(
        self,
        state: RunState,
        *,
        at: float,
        member: str | None = None,
        reason: str = "",
        handoff_deadline: float | None = None,
    ) -> LedgerRecord:
        """The next record of the same claim (same token, attempt and deployment).

        Legal moves: ``CLAIMED -> RUNNING | FAILED`` and ``RUNNING -> COMPLETED | FAILED``.
        ``member`` is who writes it (the executor in split form); defaults to the claimant.
        """
        if state not in _TRANSITIONS[self.state]:
            raise ValueError(
                f"a {self.state} record of {self.role}/{self.run_key} cannot move to {state}"
            )
        return replace(
            self,
            state=state,
            at=at,
            member=self.member if member is None else member,
            reason=reason,
            handoff_deadline=handoff_deadline,
        )


class MalformedRecordError(LedgerError, ValueError):
    """A ledger value is not a valid record of a schema version this library reads."""


_FIELDS = ("role", "run_key", "state", "token", "deployment", "member", "attempt", "at")


def parse_record(value: bytes | str, *, key: bytes | None = None) -> LedgerRecord:
    """Parse a ledger value strictly; raises :class:`MalformedRecordError` saying what is wrong.

    Unknown extra fields are allowed (additive changes keep ``"v": 1``); a different ``"v"``
    is refused, because a newer writer may have changed what a field means.
    """
    expect = None if key is None else decode_key(key)
    if key is not None and expect is None:
        raise MalformedRecordError(f"message key {key!r} is not a ledger key")
    return _parse(value, expect)


_scan = json.JSONDecoder().scan_once


def _json(value: bytes | str) -> Any:
    """json.loads, with a fast path for the compact JSON this module writes."""
    text = value.decode("utf-8") if isinstance(value, bytes) else value
    try:
        data, end = _scan(text, 0)
        if end == len(text):
            return data
    except (StopIteration, ValueError):
        pass
    return json.loads(text)  # whitespace, trailing garbage: the full parser decides


def _parse(value: bytes | str, expect: tuple[str, str] | None) -> LedgerRecord:
    try:
        data = _json(value)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedRecordError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise MalformedRecordError(f"not a JSON object but {type(data).__name__}")
    version = data.get("v")
    if version != LEDGER_SCHEMA_VERSION or isinstance(version, bool):
        raise MalformedRecordError(
            f"unknown schema version v={version!r} (this library reads v={LEDGER_SCHEMA_VERSION};"
            " written by a newer neli_orchestrate? upgrade every deployment)"
        )
    try:
        state = _STATES.get(data["state"]) if isinstance(data["state"], str) else None
        if state is None:
            raise MalformedRecordError(f"unknown state {data['state']!r}")
        record = LedgerRecord(  # positional: the field order of LedgerRecord
            data["role"],
            data["run_key"],
            state,
            data["token"],
            data["deployment"],
            data["member"],
            data["attempt"],
            data["at"],
            data.get("reason", ""),
            data.get("handoff_deadline"),
        )
    except KeyError:
        missing = [name for name in _FIELDS if name not in data]
        raise MalformedRecordError(f"missing field(s) {', '.join(missing)}") from None
    except MalformedRecordError:
        raise
    except (TypeError, ValueError) as exc:
        raise MalformedRecordError(str(exc)) from None
    if expect is not None and (record.role, record.run_key) != expect:
        raise MalformedRecordError(
            f"value names {record.role!r}/{record.run_key!r} but the message key names"
            f" {expect[0]!r}/{expect[1]!r}"
        )
    return record


def encode_key(role: str, run_key: str) -> bytes:
    """Kafka key of a run: UTF-8 JSON ``["<role>","<run key>"]``, unambiguous for any text."""
    _check_text("role", role)
    _check_text("run_key", run_key)
    return json.dumps([role, run_key], ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def decode_key(key: bytes) -> tuple[str, str] | None:
    """(role, run key) of a ledger key, or None if it is not one."""
    try:
        data = json.loads(key)
    except (ValueError, UnicodeDecodeError):
        return None
    if (
        isinstance(data, list)
        and len(data) == 2
        and all(isinstance(part, str) and part for part in data)
    ):
        return data[0], data[1]
    return None


def role_key_prefix(role: str) -> bytes:
    """Bytes every ledger key of ``role`` starts with (JSON strings are prefix-free)."""
    _check_text("role", role)
    return json.dumps([role], ensure_ascii=False, separators=(",", ":"))[:-1].encode() + b","


def role_partition(role: str, partitions: int) -> int:
    """Ledger partition of ``role``: ``crc32(utf-8 role) % partitions``, the same in every process.

    (Python's ``hash()`` is salted per process and must never be used for this.)
    """
    _check_text("role", role)
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    return zlib.crc32(role.encode("utf-8")) % partitions


@dataclass(frozen=True)
class Replay:
    """The role's ledger as of one replay: the latest readable record of every run key.

    ``end_offset`` is the read_committed position the replay reached (at least the partition's
    high watermark when the replay started). ``fenced`` is True when the replay was taken
    through a :class:`LedgerWriter` after its fence; only then may ``end_offset`` serve as a
    token (:attr:`next_token`).
    """

    role: str
    records: Mapping[str, LedgerRecord]
    end_offset: int
    fenced: bool = False
    #: How many messages of this role were ignored (malformed or unknown version).
    ignored: int = 0
    #: Run keys whose newest message could not be read (an older readable one may be in
    #: ``records``); ``singleton`` may refuse to decide on them.
    unreadable: tuple[str, ...] = ()
    #: Highest token of any record of the role seen in this replay.
    max_token: int = -1

    def latest(self, run_key: str) -> LedgerRecord | None:
        """The latest readable record of ``run_key``, or None if there is none."""
        return self.records.get(run_key)

    @property
    def next_token(self) -> int:
        """Token for a claim written after this replay: the end offset, strictly above every token.

        Raises :class:`LedgerError` if this replay was not taken through a writer (tokens are
        only increasing when read after the fence), or if the end offset is not above every
        token already in the ledger (the topic was recreated or rewritten: tokens would go
        backwards, and token-checked sinks would refuse the work).
        """
        if not self.fenced:
            raise LedgerError(
                "a claim token needs a replay taken through LedgerWriter.replay() after begin();"
                " LedgerStore.replay() is for observers"
            )
        if self.end_offset <= self.max_token:
            raise LedgerError(
                f"ledger of role {self.role!r} ends at offset {self.end_offset} but already holds"
                f" token {self.max_token}: the ledger topic was recreated or rewritten, so new"
                " tokens would go backwards. Restore the topic, or reset the sinks' committed"
                " tokens deliberately before running again."
            )
        return self.end_offset


class ReplayBuilder:
    """Fold the raw messages of one partition, in offset order, into a :class:`Replay` of a role.

    Shared by :class:`KafkaLedger` and the simulator's store, so both apply the same key
    filter, codec and tombstone rules. Messages of other roles are skipped without decoding.
    """

    _MAX_WARNINGS = 10

    def __init__(self, role: str) -> None:
        self.role = role
        self._prefix = role_key_prefix(role)
        self._skip = len(self._prefix)
        self._records: dict[str, LedgerRecord] = {}
        self._unreadable: dict[str, None] = {}
        self._ignored = 0
        self._max_token = -1

    def add(self, key: bytes | None, value: bytes | None, offset: int) -> None:
        """Apply one message (``value`` None is a tombstone)."""
        if key is None or not key.startswith(self._prefix):
            return
        # Fast path: the run key's JSON string holds no escapes, so it is the raw bytes between
        # the quotes; anything else goes through the JSON parser.
        rest = key[self._skip:]
        if (
            rest[:1] == b'"' and rest[-2:] == b'"]' and b"\\" not in rest
            and rest.count(b'"') == 2 and len(rest) > 3
        ):
            try:
                parts: tuple[str, str] | None = (self.role, rest[1:-2].decode("utf-8"))
            except UnicodeDecodeError:
                parts = None
        else:
            parts = decode_key(key)
        if parts is None or parts[0] != self.role:
            self._ignore(key, offset, "key is not a ledger key")
            return
        run_key = parts[1]
        if value is None:
            self._records.pop(run_key, None)
            self._unreadable.pop(run_key, None)
            return
        try:
            record = _parse(value, parts)
        except MalformedRecordError as exc:
            self._ignore(key, offset, str(exc))
            self._unreadable[run_key] = None
            return
        if record.token > offset:
            # A claim's token is the end offset read before it was written, so it can never
            # exceed the record's own offset; this one was copied in from elsewhere.
            self._ignore(key, offset, f"token {record.token} above its own offset {offset}")
            self._unreadable[run_key] = None
            return
        self._records[run_key] = record
        self._unreadable.pop(run_key, None)
        if record.token > self._max_token:
            self._max_token = record.token

    def _ignore(self, key: bytes, offset: int, why: str) -> None:
        self._ignored += 1
        if self._ignored <= self._MAX_WARNINGS:
            logger.warning(
                "ignoring ledger record of role %r at offset %d (key %r): %s",
                self.role, offset, key, why,
            )

    def build(self, end_offset: int, *, fenced: bool) -> Replay:
        """The replay as of ``end_offset`` (the read_committed position reached)."""
        if self._ignored > self._MAX_WARNINGS:
            logger.warning(
                "ignored %d unreadable ledger records of role %r in total",
                self._ignored, self.role,
            )
        return Replay(
            role=self.role,
            records=MappingProxyType(dict(self._records)),
            end_offset=end_offset,
            fenced=fenced,
            ignored=self._ignored,
            unreadable=tuple(self._unreadable),
            max_token=self._max_token,
        )


def expired_run_keys(replay: Replay, older_than: float) -> list[str]:
    """Run keys to tombstone: latest record ``COMPLETED`` or ``FAILED`` and written before
    ``older_than`` (wall-clock epoch seconds).

    A ``CLAIMED`` or ``RUNNING`` run key is never expired, however old: its claim may still be
    live, and forgetting it would let a second deployment run it. An expired run key looks as
    if it never ran; choose a retention longer than any deployment may still schedule it
    (catch-up, backfills).
    """
    return [
        run_key
        for run_key, record in replay.records.items()
        if record.state in (RunState.COMPLETED, RunState.FAILED) and record.at < older_than
    ]


@runtime_checkable
class LedgerWriter(Protocol):
    """Write one role's ledger records, fenced and transactional; get it from ``begin(role)``.

    A writer stays valid until a newer :meth:`LedgerStore.begin` for the role fences it; from
    then on every write raises :class:`~neli_orchestrate.errors.FencedError` and the writer is
    dead (only a new ``begin`` after a new acquisition builds another).
    """

    @property
    def role(self) -> str:
        """The role this writer writes for."""
        ...

    def replay(self) -> Replay:
        """Replay the role read_committed to the high watermark, after the fence (tokens OK)."""
        ...

    def write(self, record: LedgerRecord) -> None:
        """Write ``record`` in one committed transaction; FencedError if a newer leader began.

        Raises :class:`~neli_orchestrate.errors.KafkaUnavailableError` when the cluster cannot
        be reached; the record may then have been written or not (replay after re-acquiring).
        """
        ...

    def tombstone(self, run_keys: Sequence[str]) -> None:
        """Delete ``run_keys`` of this role in one committed transaction (see :func:`expire`)."""
        ...

    def close(self) -> None:
        """Abort any open transaction and release the producer."""
        ...


@runtime_checkable
class LedgerStore(Protocol):
    """The I/O seam of the run ledger: :class:`KafkaLedger` in production, the simulator's store
    in ``neli_orchestrate.sim``."""

    def begin(self, role: str) -> LedgerWriter:
        """Fence every earlier writer of ``role`` (``init_transactions()``) and return a writer.

        Call only while leading ``role``, on every acquisition.
        """
        ...

    def replay(self, role: str) -> Replay:
        """Replay ``role`` read_committed to the high watermark, without fencing (observers)."""
        ...

    def close(self) -> None:
        """Release clients."""
        ...


def expire(writer: LedgerWriter, older_than: float) -> list[str]:
    """Tombstone the role's finished run keys older than ``older_than``; returns the run keys.

    Runs through the fenced writer, so a newer leader's begin makes it fail instead of deleting
    a run key that was just claimed again.
    """
    replay = writer.replay()
    run_keys = expired_run_keys(replay, older_than)
    if run_keys:
        writer.tombstone(run_keys)
        logger.info(
            "expired %d run keys of role %r older than %.0f", len(run_keys), writer.role, older_than
        )
    return run_keys


# --------------------------------------------------------------------------------------------
# Kafka implementation


_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

# Settings the ledger's correctness depends on; kafka_config may not override them.
_PROTECTED = frozenset(
    {
        "bootstrap.servers",
        "transactional.id",
        "transaction.timeout.ms",
        "enable.idempotence",
        "acks",
        "isolation.level",
        "group.id",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "enable.partition.eof",
    }
)


@dataclass(frozen=True)
class KafkaLedgerConfig:
    """Where the ledger lives and how long its operations may take.

    ``kafka_config`` carries client settings such as ``security.protocol`` and ``sasl.*``; the
    settings the ledger depends on (``transactional.id``, ``isolation.level``, ...) cannot be
    overridden there.
    """

    bootstrap_servers: str
    topic: str = DEFAULT_LEDGER_TOPIC
    #: Partitions of the ledger topic. Fixed for the topic's life: changing it would move roles
    #: to other partitions, away from their history. An existing topic must match.
    partitions: int = 1
    #: Replication factor used when creating the topic (None: the broker's default).
    replication_factor: int | None = None
    #: ``transactional.id`` = prefix + role; None means ``"<topic>:"``. Every deployment of the
    #: same ledger must use the same prefix, or leaders will not fence each other.
    transactional_id_prefix: str | None = None
    kafka_config: Mapping[str, Any] = field(default_factory=dict)
    #: Extra topic configs at creation (``cleanup.policy=compact`` is always set;
    #: ``segment.ms`` defaults to one hour so compaction can reach recent records).
    topic_config: Mapping[str, str] = field(default_factory=dict)
    create_topic: bool = True
    #: Seconds a replay may take before KafkaUnavailableError. A writer that died inside a
    #: transaction holds the last stable offset of its partition until a newer leader of its
    #: role fences it or ``transaction_timeout`` passes.
    replay_timeout: float = 30.0
    #: ``transaction.timeout.ms`` of the writers, in seconds.
    transaction_timeout: float = 10.0
    #: Seconds for init_transactions, commit and admin requests.
    request_timeout: float = 10.0

    def __post_init__(self) -> None:
        if not isinstance(self.bootstrap_servers, str) or not self.bootstrap_servers.strip():
            raise ConfigError("bootstrap_servers must be a non-empty 'host:port[,host:port]'")
        if not isinstance(self.topic, str) or not _TOPIC_NAME.match(self.topic):
            raise ConfigError(
                f"topic {self.topic!r} is not a legal Kafka topic name ([A-Za-z0-9._-], 1-249)"
            )
        if isinstance(self.partitions, bool) or not isinstance(self.partitions, int) or (
            self.partitions < 1
        ):
            raise ConfigError(f"partitions must be an integer >= 1, got {self.partitions!r}")
        if self.replication_factor is not None and self.replication_factor < 1:
            raise ConfigError(
                f"replication_factor must be >= 1 or None, got {self.replication_factor}"
            )
        for name in ("replay_timeout", "transaction_timeout", "request_timeout"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not value > 0 or not math.isfinite(value):
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        overridden = sorted(_PROTECTED & set(self.kafka_config))
        if overridden:
            raise ConfigError(
                f"kafka_config may not set {', '.join(overridden)}: the ledger manages these"
                " (use bootstrap_servers / transaction_timeout fields instead)"
            )
        if self.topic_config.get("cleanup.policy", "compact") != "compact":
            raise ConfigError("topic_config cleanup.policy must be 'compact' for the ledger")

    @property
    def prefix(self) -> str:
        """The effective ``transactional.id`` prefix."""
        if self.transactional_id_prefix is None:
            return f"{self.topic}:"
        return self.transactional_id_prefix

    def transactional_id(self, role: str) -> str:
        """``transactional.id`` of ``role``'s writers, identical in every deployment."""
        return self.prefix + role


def _kafka() -> Any:
    import confluent_kafka
    import confluent_kafka.admin  # noqa: F401 - the submodule is not imported by the package

    return confluent_kafka


def _fencing_codes() -> frozenset[int]:
    error = _kafka().KafkaError
    return frozenset({error._FENCED, error.PRODUCER_FENCED, error.INVALID_PRODUCER_EPOCH})


def _transient_codes() -> frozenset[int]:
    error = _kafka().KafkaError
    return frozenset({
        error.NOT_LEADER_FOR_PARTITION, error.LEADER_NOT_AVAILABLE,
        error.UNKNOWN_TOPIC_OR_PART, error.REQUEST_TIMED_OUT, error._TRANSPORT,
        error._TIMED_OUT, error.NOT_COORDINATOR, error.COORDINATOR_LOAD_IN_PROGRESS,
    })


def _kafka_error(exc: BaseException) -> Any:
    """The KafkaError inside a KafkaException (or None)."""
    args = getattr(exc, "args", ())
    if args and hasattr(args[0], "code"):
        return args[0]
    return None


class KafkaLedger:
    """The run ledger on a compacted Kafka topic, written through per-role transactional producers.

    Thread-safe: replays are serialized on one read_committed consumer; each writer is used by
    one thread at a time.
    """

    def __init__(self, config: KafkaLedgerConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._admin: Any = None
        self._consumer: Any = None
        self._partitions: int | None = None
        self._closed = False

    # -- set-up ---------------------------------------------------------------------------

    def _client_config(self) -> dict[str, Any]:
        conf: dict[str, Any] = dict(self.config.kafka_config)
        conf["bootstrap.servers"] = self.config.bootstrap_servers
        conf.setdefault("logger", logging.getLogger(__name__ + ".librdkafka"))
        return conf

    def _ensure_ready(self) -> int:
        """Create/check the topic once; returns its partition count."""
        if self._closed:
            raise LedgerError("the ledger was closed")
        if self._partitions is not None:
            return self._partitions
        admin = self._admin
        if admin is None:
            admin = self._admin = _kafka().admin.AdminClient(self._client_config())
        partitions = self._topic_partitions(admin)
        if partitions is None:
            if not self.config.create_topic:
                raise KafkaUnavailableError(
                    f"ledger topic {self.config.topic!r} does not exist and create_topic=False;"
                    f" create it with cleanup.policy=compact and {self.config.partitions}"
                    " partition(s)"
                )
            self._create_topic(admin)
            partitions = self.config.partitions
        elif partitions != self.config.partitions:
            raise ConfigError(
                f"ledger topic {self.config.topic!r} has {partitions} partitions but the config"
                f" says partitions={self.config.partitions}; roles map to partitions by"
                " crc32(role) % partitions, so set partitions to the topic's count (never add"
                " partitions to a ledger topic)"
            )
        self._check_cleanup_policy(admin)
        self._partitions = partitions
        return partitions

    def _topic_partitions(self, admin: Any) -> int | None:
        try:
            metadata = admin.list_topics(
                topic=self.config.topic, timeout=self.config.request_timeout
            )
        except _kafka().KafkaException as exc:
            raise KafkaUnavailableError(
                f"cannot read metadata of ledger topic {self.config.topic!r} from"
                f" {self.config.bootstrap_servers}: {exc}"
            ) from exc
        topic = metadata.topics.get(self.config.topic)
        if topic is None or topic.error is not None:
            code = topic.error.code() if topic is not None and topic.error is not None else None
            if code == _kafka().KafkaError.TOPIC_AUTHORIZATION_FAILED:
                raise KafkaUnavailableError(
                    f"not authorized to describe ledger topic {self.config.topic!r}: grant the"
                    " principal DESCRIBE, READ and WRITE on it"
                )
            return None
        return len(topic.partitions)

    def _create_topic(self, admin: Any) -> None:
        ck = _kafka()
        # Kafka never compacts the active segment; rolling it hourly (instead of weekly) keeps
        # the uncompacted tail, which every replay decodes in full, small.
        topic_config = {"cleanup.policy": "compact", "segment.ms": "3600000",
                        **self.config.topic_config}
        new_topic = ck.admin.NewTopic(
            self.config.topic,
            num_partitions=self.config.partitions,
            replication_factor=self.config.replication_factor or -1,
            config=topic_config,
        )
        future = admin.create_topics(
            [new_topic], operation_timeout=self.config.request_timeout
        )[self.config.topic]
        try:
            future.result(timeout=self.config.request_timeout * 2)
            logger.info(
                "created ledger topic %r (%d partitions, compacted)",
                self.config.topic, self.config.partitions,
            )
        except ck.KafkaException as exc:
            err = _kafka_error(exc)
            code = err.code() if err is not None else None
            if code == ck.KafkaError.TOPIC_ALREADY_EXISTS:
                return  # another deployment created it first; its partition count is checked
            if code in (
                ck.KafkaError.TOPIC_AUTHORIZATION_FAILED,
                ck.KafkaError.CLUSTER_AUTHORIZATION_FAILED,
                ck.KafkaError.POLICY_VIOLATION,
            ):
                raise KafkaUnavailableError(
                    f"not allowed to create ledger topic {self.config.topic!r} ({exc}); create it"
                    f" yourself with cleanup.policy=compact and {self.config.partitions}"
                    " partition(s), or grant CREATE"
                ) from exc
            raise KafkaUnavailableError(
                f"creating ledger topic {self.config.topic!r} failed: {exc}"
            ) from exc
        # Verify the topic is visible before the first replay relies on its metadata.
        deadline = time.monotonic() + self.config.request_timeout
        while self._topic_partitions(admin) is None:
            if time.monotonic() > deadline:
                raise KafkaUnavailableError(
                    f"ledger topic {self.config.topic!r} was created but never became visible"
                )
            time.sleep(0.05)

    def _check_cleanup_policy(self, admin: Any) -> None:
        ck = _kafka()
        resource = ck.admin.ConfigResource(ck.admin.ResourceType.TOPIC, self.config.topic)
        try:
            configs = admin.describe_configs(
                [resource], request_timeout=self.config.request_timeout
            )[resource].result(timeout=self.config.request_timeout * 2)
        except ck.KafkaException as exc:
            # Reading configs needs DESCRIBE_CONFIGS; without it we cannot verify, only warn.
            logger.warning(
                "cannot verify cleanup.policy of ledger topic %r: %s", self.config.topic, exc
            )
            return
        entry = configs.get("cleanup.policy")
        policy = entry.value if entry is not None else None
        if policy is not None and "compact" not in policy.split(","):
            raise ConfigError(
                f"ledger topic {self.config.topic!r} has cleanup.policy={policy}; it must be"
                " 'compact', or completed runs are deleted by retention and would run again"
            )
        if policy is not None and "delete" in policy.split(","):
            logger.warning(
                "ledger topic %r has cleanup.policy=%s: retention deletes completed runs too",
                self.config.topic, policy,
            )

    def partition_for(self, role: str) -> int:
        """The ledger partition holding ``role``'s records."""
        return role_partition(role, self._ensure_ready())

    # -- LedgerStore ------------------------------------------------------------------------

    def begin(self, role: str) -> KafkaLedgerWriter:
        """Create ``role``'s transactional producer and ``init_transactions()`` (fences earlier)."""
        with self._lock:
            partition = role_partition(role, self._ensure_ready())
        ck = _kafka()
        conf = self._client_config()
        conf.update(
            {
                "transactional.id": self.config.transactional_id(role),
                "transaction.timeout.ms": int(self.config.transaction_timeout * 1000),
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 0,
            }
        )
        producer = ck.Producer(conf)
        try:
            producer.init_transactions(self.config.request_timeout)
        except ck.KafkaException as exc:
            err = _kafka_error(exc)
            _close_quietly(producer)
            hint = ""
            denied = ck.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            if err is not None and err.code() == denied:
                hint = (
                    f"; grant WRITE and DESCRIBE on transactional id"
                    f" {self.config.transactional_id(role)!r}"
                )
            raise KafkaUnavailableError(
                f"init_transactions for role {role!r} failed: {exc}{hint}"
            ) from exc
        logger.debug("began ledger writer for role %r (partition %d)", role, partition)
        return KafkaLedgerWriter(self, role, partition, producer)

    def replay(self, role: str) -> Replay:
        """Replay ``role`` read_committed up to the high watermark (no fence; not for tokens)."""
        return self._replay(role, fenced=False)

    def _replay(self, role: str, *, fenced: bool) -> Replay:
        ck = _kafka()
        with self._lock:
            partition = role_partition(role, self._ensure_ready())
            tp = ck.TopicPartition(self.config.topic, partition)
            deadline = time.monotonic() + self.config.replay_timeout
            high = self._high_watermark(tp)
            builder = ReplayBuilder(role)
            if high == 0:
                return builder.build(0, fenced=fenced)
            consumer = self._replay_consumer()
            # Offset 0 rather than OFFSET_BEGINNING saves a ListOffsets round trip; compaction
            # never moves the log start, and auto.offset.reset=earliest covers deleted records.
            consumer.assign([ck.TopicPartition(self.config.topic, partition, 0)])
            position = eof = -1
            try:
                while True:
                    # consume() waits for a full batch or the timeout: keep the timeout short.
                    for message in consumer.consume(num_messages=10000, timeout=0.005):
                        error = message.error()
                        if error is not None:
                            if error.code() == ck.KafkaError._PARTITION_EOF:
                                eof = max(eof, message.offset())
                                continue
                            if (error.retriable() or error.code() in _transient_codes()) and (
                                not error.fatal()
                            ):
                                logger.debug("replay of %r: %s (retrying)", role, error)
                                continue  # bounded by the replay deadline below
                            raise KafkaUnavailableError(
                                f"replaying ledger partition {partition}: {error}"
                            )
                        builder.add(message.key(), message.value(), message.offset())
                    # The position moves past transaction markers too, so it reaches the high
                    # watermark once every transaction open at the start has ended.
                    position = max(consumer.position([tp])[0].offset, eof)
                    if position >= high:
                        break
                    if time.monotonic() > deadline:
                        raise KafkaUnavailableError(
                            f"replay of role {role!r} stuck at offset {position} of ledger"
                            f" partition {self.config.topic}[{partition}], below the high"
                            f" watermark {high}: an open transaction holds the last stable"
                            " offset (a writer that died mid-transaction blocks until a newer"
                            " leader of its role fences it or transaction_timeout passes)"
                        )
            finally:
                consumer.unassign()
            return builder.build(position, fenced=fenced)

    def _high_watermark(self, tp: Any) -> int:
        ck = _kafka()
        spec = ck.admin.OffsetSpec.latest()
        deadline = time.monotonic() + self.config.request_timeout
        while True:
            try:
                result = self._admin.list_offsets(
                    {tp: spec},
                    isolation_level=ck.IsolationLevel.READ_UNCOMMITTED,
                    request_timeout=self.config.request_timeout,
                )[tp].result(timeout=self.config.request_timeout * 2)
                return int(result.offset)
            except ck.KafkaException as exc:
                err = _kafka_error(exc)
                # A partition just created, or moving between brokers, has no leader for a
                # moment; the admin API reports that as not retriable, but it is.
                if err is not None and (err.retriable() or err.code() in _transient_codes()) and (
                    time.monotonic() < deadline
                ):
                    time.sleep(0.05)
                    continue
                raise KafkaUnavailableError(
                    f"cannot read the high watermark of ledger partition"
                    f" {tp.topic}[{tp.partition}]: {exc}"
                ) from exc

    def _replay_consumer(self) -> Any:
        if self._consumer is None:
            conf = self._client_config()
            conf.update(
                {
                    "group.id": f"neli-ledger-replay-{uuid.uuid4().hex}",  # never joins a group
                    "isolation.level": "read_committed",
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "enable.partition.eof": True,
                    "auto.offset.reset": "earliest",
                    "fetch.wait.max.ms": 10,
                    "fetch.max.bytes": 64 * 1024 * 1024,
                    "max.partition.fetch.bytes": 16 * 1024 * 1024,
                }
            )
            self._consumer = _kafka().Consumer(conf)
        return self._consumer

    def close(self) -> None:
        """Close the replay consumer; writers are closed by their owners."""
        with self._lock:
            self._closed = True
            if self._consumer is not None:
                try:
                    self._consumer.close()
                except Exception as exc:  # noqa: BLE001 - closing must not mask the caller's error
                    logger.debug("closing ledger replay consumer: %s", exc)
                self._consumer = None
            self._admin = None

    def __enter__(self) -> KafkaLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close_quietly(producer: Any) -> None:
    # A fenced producer raises (or warns about) its fatal error when closed; that error was
    # already reported as FencedError, so here it is only noise.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            close = getattr(producer, "close", None)
            if close is not None:
                close()
            else:
                producer.flush(0)
        except Exception as exc:  # noqa: BLE001
            logger.debug("closing ledger producer: %s", exc)


class KafkaLedgerWriter:
    """The transactional producer of one role, valid until a newer ``begin`` fences it."""

    def __init__(self, ledger: KafkaLedger, role: str, partition: int, producer: Any) -> None:
        self._ledger = ledger
        self._role = role
        self.partition = partition
        self.transactional_id = ledger.config.transactional_id(role)
        self._producer: Any = producer
        self._dead: str | None = None

    @property
    def role(self) -> str:
        return self._role

    @property
    def fenced(self) -> bool:
        """True once a write failed because a newer leader's begin fenced this writer."""
        return self._dead == "fenced"

    def replay(self) -> Replay:
        """Replay the role after this writer's fence; its ``next_token`` may be used for claims."""
        self._check_usable(None)
        return self._ledger._replay(self._role, fenced=True)

    def write(self, record: LedgerRecord) -> None:
        """Write one record in one committed transaction."""
        if record.role != self._role:
            raise ValueError(f"writer of role {self._role!r} cannot write {record.role!r}")
        self._transaction([(record.key, record.encode())], token=record.token)

    def tombstone(self, run_keys: Sequence[str]) -> None:
        """Delete ``run_keys`` (tombstones) in one committed transaction."""
        if run_keys:
            self._transaction([(encode_key(self._role, k), None) for k in run_keys], token=None)

    def _check_usable(self, token: int | None) -> None:
        if self._dead == "fenced":
            raise FencedError(
                f"the ledger writer of role {self._role!r} was fenced by a newer leader",
                role=self._role, token=token,
            )
        if self._dead is not None:
            raise KafkaUnavailableError(
                f"the ledger writer of role {self._role!r} is unusable ({self._dead});"
                " re-acquire leadership and begin() again"
            )

    def _transaction(
        self, messages: Iterable[tuple[bytes, bytes | None]], token: int | None
    ) -> None:
        self._check_usable(token)
        ck = _kafka()
        producer = self._producer
        topic = self._ledger.config.topic
        timeout = self._ledger.config.request_timeout
        try:
            producer.begin_transaction()
            for key, value in messages:
                producer.produce(topic, key=key, value=value, partition=self.partition)
            deadline = time.monotonic() + timeout
            while True:
                try:
                    producer.commit_transaction(max(0.1, deadline - time.monotonic()))
                    return
                except ck.KafkaException as exc:
                    err = _kafka_error(exc)
                    if (
                        err is not None
                        and err.retriable()
                        and not err.fatal()
                        and not err.txn_requires_abort()
                        and time.monotonic() < deadline
                    ):
                        continue  # commit_transaction may be retried after a retriable error
                    raise
        except ck.KafkaException as exc:
            self._fail(exc, token)
        except BufferError as exc:
            self._abort()
            raise KafkaUnavailableError(f"ledger producer queue full: {exc}") from exc

    def _fail(self, exc: BaseException, token: int | None) -> None:
        err = _kafka_error(exc)
        if err is not None and err.code() in _fencing_codes():
            self._dead = "fenced"
            _close_quietly(self._producer)
            raise FencedError(
                f"ledger write for role {self._role!r} refused: a newer leader called"
                f" init_transactions() ({err.name()})",
                role=self._role, token=token,
            ) from exc
        if err is not None and err.fatal():
            self._dead = f"fatal error {err.name()}"
            _close_quietly(self._producer)
            raise KafkaUnavailableError(
                f"ledger writer of role {self._role!r} hit a fatal error: {err}"
            ) from exc
        if err is not None and err.txn_requires_abort():
            self._abort()
            raise KafkaUnavailableError(
                f"ledger write for role {self._role!r} was aborted, nothing written: {err}"
            ) from exc
        # Timed out without a definite answer: the commit may still land. Only a new begin()
        # (whose init_transactions settles the transaction) may write for this role again.
        self._dead = f"unknown outcome of a commit ({exc})"
        _close_quietly(self._producer)
        raise KafkaUnavailableError(
            f"ledger write for role {self._role!r} has an unknown outcome: {exc}; re-acquire"
            " leadership, begin() and replay before deciding again"
        ) from exc

    def _abort(self) -> None:
        try:
            self._producer.abort_transaction(self._ledger.config.request_timeout)
        except Exception as exc:  # noqa: BLE001 - if abort fails the producer is unusable
            self._dead = f"abort failed ({exc})"
            _close_quietly(self._producer)

    def close(self) -> None:
        """Abort any open transaction and close the producer."""
        if self._dead is None:
            self._dead = "closed"
            _close_quietly(self._producer)
