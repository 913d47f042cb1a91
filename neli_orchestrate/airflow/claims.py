"""What the gate, the sensors, the trigger and fenced tasks share: the claim and the ledger view.

Usage::

    with open_singleton(NeliHook("neli_default")) as singleton:
        record = singleton.status(role, run_key)
        log.info("latest: %s", describe(record))

The gate pushes its claim (:class:`~neli_orchestrate.claim.Claim`) as its XCom; a fenced task
reads it back. A gate that skips, and a fenced try that ends as the gate would, record the
ledger entry they found under :data:`DONE_ELSEWHERE_XCOM_KEY`. Nothing here
imports an operator, sensor or trigger, so those modules import this one and never each other
in a circle.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

__all__ = ["CLAIM_CONTEXT_KEY", "DONE_ELSEWHERE_XCOM_KEY", "describe",
           "open_singleton", "record_to_dict", "reset_command"]

if TYPE_CHECKING:
    from neli_orchestrate.airflow.hooks.neli import NeliHook
    from neli_orchestrate.observe import LedgerRecord
    from neli_orchestrate.singleton.singleton import Singleton

#: Context key under which a fenced task's work finds its claim, in its XCom form (``@task``
#: functions: declare a parameter of this name).
CLAIM_CONTEXT_KEY = "neli_claim"

#: XCom key under which a skipping gate (and a fenced try that found its run completed
#: elsewhere) records the ledger entry it found: the "Ran in region" link and the NELI page
#: read it.
DONE_ELSEWHERE_XCOM_KEY = "neli_done"


def reset_command(role: str, run_key: str) -> str:
    """The command that resets one run key so it can run again (every message about re-runs
    names it): ``neli-orchestrate ledger reset ROLE RUN_KEY --reason ...``."""
    quoted = f"{shlex.quote(role)} {shlex.quote(run_key)}"
    return f"neli-orchestrate ledger reset {quoted} --reason '...'"


def describe(record: LedgerRecord | None) -> str:
    """One log line about a ledger record (or its absence): :meth:`LedgerRecord.describe`."""
    return "no ledger record" if record is None else record.describe()


def record_to_dict(record: LedgerRecord | None) -> dict[str, Any] | None:
    """A JSON-safe view of a ledger record (for XCom and trigger events)."""
    if record is None:
        return None
    return {
        "state": record.state.value,
        "token": record.token,
        "deployment": record.deployment,
        "member": record.member,
        "attempt": record.attempt,
        "at": record.at,
        "reason": record.reason,
    }


@contextlib.contextmanager
def open_singleton(hook: NeliHook) -> Iterator[Singleton]:
    """Yield a Singleton from ``hook`` and always close it (leaving the group at once)."""
    singleton = hook.get_singleton()
    try:
        yield singleton
    finally:
        singleton.close()
