"""How a deployment takes part in singleton runs: :class:`SingletonConfig`.

Usage::

    config = SingletonConfig(neli=NeliConfig(bootstrap_servers="kafka:9092"),
                             namespace="acme", deployment="us-east-1")
    config.role_neli("daily_flights").group_id     # 'acme.daily_flights'

Front doors (the Airflow hook, the Dagster resource, the CLI) build it from
:class:`~neli_orchestrate.settings.NeliSettings`; plain Python may build it directly.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from neli_orchestrate.core.config import NeliConfig
from neli_orchestrate.core.namespace import Namespace, derive
from neli_orchestrate.decision import DecisionPolicy, FailedRetry
from neli_orchestrate.errors import ConfigError
from neli_orchestrate.ledger.kafka import KafkaLedgerConfig
from neli_orchestrate.liveness import DEFAULT_LIVENESS_TIMEOUT

__all__ = ["SingletonConfig", "ledger_client_settings"]


@dataclass(frozen=True)
class SingletonConfig:
    """How a deployment takes part in singleton runs; one configuration serves many roles.

    ``namespace`` (required) names every Kafka resource the deployment shares with the others
    (:func:`neli_orchestrate.core.namespace.derive`): role ``r`` contends in the group
    ``<namespace>.<r>`` on the leader topic ``<namespace>.neli``, and runs are recorded in the
    ledger ``<namespace>.ledger`` (``ledger_topic`` overrides it). ``neli`` carries the
    connection and timing settings; its ``group_id`` and ``topic`` must stay unset.

    - ``handoff_timeout``: seconds another deployment's ``CLAIMED`` (and a ``FAILED`` retry of
      the failing deployment) is respected. Must exceed the gate→executor delay of the
      orchestrator plus leadership acquisition.
    - ``acquire_timeout``: seconds to wait for leadership of a role before answering ``WAIT``
      (claim, reserve) or raising :class:`AcquireTimeoutError` (execute).
    - A routine revocation (another member joins, or ours closes) waits for in-flight work
      and its ``COMPLETED`` record up to the member's ``revoke_timeout`` (``NeliConfig``,
      below the rebalance timeout ``max_poll_interval``); past it the member is fenced.
    - ``max_clock_error``: bound on the wall-clock difference between deployments.
    """

    #: Connection and timing settings of each role's NELI member (``group_id`` and ``topic``
    #: stay unset: they derive from ``namespace``).
    neli: NeliConfig
    #: Id of this orchestrator deployment (region), e.g. ``us-east-1``; unique per deployment,
    #: recorded in the ledger.
    deployment: str
    #: Names every shared Kafka resource (groups, leader topic, ledger); required, the same in
    #: every deployment that shares runs.
    namespace: str | None = None
    #: Ledger topic (None: ``<namespace>.ledger``); the same in every deployment.
    ledger_topic: str | None = None
    handoff_timeout: float = 300.0
    acquire_timeout: float = 60.0
    #: Who runs a ``FAILED`` run key again: the failing deployment first, anyone after
    #: ``handoff_timeout`` (``SAME_DEPLOYMENT_FIRST``), anyone at once (``ANY_DEPLOYMENT``), or
    #: only the failing deployment (``SAME_DEPLOYMENT_ONLY``).
    failed_retry: FailedRetry = FailedRetry.SAME_DEPLOYMENT_FIRST
    #: Attempts per run key before it fails for good (``GIVE_UP``; reset it to run again);
    #: None: no limit.
    max_attempts: int | None = None
    max_clock_error: float = 1.0
    #: Partitions of the ledger topic when this deployment creates it (roles hash onto them).
    ledger_partitions: int = 1
    #: Continue ledger replays from a checkpoint (in memory and a file per role on this host)
    #: when safe, instead of reading the role's partition from offset 0 on every claim
    #: (``KafkaLedgerConfig.replay_cache``; docs/guide/ledger.md, "Replay cache").
    ledger_replay_cache: bool = True
    #: Directory of the replay cache files (None: ``$XDG_CACHE_HOME/neli-orchestrate/ledger``;
    #: an empty string: memory only).
    ledger_replay_cache_dir: str | None = None
    #: Poll interval of the watchdog and of leadership acquisition, seconds.
    poll_interval: float = 0.05
    #: Read other deployments' liveness (:mod:`neli_orchestrate.liveness`) when deciding: the
    #: ``CLAIMED``/``FAILED`` record of a deployment Kafka shows gone is taken over at once.
    #: False: the handoff window alone (as before).
    deployment_liveness: bool = True
    #: Seconds of silence after which this deployment counts as gone, when it announces its
    #: liveness (the Airflow scheduler listener, the Dagster sidecar); the liveness group's
    #: session timeout. Longer than a routine restart of the announcing component.
    liveness_timeout: float = DEFAULT_LIVENESS_TIMEOUT
    policy: DecisionPolicy = field(init=False, repr=False)
    names: Namespace = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.deployment, str) or not self.deployment.strip():
            raise ConfigError("deployment must name this orchestrator deployment, e.g. 'us-east-1'")
        for name in ("group_id", "topic"):
            if getattr(self.neli, name) is not None:
                raise ConfigError(
                    f"SingletonConfig derives each role's group and the leader topic from the "
                    f"namespace: leave NeliConfig.{name} unset and pass "
                    f"SingletonConfig(namespace=...) instead")
        object.__setattr__(self, "names", derive(self.namespace, ledger_topic=self.ledger_topic))
        for name in ("acquire_timeout", "poll_interval", "liveness_timeout"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        # DecisionPolicy validates handoff_timeout, max_attempts and max_clock_error.
        policy = DecisionPolicy(
            handoff_timeout=self.handoff_timeout,
            failed_retry=self.failed_retry,
            max_attempts=self.max_attempts,
            max_clock_error=self.max_clock_error,
        )
        object.__setattr__(self, "policy", policy)

    def role_neli(self, role: str) -> NeliConfig:
        """The NELI configuration of ``role``'s group."""
        return dataclasses.replace(self.neli, group_id=self.names.group_id(role),
                                   topic=self.names.leader_topic)

    def ledger_config(self) -> KafkaLedgerConfig:
        """The ledger's Kafka configuration, sharing the member's client settings."""
        return KafkaLedgerConfig(
            bootstrap_servers=self.neli.bootstrap_servers,
            topic=self.names.ledger_topic,
            partitions=self.ledger_partitions,
            transactional_id_prefix=self.names.transactional_id_prefix,
            kafka_config=ledger_client_settings(self.neli.kafka_config),
            replay_cache=self.ledger_replay_cache,
            replay_cache_dir=self.ledger_replay_cache_dir,
        )


def ledger_client_settings(kafka_config: Any) -> dict[str, Any]:
    """Connection and security settings of a member's kafka_config that the ledger shares."""
    keep = ("security.", "sasl.", "ssl.", "enable.ssl.", "enable.sasl.", "oauth_cb",
            "client.", "socket.", "broker.", "metadata.", "reconnect.", "retry.", "retries",
            "debug", "log_level")
    return {k: v for k, v in dict(kafka_config).items() if k.startswith(keep)}

