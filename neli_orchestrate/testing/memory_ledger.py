"""An in-memory run ledger with the fencing of the real one, for unit tests without Kafka.

Usage::

    ledger = MemoryLedger()
    singleton = Singleton(config, ledger=ledger, neli_factory=...)
    ...
    assert ledger.latest("daily_flights", "2013-01-05").state is RunState.COMPLETED

It behaves like :class:`~neli_orchestrate.ledger.kafka.KafkaLedger` where the protocol depends
on it: ``begin(role)`` fences every earlier writer of the role (their writes raise
:class:`~neli_orchestrate.errors.FencedError`), replays fold the log with the real
:class:`~neli_orchestrate.ledger.replay.ReplayBuilder`, and tokens come from log offsets.

.. note:: One log for all roles, no transactions spanning writes, no compaction.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from neli_orchestrate.errors import FencedError
from neli_orchestrate.ledger.record import LedgerRecord, RunState, encode_key
from neli_orchestrate.ledger.replay import Replay, ReplayBuilder


class MemoryLedger:
    """A :class:`~neli_orchestrate.ledger.store.LedgerStore` held in a list; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: (key, value or None for a tombstone, role) in offset order.
        self.log: list[tuple[bytes, bytes | None, str]] = []
        self._epochs: dict[str, int] = {}

    def begin(self, role: str) -> MemoryLedgerWriter:
        with self._lock:
            self._epochs[role] = self._epochs.get(role, 0) + 1
            return MemoryLedgerWriter(self, role, self._epochs[role])

    def replay(self, role: str, *, fenced: bool = False) -> Replay:
        with self._lock:
            builder = ReplayBuilder(role)
            for offset, (key, value, owner) in enumerate(self.log):
                if owner == role:
                    builder.add(key, value, offset)
            return builder.build(len(self.log), fenced=fenced)

    def latest(self, role: str, run_key: str) -> LedgerRecord | None:
        """The latest record of a run (test helper)."""
        return self.replay(role).latest(run_key)

    def history(self, role: str, run_key: str) -> list[RunState]:
        """Every state written for a run, in order (test helper)."""
        key = encode_key(role, run_key)
        with self._lock:
            values = [v for k, v, _ in self.log if k == key and v is not None]
        return [record.state for v in values if (record := LedgerRecord.decode(v))]

    def close(self) -> None:
        pass

    def _append(self, role: str, epoch: int, entries: list[tuple[bytes, bytes | None]]) -> None:
        with self._lock:
            if self._epochs.get(role) != epoch:
                raise FencedError(
                    f"ledger writer of role {role!r} was fenced by a newer begin()", role=role
                )
            self.log.extend((k, v, role) for k, v in entries)


class MemoryLedgerWriter:
    """A fenced writer of one role of a :class:`MemoryLedger`."""

    def __init__(self, ledger: MemoryLedger, role: str, epoch: int) -> None:
        self._ledger = ledger
        self._role = role
        self._epoch = epoch

    @property
    def role(self) -> str:
        return self._role

    def replay(self) -> Replay:
        return self._ledger.replay(self._role, fenced=True)

    def write(self, record: LedgerRecord) -> None:
        self._ledger._append(self._role, self._epoch, [(record.key, record.encode())])

    def tombstone(self, run_keys: Sequence[str]) -> None:
        self._ledger._append(self._role, self._epoch,
                             [(encode_key(self._role, k), None) for k in run_keys])

    def close(self) -> None:
        pass
