"""One namespace, one derivation: every Kafka name a deployment uses comes from its namespace.

Usage::

    names = derive("acme")
    names.group_id("daily_flights")     # "acme.daily_flights": the role's NELI consumer group
    names.leader_topic                  # "acme.neli": heartbeats of every role
    names.ledger_topic                  # "acme.ledger": the run ledger
    names.transactional_id_prefix       # "acme.ledger:": + role = the ledger writer's id

Deployments that must run each run key once between them (Airflow regions, Dagster
deployments, plain Python) share all four names exactly when they share the namespace, however
they were configured: ``SingletonConfig``, the Airflow hook and the Dagster resource all call
:func:`derive`. There is no default namespace: two teams that both forgot to set one would
otherwise fence each other's runs, or two front doors with different defaults would share a
ledger but not a group.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from neli_orchestrate.errors import ConfigError

__all__ = ["Namespace", "derive"]

_LEGAL = re.compile(r"^[A-Za-z0-9._-]+$")
# Kafka topic names are at most 249 characters; the longest derived name is "<ns>.ledger".
_MAX_LENGTH = 249 - len(".ledger")

_HOW = ("set it in SingletonConfig(namespace=...), NeliResource(namespace=...) or the Airflow "
        "connection's 'namespace' extra ([neli] namespace); use the same value in every "
        "deployment that shares runs")


@dataclass(frozen=True)
class Namespace:
    """The Kafka names of one namespace (build it with :func:`derive`)."""

    name: str
    #: The NELI leader (heartbeat) topic every role of the namespace shares.
    leader_topic: str
    #: The compacted run-ledger topic.
    ledger_topic: str
    #: ``transactional.id`` of a role's ledger writer = this prefix + role.
    transactional_id_prefix: str

    def group_id(self, role: str) -> str:
        """The consumer group whose members contend to lead ``role``."""
        if not isinstance(role, str) or not role:
            raise ConfigError(f"role must be a non-empty string, got {role!r}")
        return f"{self.name}.{role}"


def derive(namespace: object, *, ledger_topic: str | None = None) -> Namespace:
    """The names of ``namespace``; ConfigError if it is missing or not a legal name.

    ``ledger_topic`` overrides the derived ledger topic (an existing ledger under another
    name); every deployment of the namespace must then pass the same override.
    """
    if namespace is None or (isinstance(namespace, str) and not namespace.strip()):
        raise ConfigError(f"no namespace: a deployment must name the namespace it shares; {_HOW}")
    if not isinstance(namespace, str):
        raise ConfigError(f"namespace must be a string, not {type(namespace).__name__}")
    if not _LEGAL.match(namespace) or namespace in (".", "..") or len(namespace) > _MAX_LENGTH:
        raise ConfigError(
            f"namespace {namespace!r} cannot prefix Kafka topic names: use 1-{_MAX_LENGTH} of "
            f"[A-Za-z0-9._-]"
        )
    if ledger_topic is not None and (
        not isinstance(ledger_topic, str) or not _LEGAL.match(ledger_topic)
        or len(ledger_topic) > 249 or ledger_topic in (".", "..")
    ):
        raise ConfigError(f"ledger_topic {ledger_topic!r} is not a legal Kafka topic name")
    return Namespace(
        name=namespace,
        leader_topic=f"{namespace}.neli",
        ledger_topic=ledger_topic or f"{namespace}.ledger",
        transactional_id_prefix=f"{namespace}.ledger:",
    )
