"""What a Singleton reads of consumer groups it does not join, through the Kafka seam.

Two read-only looks, over one admin client of the seam
(:class:`~neli_orchestrate.core.kafka.LeaderTopicAdmin`) created on first use: how many members
a role's group has (the busy-group rule, :mod:`neli_orchestrate.singleton.busy`) and whether
another deployment is alive (its liveness group,
:class:`~neli_orchestrate.liveness.LivenessReader`). Neither joins a group, so neither
rebalances anyone.

The same admin client is lent to the start-up checks of the Singleton's members
(:class:`MemberClients`): by then the busy check has connected it, so a member's checks cost
their own requests only, not a new client's connections (about three round trips each claim).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from neli_orchestrate.core.client_settings import KafkaSettings, client_settings
from neli_orchestrate.core.confluent import ConfluentKafka, lent_admin, member_client_defaults
from neli_orchestrate.core.kafka import LeaderTopicAdmin
from neli_orchestrate.liveness import DeploymentLiveness, LivenessReader
from neli_orchestrate.singleton.config import SingletonConfig, ledger_client_settings

__all__ = ["GroupReads", "MemberClients"]


class GroupReads:
    """Role groups' members and deployments' liveness, read without joining (thread-safe)."""

    def __init__(self, config: SingletonConfig) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._admin: LeaderTopicAdmin | None = None

    def members(self, group: str) -> int:
        """How many members ``group`` has now (0 if it does not exist). Raises
        :class:`~neli_orchestrate.errors.AuthorizationError` or
        :class:`~neli_orchestrate.errors.KafkaUnavailableError`."""
        description = self._seam().describe_group(
            group, self._config.neli.resolved.request_timeout)
        return 0 if description is None else len(description.members)

    def liveness(self, deployment: str) -> DeploymentLiveness:
        """Kafka's reading of ``deployment``'s liveness group (namespace of the config)."""
        reader = LivenessReader(self._seam(), self._config.names.name,
                                request_timeout=self._config.neli.resolved.request_timeout)
        return reader.read(deployment)

    def _seam(self) -> LeaderTopicAdmin:
        with self._lock:
            if self._admin is None:
                # with the short first reconnect of every member client (core.confluent):
                # this client's first request is the gate's busy check
                self._admin = ConfluentKafka().admin(self._settings())
            return self._admin

    def _settings(self) -> KafkaSettings:
        neli = self._config.neli.resolved
        # as a member's own admin client had them: its start-up checks run over this one
        return client_settings(neli.bootstrap_servers,
                               logger="neli_orchestrate.singleton.librdkafka",
                               user=ledger_client_settings(neli.kafka_config),
                               defaults=member_client_defaults(neli))


class MemberClients(ConfluentKafka):
    """The clients of a Singleton's members (:class:`~neli_orchestrate.core.kafka.KafkaClients`):
    confluent-kafka's, except the admin, which is :class:`GroupReads`' own client, lent
    (:func:`~neli_orchestrate.core.confluent.lent_admin`): the member's ``close()`` leaves it
    open, and a busy check that replaces it meanwhile does not destroy it under the checks."""

    def __init__(self, groups: GroupReads) -> None:
        self._groups = groups

    def admin(self, settings: Mapping[str, Any]) -> LeaderTopicAdmin:
        return lent_admin(self._groups._seam())

    def __repr__(self) -> str:
        return "MemberClients()"
