"""The ledger seam (:class:`~neli_orchestrate.ledger.store.LedgerStore`) over the simulated broker.

The same contract as :class:`~neli_orchestrate.ledger.kafka.KafkaLedger`: ``begin`` fences earlier
writers of the role (``init_transactions``), replays are read_committed up to the high
watermark and fold the messages with the real :class:`~neli_orchestrate.ledger.replay.ReplayBuilder`
(key filter, codec, tombstones, token rule), and a write by a fenced writer raises
:class:`~neli_orchestrate.errors.FencedError`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from integration.sim.broker import COMMITTED, DATA, Broker, Fenced
from integration.sim.kernel import Proc, SimCrash
from neli_orchestrate.errors import FencedError, KafkaUnavailableError
from neli_orchestrate.ledger.cache import Checkpoint, end_is_known, refusal
from neli_orchestrate.ledger.record import LedgerRecord, encode_key, role_partition
from neli_orchestrate.ledger.replay import Replay, ReplayBuilder


def _stable_high_watermark(log: Any, role: str) -> int:
    """The partition's high watermark, once no open transaction holds a replay below it.

    A real replay would wait for the open transaction; here it ends in a timeout and the
    caller retries, as it would after ``replay_timeout``.
    """
    high: int = log.high_watermark
    if log.last_stable_offset < high:
        raise KafkaUnavailableError(
            f"replay of {role!r} blocked at offset {log.last_stable_offset} below the high"
            f" watermark {high} by an open transaction"
        )
    return high


class ReplayCache:
    """Folds each role's committed messages once; later replays continue where it stopped.

    Equivalent to replaying from offset 0 every time (entries below the last stable offset
    never change), only cheaper, which keeps 10,000 seeds fast.
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._folds: dict[str, tuple[ReplayBuilder, int]] = {}

    def replay(self, role: str, partition: int, *, fenced: bool) -> Replay:
        log = self.broker.logs[partition]
        high = _stable_high_watermark(log, role)
        builder, start = self._folds.get(role) or (ReplayBuilder(role), 0)
        for entry in log.entries[start:high]:
            if entry.kind == DATA and entry.status == COMMITTED:
                builder.add(entry.key, entry.value, entry.offset)
        self._folds[role] = (builder, high)
        return builder.build(high, fenced=fenced)


class HostCache:
    """One host's replay checkpoints (what the per-host cache files are), shared by every
    process a deployment starts there and surviving their crashes.

    Continues a checkpoint through the real :func:`~neli_orchestrate.ledger.cache.refusal` and
    :class:`ReplayBuilder` resume, reading only the log above it (holes left by compaction
    included). ``trust_stale`` is the ``stale_replay_cache`` mutation: a checkpoint is taken
    as the whole ledger, without reading what was written since.
    """

    #: The simulated topic's delete.retention.ms, in seconds (no tombstones are written).
    RETENTION = 86400.0

    def __init__(self, broker: Broker, stats: Any, *, trust_stale: bool = False,
                 take_invalid_end: bool = False) -> None:
        self.broker = broker
        self.stats = stats
        self.trust_stale = trust_stale
        self.take_invalid_end = take_invalid_end
        self._checkpoints: dict[str, Checkpoint] = {}

    def replay(self, role: str, partition: int, *, fenced: bool) -> Replay:
        log = self.broker.logs[partition]
        now = self.broker.kernel.now / 1000
        checkpoint = self._checkpoints.get(role)
        # KafkaLedger._end_offset: the end is an offset, or the replay waits for one; here it
        # fails at once and the caller retries, as after replay_timeout.
        end = self.broker.end_offset(partition)
        if not end_is_known(end):
            self.stats.note("replay met an unknown end offset")
            if self.take_invalid_end:
                return self._defect_of_issue_31(role, partition, checkpoint, end, now,
                                                fenced=fenced)
            raise KafkaUnavailableError(
                f"replay of {role!r}: ledger partition {partition} answered end offset {end},"
                " which is not an offset (its leader is changing)")
        high = _stable_high_watermark(log, role)
        builder, start = ReplayBuilder(role), 0
        if checkpoint is not None:
            if self.trust_stale:
                return ReplayBuilder(role, checkpoint.state).build(high, fenced=fenced)
            why = refusal(checkpoint, topic_id=self.broker.topic_id, partition=partition,
                          log_start=0, high=high, now=now, retention=self.RETENTION)
            if why is None:
                builder, start = ReplayBuilder(role, checkpoint.state), checkpoint.offset
                self.stats.checkpoint_replays += 1
        for entry in log.entries[start:high]:
            if entry.kind == DATA and entry.status == COMMITTED:
                builder.add(entry.key, entry.value, entry.offset)
        self._checkpoints[role] = Checkpoint("sim", "ledger", self.broker.topic_id, partition,
                                             high, now, builder.state())
        return builder.build(high, fenced=fenced)


    def _defect_of_issue_31(self, role: str, partition: int, checkpoint: Checkpoint | None,
                            end: int, now: float, *, fenced: bool) -> Replay:
        """The ``invalid_end_offset`` mutation: the replay before issue 31 took -1001 as the
        end. It judged a checkpoint "truncated" (high < its offset), kept its highest token as
        the floor and folded nothing; without a checkpoint it read nothing at all."""
        builder = ReplayBuilder(role)
        if checkpoint is not None and end < checkpoint.offset:
            builder.raise_token_floor(checkpoint.state.max_token)
        self._checkpoints[role] = Checkpoint("sim", "ledger", self.broker.topic_id, partition,
                                             0, now, builder.state())
        return builder.build(0, fenced=fenced)


class WriteAudit:
    """Hooks the checker uses to see every begin and write (S2)."""

    def __init__(self) -> None:
        self.on_begin: Callable[[SimLedgerWriter], None] = lambda writer: None
        self.on_written: Callable[[SimLedgerWriter, list[LedgerRecord | None]], None] = (
            lambda writer, records: None
        )


class SimLedgerStore:
    """One process's ledger client (what a KafkaLedger is in a real process)."""

    def __init__(
        self,
        broker: Broker,
        cache: ReplayCache | HostCache,
        audit: WriteAudit,
        proc: Proc,
        *,
        partitions: int,
        prefix: str = "neli.ledger:",
        fence: bool = True,
    ) -> None:
        self.broker = broker
        self.cache = cache
        self.audit = audit
        self.proc = proc
        self.partitions = partitions
        self.prefix = prefix
        self.fence = fence

    def begin(self, role: str) -> SimLedgerWriter:
        tid = self.prefix + role
        if self.fence:
            epoch = self.broker.init_transactions(tid)
        else:  # mutation: a "leader" that skips init_transactions fences nobody
            if tid not in self.broker.epochs:
                self.broker.init_transactions(tid)
            epoch = self.broker.current_epoch(tid)
        writer = SimLedgerWriter(self, role, tid, epoch, role_partition(role, self.partitions))
        self.broker.kernel.log(self.proc.name, "begin", f"{tid} epoch {epoch}")
        self.audit.on_begin(writer)
        return writer

    def replay(self, role: str) -> Replay:
        return self.cache.replay(role, role_partition(role, self.partitions), fenced=False)

    def close(self) -> None:
        pass


class SimLedgerWriter:
    """A transactional writer of one role, fenced by a newer ``begin``."""

    def __init__(
        self, store: SimLedgerStore, role: str, tid: str, epoch: int, partition: int
    ) -> None:
        self.store = store
        self._role = role
        self.tid = tid
        self.epoch = epoch
        self.partition = partition
        self.proc = store.proc
        self.fenced = False
        #: Sequence number of this begin among all begins of the tid (set by the audit).
        self.begin_seq = 0

    @property
    def role(self) -> str:
        return self._role

    def replay(self) -> Replay:
        if self.fenced:
            raise FencedError(f"writer of {self._role!r} was fenced", role=self._role)
        return self.store.cache.replay(self._role, self.partition, fenced=True)

    def write(self, record: LedgerRecord) -> None:
        if record.role != self._role:
            raise ValueError(f"writer of role {self._role!r} cannot write {record.role!r}")
        self._transaction([(record.key, record.encode())], [record], record.token)

    def write_encoded(self, record: LedgerRecord, value: bytes) -> None:
        """Write ``value`` under ``record``'s key: what a writer of another library version
        (another schema) writes where this version would write ``record``."""
        self._transaction([(record.key, value)], [record], record.token)

    def tombstone(self, run_keys: Sequence[str]) -> None:
        if run_keys:
            messages: list[tuple[bytes, bytes | None]] = [
                (encode_key(self._role, k), None) for k in run_keys
            ]
            self._transaction(messages, [None] * len(messages), None)

    def _transaction(
        self,
        messages: list[tuple[bytes, bytes | None]],
        records: list[LedgerRecord | None],
        token: int | None,
    ) -> None:
        if self.fenced:
            raise FencedError(f"writer of {self._role!r} was fenced", role=self._role, token=token)
        midway = self.proc.crash_midway
        try:
            self.store.broker.write(self.tid, self.epoch, self.partition, messages, midway=midway)
        except Fenced as exc:
            self.fenced = True
            raise FencedError(
                f"ledger write for role {self._role!r} refused: {exc}", role=self._role, token=token
            ) from exc
        if midway:
            raise SimCrash("died in the middle of a ledger transaction")
        self.store.audit.on_written(self, records)

    def close(self) -> None:
        pass
