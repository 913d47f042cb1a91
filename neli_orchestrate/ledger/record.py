"""A ledger record and its wire form: states, the JSON value, the key, the partition of a role."""

from __future__ import annotations

import json
import logging
import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from neli_orchestrate.errors import NeliError

logger = logging.getLogger(__name__)


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
    #: An operator reset a finished run (``Singleton.reset``, audited with a reason): the
    #: decision table treats it as no record, so the next leader runs it again, attempt 1.
    #: It carries a new token like a claim, so tokens keep growing. Readers before this state
    #: existed treat it as an unreadable record: upgrade every deployment before resetting.
    RESET = "RESET"


# Legal moves of one claim (same token). A new claim (new token) may follow any state; that is
# the decision table's business, not the record's.
_TRANSITIONS: Mapping[RunState, frozenset[RunState]] = MappingProxyType(
    {
        RunState.CLAIMED: frozenset({RunState.RUNNING, RunState.FAILED}),
        # RUNNING -> RUNNING: the try names what it started, or that an earlier try's
        # application is stopped (Run.record_application, Run.record_stopped).
        RunState.RUNNING: frozenset({RunState.RUNNING, RunState.COMPLETED, RunState.FAILED}),
        RunState.COMPLETED: frozenset(),
        RunState.FAILED: frozenset(),
        RunState.RESET: frozenset(),
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
    #: Remote applications that may still be running (e.g. ``standalone application
    #: driver-… on spark://…``): on ``FAILED``, also the one the failed try could not confirm
    #: stopped; on a later claim, carried from the record it replaced (earlier tokens'
    #: applications nobody confirmed stopped) until a try of this claim confirms each stopped.
    #: Empty otherwise; written only when set, as a JSON list (readers before it ignore it).
    unstopped: tuple[str, ...] = ()
    #: The remote application this claim's try submitted (``RUNNING`` and after), named as soon
    #: as the submission returned its id, so that a successor can stop it if this try dies.
    application: str = ""
    #: Where this record sits in the role's ledger partition, when it was read from the
    #: ledger (a replay sets it; None on a record built here and not read back). Not part of
    #: the record's value or its equality: OpenLineage's ``neli`` facet reports it.
    offset: int | None = field(default=None, compare=False, repr=False)

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
            and type(self.unstopped) is tuple
            and (not self.unstopped or _names(self.unstopped))
            and type(self.application) is str
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
        if not isinstance(self.unstopped, tuple) or not _names(self.unstopped):
            raise ValueError(f"unstopped must be a tuple of non-empty strings, got "
                             f"{self.unstopped!r}")
        _check_text("application", self.application, empty_ok=True)
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

    def describe(self) -> str:
        """One log line about this record: state, who, when, token, and why.

        The one description every integration logs (gate, singleton, Dagster resource), e.g.
        ``COMPLETED by deployment 'us-east-1' (member m1) at 2013-01-05T06:00:00Z with token
        42``.
        """
        text = (
            f"{self.state.value} by deployment {self.deployment!r} (member {self.member}) at "
            f"{format_epoch(self.at)} with token {self.token}"
        )
        if self.state is RunState.CLAIMED and self.handoff_deadline is not None:
            text += f", claim live until {format_epoch(self.handoff_deadline)}"
        if self.reason:
            text += f" (reason: {self.reason})"
        if self.application and self.application not in self.unstopped:
            text += f"; submitted {self.application}"
        if self.unstopped:
            text += f"; {', '.join(self.unstopped)} may still be running"
        return text

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
        if self.unstopped:
            value["unstopped"] = list(self.unstopped)
        if self.application:
            value["application"] = self.application
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
        unstopped: tuple[str, ...] | None = None,
        application: str | None = None,
    ) -> LedgerRecord:
        """The next record of the same claim (same token, attempt and deployment).

        Legal moves: ``CLAIMED -> RUNNING | FAILED`` and ``RUNNING -> RUNNING | COMPLETED |
        FAILED`` (``RUNNING -> RUNNING`` names what the try started, or clears ``unstopped``).
        ``member`` is who writes it (the executor in split form); defaults to the claimant.
        ``unstopped`` and ``application``: None keeps this record's; ``application`` only from
        ``RUNNING`` on.
        """
        if application and state is RunState.CLAIMED:
            raise ValueError("a CLAIMED record names no application: nothing was submitted yet")
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
            unstopped=self.unstopped if unstopped is None else unstopped,
            application=self.application if application is None else application,
            offset=None,  # a new record: not in the ledger until written and read back
        )


def format_epoch(at: float | None) -> str:
    """Render a ledger timestamp (epoch seconds) as ISO-8601 UTC, e.g. ``2013-01-05T06:00:00Z``."""
    if at is None:
        return "an unknown time"
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
            _applications(data.get("unstopped")),
            data.get("application", ""),
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


def _names(values: tuple[object, ...]) -> bool:
    return all(type(v) is str and v.strip() for v in values)


def _applications(value: object) -> tuple[str, ...]:
    """The ``unstopped`` field as written: absent, a list of names (or one name, as the
    first writers of the field wrote it); anything else is left to the record's check."""
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, list) else value  # type: ignore[return-value]


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

