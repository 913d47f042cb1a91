"""The Kafka ACLs a deployment's principal needs, derived from its :class:`SingletonConfig`.

Usage::

    for acl in required_acls(config, "User:airflow-us-east-1"):
        print("kafka-acls --bootstrap-server ... --add", " ".join(acl.kafka_acls_args()))

The list was found by experiment against a broker running the ``StandardAuthorizer`` (see
``tests/security/``): with exactly these rules a principal runs every step of a singleton
run, and without any one of them some step fails with
:class:`~neli_orchestrate.errors.AuthorizationError`. ``docs/guide/security.md`` explains each rule.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from neli_orchestrate.singleton.config import SingletonConfig

__all__ = ["Acl", "required_acls"]


@dataclass(frozen=True)
class Acl:
    """One ALLOW rule: ``principal`` may do ``operation`` on a resource.

    ``resource_type`` is ``topic``, ``group``, ``transactional_id`` or ``cluster``;
    ``pattern`` is ``literal`` or ``prefixed``. ``why`` says which step needs it.
    """

    principal: str
    operation: str
    resource_type: str
    name: str
    pattern: str = "literal"
    why: str = ""

    def binding(self) -> Any:
        """This rule as a ``confluent_kafka.admin.AclBinding`` (host ``*``)."""
        from confluent_kafka.admin import (
            AclBinding,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        # confluent-kafka calls Kafka's CLUSTER resource type BROKER
        rtype = "BROKER" if self.resource_type == "cluster" else self.resource_type.upper()
        return AclBinding(
            ResourceType[rtype], self.name, ResourcePatternType[self.pattern.upper()],
            self.principal, "*", AclOperation[self.operation.upper()],
            AclPermissionType.ALLOW,
        )

    def kafka_acls_args(self) -> list[str]:
        """The ``kafka-acls --add`` arguments that grant this rule."""
        op = "".join(part.title() for part in self.operation.split("_"))
        args = ["--allow-principal", self.principal, "--operation", op]
        if self.resource_type == "cluster":
            args.append("--cluster")
        else:
            flag = {"topic": "--topic", "group": "--group",
                    "transactional_id": "--transactional-id"}[self.resource_type]
            args += [flag, self.name]
        if self.pattern == "prefixed":
            args += ["--resource-pattern-type", "prefixed"]
        return args

    def __str__(self) -> str:
        star = "*" if self.pattern == "prefixed" else ""
        return f"{self.operation.upper()} on {self.resource_type} {self.name}{star}"


def _group_prefix(config: SingletonConfig) -> str:
    # Every role's group starts with the same prefix; take it from the one derivation.
    return os.path.commonprefix([config.names.group_id("a"), config.names.group_id("b")])


def required_acls(config: SingletonConfig, principal: str, *,
                  create_topics: bool = True) -> list[Acl]:
    """The ALLOW rules ``principal`` needs to run singleton roles under ``config``.

    ``create_topics=False`` leaves out CREATE on the leader and ledger topics, for clusters
    where an administrator creates them (then set ``NeliConfig.create_topic=False``).
    """
    groups = _group_prefix(config)
    leader = config.names.leader_topic
    ledger = config.ledger_config()

    def acl(op: str, rtype: str, name: str, pattern: str = "literal", why: str = "") -> Acl:
        return Acl(principal, op, rtype, name, pattern, why)

    # Kafka lets READ, WRITE and ALTER imply DESCRIBE, and ALTER_CONFIGS imply
    # DESCRIBE_CONFIGS: the list holds no rule that another one already grants.
    rules = [
        acl("read", "group", groups, "prefixed",
            "join the role's consumer group, commit its offsets, count its members"),
    ]
    if config.neli.resolved.group_protocol == "consumer":
        if config.neli.resolved.apply_group_config:
            rules.append(acl("alter_configs", "group", groups, "prefixed",
                             "set the KIP-848 group's session timeout and heartbeat interval"))
        else:
            rules.append(acl("describe_configs", "group", groups, "prefixed",
                             "read the KIP-848 group's session timeout to check the lease"))
    rules += [
        acl("read", "topic", leader, why="consume heartbeats"),
        acl("write", "topic", leader, why="produce heartbeats"),
        acl("read", "topic", ledger.topic, why="replay the ledger"),
        acl("write", "topic", ledger.topic, why="write claims and outcomes"),
        acl("describe_configs", "topic", ledger.topic,
            why="verify the ledger's cleanup.policy=compact (without it: a warning)"),
        acl("write", "transactional_id", ledger.prefix, "prefixed",
            why="init_transactions: fence earlier leaders of the role, write the ledger"),
    ]
    if create_topics:
        rules += [
            acl("create", "topic", leader, why="create the leader topic on first use"),
            acl("create", "topic", ledger.topic, why="create the ledger topic on first use"),
        ]
    return rules
