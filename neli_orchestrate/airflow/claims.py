"""What the gate, the sensors, the trigger and fenced tasks share: the claim and the ledger view.

Usage::

    with open_singleton(NeliHook("neli_default")) as singleton:
        record = singleton.status(role, run_key)
        log.info("latest: %s", describe(record))

The gate pushes a :class:`RunClaim` as its XCom; a fenced task reads it back. Nothing here
imports an operator, sensor or trigger, so those modules import this one and never each other
in a circle.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from neli_orchestrate.errors import ConfigError

if TYPE_CHECKING:
    from neli_orchestrate.airflow.hooks.neli import NeliHook
    from neli_orchestrate.ledger import LedgerRecord
    from neli_orchestrate.singleton import Singleton

#: The keys of the gate's XCom (its return value): the claim a fenced task runs under.
CLAIM_KEYS = ("token", "run_key", "role", "deployment")

#: Context key under which a fenced task's work finds its claim (``@task`` functions: declare a
#: parameter of this name).
CLAIM_CONTEXT_KEY = "neli_claim"

#: Environment variables that carry the claim to a fenced task's processes (BashOperator,
#: spark-submit, any subprocess).
CLAIM_ENV = {
    "token": "NELI_TOKEN",
    "run_key": "NELI_RUN_KEY",
    "role": "NELI_ROLE",
    "deployment": "NELI_DEPLOYMENT",
}


def reset_command(role: str, run_key: str) -> str:
    """The command that resets one run key so it can run again (every message about re-runs
    names it): ``neli-orchestrate ledger reset ROLE RUN_KEY --reason ...``."""
    quoted = f"{shlex.quote(role)} {shlex.quote(run_key)}"
    return f"neli-orchestrate ledger reset {quoted} --reason '...'"


class RunClaim(dict[str, Any]):
    """The gate's XCom ``{"token", "run_key", "role", "deployment"}`` (a plain dict for XCom)."""

    @classmethod
    def from_xcom(cls, value: object) -> RunClaim:
        """The claim in a gate's XCom; ConfigError if ``value`` is not one."""
        if not isinstance(value, Mapping) or any(k not in value for k in CLAIM_KEYS):
            raise ConfigError(f"not a NELI claim: {value!r}")
        return cls(value)

    @property
    def token(self) -> int:
        return int(self["token"])

    @property
    def run_key(self) -> str:
        return str(self["run_key"])

    @property
    def role(self) -> str:
        return str(self["role"])

    @property
    def deployment(self) -> str:
        return str(self["deployment"])

    def with_token(self, token: int) -> RunClaim:
        """The same claim under another (re-claimed) token."""
        return RunClaim({**self, "token": token})

    def env(self) -> dict[str, str]:
        """The claim as environment variables (``NELI_TOKEN``, ``NELI_RUN_KEY``, ...)."""
        return {CLAIM_ENV[key]: str(self[key]) for key in CLAIM_KEYS}


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
