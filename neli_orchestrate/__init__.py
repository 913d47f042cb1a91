"""Exactly-once singleton tasks across active-active orchestrator deployments, led through NELI.

Public names are imported lazily, so ``import neli_orchestrate.testing`` (the pytest plugin)
does not pull in the protocol core.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from neli_orchestrate.errors import (
    ConfigError,
    FencedError,
    KafkaUnavailableError,
    NeliError,
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

__all__ = [
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
    "StaleTokenError",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'neli_orchestrate' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
