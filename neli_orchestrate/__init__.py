"""Exactly-once singleton tasks across active-active orchestrator deployments, led through NELI.

``__all__`` lists what users write in DAGs, jobs and tests: ``Singleton`` and its config, the
protocol core (``Neli``, ``NeliConfig``, its events, ``MockNeli`` for users' own tests),
``Outcome`` and the errors. Everything else (``Run``, ``Reservation``, the ledger, the decision
table) stays importable from its own module. Public names are imported lazily, so ``import
neli_orchestrate.testing`` (the pytest plugin) does not pull in the protocol core.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from neli_orchestrate.errors import (
    AcquireTimeoutError,
    ConfigError,
    FencedError,
    KafkaUnavailableError,
    NeliError,
    SkippedRun,
    StaleTokenError,
)

__version__ = "0.1.0"

_LAZY = {
    "Neli": "neli_orchestrate.core",
    "NeliConfig": "neli_orchestrate.core",
    "LeaderAcquired": "neli_orchestrate.core",
    "LeaderRevoked": "neli_orchestrate.core",
    "LeaderFenced": "neli_orchestrate.core",
    "MockNeli": "neli_orchestrate.core",
    "Outcome": "neli_orchestrate.decision",
    "Singleton": "neli_orchestrate.singleton",
    "SingletonConfig": "neli_orchestrate.singleton",
}

if TYPE_CHECKING:
    from neli_orchestrate.core import (
        LeaderAcquired,
        LeaderFenced,
        LeaderRevoked,
        MockNeli,
        Neli,
        NeliConfig,
    )
    from neli_orchestrate.decision import Outcome
    from neli_orchestrate.singleton import Singleton, SingletonConfig

__all__ = [
    "AcquireTimeoutError",
    "ConfigError",
    "FencedError",
    "KafkaUnavailableError",
    "LeaderAcquired",
    "LeaderFenced",
    "LeaderRevoked",
    "MockNeli",
    "Neli",
    "NeliConfig",
    "NeliError",
    "Outcome",
    "Singleton",
    "SingletonConfig",
    "SkippedRun",
    "StaleTokenError",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'neli_orchestrate' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
