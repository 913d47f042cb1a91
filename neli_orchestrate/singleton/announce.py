"""A deployment's liveness announcer as a front door starts it (docs/guide/guarantees.md).

:func:`announcer_config` derives the announcer's settings from the deployment's
:class:`~neli_orchestrate.SingletonConfig` (one derivation: the same bootstrap servers,
namespace, deployment, liveness timeout and ledger client settings the claims use), and
:func:`start_announcer` starts the child process that announces.
"""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

from neli_orchestrate.liveness import AnnouncerConfig, spawn_announcer
from neli_orchestrate.singleton.config import ledger_client_settings

if TYPE_CHECKING:
    from neli_orchestrate.singleton.config import SingletonConfig

__all__ = ["announcer_config", "start_announcer"]


def announcer_config(config: SingletonConfig, *, component: str) -> AnnouncerConfig:
    """The announcer settings of ``config``'s deployment, for one orchestrator ``component``
    (``scheduler``, ``triggerer``, ...); it polls at most every 0.5 s, five times a timeout."""
    return AnnouncerConfig(bootstrap_servers=config.neli.bootstrap_servers,
                           namespace=config.names.name, deployment=config.deployment,
                           timeout=config.liveness_timeout, component=component,
                           poll_interval=min(0.5, config.liveness_timeout / 5),
                           kafka_config=ledger_client_settings(config.neli.kafka_config))


def start_announcer(config: AnnouncerConfig) -> subprocess.Popen[bytes]:
    """Start the announcer of ``config`` as a child process (the caller stops it)."""
    return spawn_announcer(config)
