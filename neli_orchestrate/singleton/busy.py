"""The busy-group rule: never join a role's group while anyone leads it or waits for it.

Every join rebalances the group under the running leader, and under classic groups may fence
it. So a deployment that finds the role's group busy (it has members,
:meth:`~neli_orchestrate.singleton.groups.GroupReads.members`) does not join: it reads the
ledger instead and answers from it (:func:`busy_answer`): ``SKIP_DONE`` (or ``GIVE_UP``) when
the run key is finished, else ``WAIT``. :meth:`Singleton.reserve`, :meth:`Singleton.claim` and
:meth:`Singleton.leads` apply it; :meth:`Singleton.execute` does not (the gate's claim is the
executor's to run).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from neli_orchestrate.decision import Claimant, DecisionPolicy, Outcome, decide
from neli_orchestrate.ledger.record import LedgerRecord

__all__ = ["busy_answer", "while_preparing"]

T = TypeVar("T")


def busy_answer(role: str, members: int, latest: LedgerRecord | None, *, deployment: str,
                now: float, policy: DecisionPolicy) -> tuple[Outcome, str, float | None]:
    """The answer for a run key of a busy role, from its latest ledger record alone:
    (outcome, reason, wait until)."""
    decision = decide(latest, Claimant(deployment, "-"), now=now, policy=policy)
    busy = f"role {role!r} is busy ({members} member(s) lead or wait for it): not joining"
    if decision.outcome in (Outcome.SKIP_DONE, Outcome.GIVE_UP):
        return decision.outcome, decision.reason, None
    if decision.outcome is Outcome.WAIT:
        return Outcome.WAIT, f"{busy}; {decision.reason}", decision.wait_until
    latest_text = "none" if latest is None else latest.describe()
    return Outcome.WAIT, f"{busy}; latest record: {latest_text}", None


def while_preparing(check: Callable[[], T], prepare: Callable[[], None], name: str) -> T:
    """``check()`` (the busy check) while ``prepare()`` (the ledger's warm-up) runs on a helper
    thread: their round trips are independent, and a new process pays both (two Kafka
    clients). Returns once both are done; an error of either is raised here."""
    prepared: Future[None] = Future()

    def run() -> None:
        try:
            prepare()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            prepared.set_exception(exc)
        else:
            prepared.set_result(None)

    threading.Thread(target=run, name=name, daemon=True).start()
    # An error or a signal (the CLI's Terminated) in check() leaves at once: nothing joins the
    # group then, and the warm-up (a daemon thread) may wait on an unreachable cluster.
    result = check()
    prepared.result()  # wait: nothing joins the group before the ledger is ready
    return result
