"""The ledger's I/O seam (what Singleton and the simulator rely on) and expiry through it."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from neli_orchestrate.ledger.record import LedgerRecord
from neli_orchestrate.ledger.replay import Replay, expired_run_keys

logger = logging.getLogger(__name__)


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
    in ``integration.sim``."""

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
