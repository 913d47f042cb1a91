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

The derivation is injective: no two ``(namespace, role)`` pairs share a group id, a topic or a
transactional id. A namespace therefore may not contain ``.``, the separator between namespace
and role (``acme`` + ``billing.daily`` and ``acme.billing`` + ``daily`` would otherwise share the
group ``acme.billing.daily``), nor ``:``, the separator of transactional ids. Roles may contain
anything but the reserved prefix ``deployment.``: everything after the namespace's first ``.`` is
the role, and ``<namespace>.deployment.<name>`` is deployment ``name``'s liveness group
(:mod:`neli_orchestrate.liveness`). See docs/guide/upgrading.md for namespaces that contained a dot
before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from neli_orchestrate.errors import ConfigError

__all__ = ["Namespace", "derive"]

# Topic characters without "." (the namespace/role separator; see the module docstring).
_LEGAL_NAMESPACE = re.compile(r"^[A-Za-z0-9_-]+$")
_LEGAL_TOPIC = re.compile(r"^[A-Za-z0-9._-]+$")
_MAX_TOPIC = 249  # Kafka's limit on topic names (org.apache.kafka.common.internals.Topic)
# The longest derived topic is "<ns>.ledger".
_MAX_LENGTH = _MAX_TOPIC - len(".ledger")
# Group and transactional ids have no limit of their own; the protocol sends them as STRING,
# an int16 length in bytes of UTF-8.
_MAX_ID_BYTES = 32767

# Roles may not start with it: "<namespace>.deployment.<name>" is a deployment's liveness group.
_LIVENESS_PREFIX = "deployment."

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
        if role.startswith(_LIVENESS_PREFIX):
            raise ConfigError(f"role {role!r} starts with {_LIVENESS_PREFIX!r}, which is reserved"
                              " for deployments' liveness groups: rename the role")
        # The role's transactional id (prefix + role) is the longer of its two ids.
        if len(f"{self.transactional_id_prefix}{role}".encode()) > _MAX_ID_BYTES:
            raise ConfigError(f"role {role[:40]!r}... is too long: its Kafka group and "
                              f"transactional ids must fit in {_MAX_ID_BYTES} bytes")
        return f"{self.name}.{role}"

    def liveness_group(self, deployment: str) -> str:
        """The consumer group whose members say that ``deployment`` is alive."""
        return f"{self.name}.{_LIVENESS_PREFIX}{deployment}"

    def is_liveness_group(self, group_id: str) -> bool:
        """True for a deployment's liveness group of this namespace (never a role's group)."""
        return group_id.startswith(self.liveness_group(""))


def derive(namespace: object, *, ledger_topic: str | None = None) -> Namespace:
    """The names of ``namespace``; ConfigError if it is missing or not a legal name.

    ``ledger_topic`` overrides the derived ledger topic (an existing ledger under another
    name); every deployment of the namespace must then pass the same override.
    """
    if namespace is None or (isinstance(namespace, str) and not namespace.strip()):
        raise ConfigError(f"no namespace: a deployment must name the namespace it shares; {_HOW}")
    if not isinstance(namespace, str):
        raise ConfigError(f"namespace must be a string, not {type(namespace).__name__}")
    if "." in namespace and _LEGAL_TOPIC.match(namespace):
        raise ConfigError(
            f"namespace {namespace!r} contains '.', which separates the namespace from the role "
            f"in group ids: namespace 'acme' with role 'billing.daily' and namespace "
            f"'acme.billing' with role 'daily' would share one consumer group. Use '-' or '_' "
            f"instead (e.g. {namespace.replace('.', '-')!r}); to keep an existing ledger pass "
            f"ledger_topic={namespace + '.ledger'!r} (see docs/guide/upgrading.md)"
        )
    if not _LEGAL_NAMESPACE.match(namespace) or len(namespace) > _MAX_LENGTH:
        raise ConfigError(
            f"namespace {namespace!r} cannot prefix Kafka topic names and group ids: use "
            f"1-{_MAX_LENGTH} of [A-Za-z0-9_-] (no '.', the namespace/role separator)"
        )
    if ledger_topic is not None and (
        not isinstance(ledger_topic, str) or not _LEGAL_TOPIC.match(ledger_topic)
        or len(ledger_topic) > _MAX_TOPIC or ledger_topic in (".", "..")
    ):
        raise ConfigError(
            f"ledger_topic {ledger_topic!r} is not a legal Kafka topic name: use 1-{_MAX_TOPIC} "
            f"of [A-Za-z0-9._-]"
        )
    return Namespace(
        name=namespace,
        leader_topic=f"{namespace}.neli",
        ledger_topic=ledger_topic or f"{namespace}.ledger",
        transactional_id_prefix=f"{namespace}.ledger:",
    )
