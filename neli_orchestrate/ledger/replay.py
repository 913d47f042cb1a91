"""Folding a role's ledger messages into the latest record of every run key, and the token rule."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from neli_orchestrate.errors import UnreadableRecordError
from neli_orchestrate.ledger.record import (
    LedgerError,
    LedgerRecord,
    MalformedRecordError,
    RunState,
    _parse,
    decode_key,
    role_key_prefix,
)

logger = logging.getLogger(__name__)


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
    #: ``records``): :meth:`latest` refuses them.
    unreadable: tuple[str, ...] = ()
    #: Highest token of any record of the role seen in this replay.
    max_token: int = -1
    #: For each run key in ``unreadable``: the offset of its newest message and why it could
    #: not be read.
    unreadable_at: Mapping[str, tuple[int, str]] = field(
        default_factory=lambda: MappingProxyType({}))

    def latest(self, run_key: str) -> LedgerRecord | None:
        """The latest record of ``run_key``, or None if it has none.

        Raises :class:`~neli_orchestrate.errors.UnreadableRecordError` if the run key's newest
        record cannot be read (a newer schema version, corruption, a token above its offset):
        deciding from the older record before it could run a completed run again, or take
        over a live claim. Observers that want the older record read :attr:`records`.
        """
        problem = self.unreadable_at.get(run_key)
        if problem is not None:
            offset, why = problem
            raise UnreadableRecordError(
                f"the newest ledger record of run {run_key!r} (role {self.role!r}) is at offset"
                f" {offset} of the role's ledger partition and cannot be read ({why}); no"
                " deployment decides from an older record. Fix: if a newer neli-orchestrate"
                " wrote it, upgrade this deployment; if it is corrupt or was copied in, check"
                " whether the run happened, then have the role's leader tombstone the run key"
                " (LedgerWriter.tombstone: it runs again) or leave it until one is written",
                role=self.role, run_key=run_key, offset=offset)
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


@dataclass(frozen=True)
class FoldState:
    """A :class:`ReplayBuilder`'s fold of one role, to resume from (see ``ledger/cache.py``)."""

    role: str
    records: Mapping[str, LedgerRecord]
    #: The encoded value of each record, as read from the ledger.
    values: Mapping[str, bytes]
    unreadable: Mapping[str, tuple[int, str]]
    ignored: int
    max_token: int


class ReplayBuilder:
    """Fold the raw messages of one partition, in offset order, into a :class:`Replay` of a role.

    Shared by :class:`KafkaLedger` and the simulator's store, so both apply the same key
    filter, codec and tombstone rules. Messages of other roles are skipped without decoding.
    """

    _MAX_WARNINGS = 10

    def __init__(self, role: str, state: FoldState | None = None) -> None:
        self.role = role
        self._prefix = role_key_prefix(role)
        self._skip = len(self._prefix)
        self._records: dict[str, LedgerRecord] = {}
        #: The encoded value of every record in ``_records`` (what a checkpoint stores).
        self._values: dict[str, bytes] = {}
        self._unreadable: dict[str, tuple[int, str]] = {}
        self._ignored = 0
        self._max_token = -1
        if state is not None:
            # Copies: a fold that fails half-way must not change the checkpoint it began from.
            if state.role != role:
                raise ValueError(f"fold state of role {state.role!r} cannot resume {role!r}")
            self._records = dict(state.records)
            self._values = dict(state.values)
            self._unreadable = dict(state.unreadable)
            self._ignored = state.ignored
            self._max_token = state.max_token

    def state(self) -> FoldState:
        """The fold so far, to continue later from the offset it reached (a replay cache)."""
        return FoldState(self.role, MappingProxyType(dict(self._records)),
                         MappingProxyType(dict(self._values)),
                         MappingProxyType(dict(self._unreadable)), self._ignored,
                         self._max_token)

    def raise_token_floor(self, token: int) -> None:
        """Tokens up to ``token`` were issued before (by an earlier incarnation of the topic):
        :attr:`Replay.next_token` refuses an end offset that does not exceed it."""
        self._max_token = max(self._max_token, token)

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
            self._values.pop(run_key, None)
            self._unreadable.pop(run_key, None)
            return
        try:
            record = _parse(value, parts)
        except MalformedRecordError as exc:
            self._ignore(key, offset, str(exc))
            self._unreadable[run_key] = (offset, str(exc))
            return
        if record.token > offset:
            # A claim's token is the end offset read before it was written, so it can never
            # exceed the record's own offset; this one was copied in from elsewhere.
            why = f"token {record.token} above its own offset {offset}"
            self._ignore(key, offset, why)
            self._unreadable[run_key] = (offset, why)
            return
        object.__setattr__(record, "offset", offset)  # frozen; set once, right after parsing
        self._records[run_key] = record
        self._values[run_key] = value
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
            unreadable_at=MappingProxyType(dict(self._unreadable)),
        )


def expired_run_keys(replay: Replay, older_than: float) -> list[str]:
    """Run keys to tombstone: latest record ``COMPLETED``, ``FAILED`` or ``RESET``, written before
    ``older_than`` (wall-clock epoch seconds).

    A ``CLAIMED`` or ``RUNNING`` run key is never expired, however old: its claim may still be
    live, and forgetting it would let a second deployment run it. An expired run key looks as
    if it never ran; choose a retention longer than any deployment may still schedule it
    (catch-up, backfills).
    """
    return [
        run_key
        for run_key, record in replay.records.items()
        if record.state in _EXPIRABLE and record.at < older_than
    ]


#: Finished states; a RESET run key already reads as "no record", so expiring it is safe too.
_EXPIRABLE = frozenset({RunState.COMPLETED, RunState.FAILED, RunState.RESET})

