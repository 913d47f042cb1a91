"""Exactly-once singleton tasks across active-active orchestrator deployments, led through NELI.

``__all__`` lists what users write in DAGs, jobs and tests: ``Singleton`` and its config, the
protocol core (``Neli``, ``NeliConfig``, its events, ``MockNeli`` for users' own tests),
``Outcome`` and the errors. Everything else (``Run``, ``Reservation``, the ledger, the decision
table) stays importable from its own module. docs/guide/api.md lists every public name of
every package (at most 40 in all; ``tests/test_public_api.py`` holds the list, the docstrings
and that page together). Public names are imported lazily, so ``import
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
    "Neli": "neli_orchestrate.core.neli",
    "NeliConfig": "neli_orchestrate.core.config",
    "LeaderAcquired": "neli_orchestrate.core.events",
    "LeaderRevoked": "neli_orchestrate.core.events",
    "LeaderFenced": "neli_orchestrate.core.events",
    "MockNeli": "neli_orchestrate.core.mock",
    "Outcome": "neli_orchestrate.decision",
    "Singleton": "neli_orchestrate.singleton.singleton",
    "SingletonConfig": "neli_orchestrate.singleton.config",
}

if TYPE_CHECKING:
    from neli_orchestrate.core.config import NeliConfig
    from neli_orchestrate.core.events import LeaderAcquired, LeaderFenced, LeaderRevoked
    from neli_orchestrate.core.mock import MockNeli
    from neli_orchestrate.core.neli import Neli
    from neli_orchestrate.decision import Outcome
    from neli_orchestrate.singleton.config import SingletonConfig
    from neli_orchestrate.singleton.singleton import Singleton

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
