"""Where the commands connect: broker, namespace, client settings, and the names derived from them.

Every command that talks to a cluster takes the same options (also from the environment)::

    --bootstrap-servers  NELI_BOOTSTRAP_SERVERS   (default localhost:9092)
    --namespace          NELI_NAMESPACE           (required: the one every deployment shares)
    --ledger-topic       NELI_LEDGER_TOPIC        (default <namespace>.ledger)
    -X key=value         librdkafka settings (security.protocol, sasl.*, ssl.*), repeatable
    --kafka-config-file  a Java-style properties file of librdkafka settings
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from neli_orchestrate.core.namespace import Namespace, derive
from neli_orchestrate.errors import ConfigError

__all__ = ["Target", "connection_options", "group_prefix", "namespace_names", "role_of_group"]

#: librdkafka's own log lines go through this logger (``-v`` shows them).
librdkafka_log = logging.getLogger("neli_orchestrate.cli.librdkafka")


def namespace_names(namespace: str, ledger_topic: str | None = None) -> Namespace:
    """The group ids, topics and transactional-id prefix of ``namespace`` (the core's one
    derivation, shared with SingletonConfig, the Airflow hook and the Dagster resource)."""
    return derive(namespace, ledger_topic=ledger_topic)


def group_prefix(names: Namespace) -> str:
    """What every role group id of ``names`` starts with (for prefixed ACLs and discovery)."""
    return names.group_id("\0").split("\0", 1)[0]


def role_of_group(names: Namespace, group_id: str) -> str | None:
    """The role whose NELI group is ``group_id``, or None if it is not one of ``names``."""
    prefix = group_prefix(names)
    if group_id.startswith(prefix) and len(group_id) > len(prefix):
        return group_id[len(prefix):]
    return None


def _read_properties(path: Path) -> dict[str, str]:
    settings: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = line.strip()
        if not text or text.startswith(("#", "!")):
            continue
        key, sep, value = text.partition("=")
        if not sep:
            raise click.BadParameter(f"{path}:{number}: expected key=value, got {text!r}",
                                     param_hint="--kafka-config-file")
        settings[key.strip()] = value.strip()
    return settings


@dataclass(frozen=True)
class Target:
    """One cluster and namespace, as the options of a command named them."""

    bootstrap_servers: str
    namespace: str
    ledger_topic_option: str | None
    kafka_config: Mapping[str, Any]
    timeout: float

    @property
    def names(self) -> Namespace:
        return namespace_names(self.namespace, self.ledger_topic_option)

    def client_config(self, **extra: Any) -> dict[str, Any]:
        """librdkafka settings for a client of this cluster; its logs go to Python logging."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": "neli-orchestrate-cli",
            "socket.timeout.ms": int(self.timeout * 1000),
            **self.kafka_config,
            "logger": librdkafka_log,
        }
        conf.update(extra)
        return conf

    def ledger_config(self) -> Any:
        """The KafkaLedgerConfig every deployment of this namespace writes through."""
        from neli_orchestrate.ledger import KafkaLedgerConfig
        from neli_orchestrate.singleton import _client_settings  # what the ledger shares

        names = self.names
        return KafkaLedgerConfig(
            bootstrap_servers=self.bootstrap_servers,
            topic=names.ledger_topic,
            transactional_id_prefix=names.transactional_id_prefix,
            kafka_config=_client_settings(self.kafka_config),
            create_topic=False,
            replay_timeout=self.timeout,
            request_timeout=self.timeout,
        )

    def with_timeout(self, timeout: float) -> Target:
        return dataclasses.replace(self, timeout=timeout)


def _build_target(bootstrap_servers: str, namespace: str, ledger_topic: str | None,
                  settings: tuple[str, ...], config_file: Path | None, timeout: float) -> Target:
    kafka_config: dict[str, Any] = {}
    if config_file is not None:
        kafka_config.update(_read_properties(config_file))
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected key=value, got {item!r}", param_hint="-X")
        kafka_config[key.strip()] = value
    if not bootstrap_servers.strip():
        raise click.BadParameter("must name at least one broker host:port",
                                 param_hint="--bootstrap-servers")
    try:
        derive(namespace.strip(), ledger_topic=ledger_topic)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--namespace/--ledger-topic") from exc
    if not timeout > 0:
        raise click.BadParameter(f"must be a positive number of seconds, got {timeout}",
                                 param_hint="--timeout")
    target = Target(bootstrap_servers.strip(), namespace.strip(), ledger_topic, kafka_config,
                    timeout)
    try:
        # the settings the protocol and the ledger own are refused, as in the library
        from neli_orchestrate.core import NeliConfig

        NeliConfig(bootstrap_servers=target.bootstrap_servers, kafka_config=kafka_config)
        target.ledger_config()
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="-X/--kafka-config") from exc
    return target


def connection_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add the cluster options; the command receives one ``target: Target`` argument."""
    options = [
        click.option("--bootstrap-servers", "-b", envvar="NELI_BOOTSTRAP_SERVERS",
                     default="localhost:9092", show_default=True,
                     help="Kafka bootstrap servers [env NELI_BOOTSTRAP_SERVERS]"),
        click.option("--namespace", "-n", envvar="NELI_NAMESPACE", required=True,
                     help="the namespace every deployment shares (as in SingletonConfig, the "
                          "Airflow connection, the Dagster resource) [env NELI_NAMESPACE]"),
        click.option("--ledger-topic", envvar="NELI_LEDGER_TOPIC", default=None,
                     help="run ledger topic (default <namespace>.ledger) [env NELI_LEDGER_TOPIC]"),
        click.option("-X", "--kafka-config", "settings", multiple=True, metavar="KEY=VALUE",
                     help="librdkafka setting, e.g. -X security.protocol=SASL_SSL (repeatable)"),
        click.option("--kafka-config-file", type=click.Path(exists=True, dir_okay=False,
                                                            path_type=Path),
                     help="properties file of librdkafka settings (key=value lines)"),
        click.option("--timeout", type=float, default=10.0, show_default=True,
                     help="seconds to wait for the cluster"),
    ]

    def wrapper(bootstrap_servers: str, namespace: str, ledger_topic: str | None,
                settings: tuple[str, ...], kafka_config_file: Path | None, timeout: float,
                **kwargs: Any) -> Any:
        target = _build_target(bootstrap_servers, namespace, ledger_topic, settings,
                               kafka_config_file, timeout)
        return func(target=target, **kwargs)

    functools.update_wrapper(wrapper, func)  # keeps the command's own click options too
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper
