"""What the decision table says about a run key to a deployment that only looks, not claims.

The deferred Airflow gate checks from the triggerer, without joining the role's group: it
reads the run key's latest record (:meth:`Singleton.status`) and asks :func:`decide_now` what a
claim would meet there, with the claiming deployment's liveness as :class:`Singleton` itself
reads it (a gone deployment's claim or failed try is not waited for).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from neli_orchestrate.decision import Claimant, Decision, decide

if TYPE_CHECKING:
    from neli_orchestrate.ledger.record import LedgerRecord
    from neli_orchestrate.singleton.singleton import Singleton

__all__ = ["decide_now"]


def decide_now(singleton: Singleton, record: LedgerRecord | None, *, member: str,
               now: float | None = None) -> Decision:
    """The decision for ``record`` as member ``member`` of ``singleton``'s deployment, at
    ``now`` (wall clock, as ledger records are stamped; the current time if None), with
    ``singleton``'s decision policy and liveness reading."""
    me = Claimant(deployment=singleton.config.deployment, member=member)
    return decide(record, me, now=time.time() if now is None else now,
                  policy=singleton.config.policy, liveness=singleton._liveness_of(record, me))
