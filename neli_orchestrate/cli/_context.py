"""Where the commands connect: broker, namespace, client settings, and the names derived from them.

Every command that talks to a cluster takes the same options (also from the environment)::

    --bootstrap-servers  NELI_BOOTSTRAP_SERVERS   (default localhost:9092)
    --namespace          NELI_NAMESPACE           (required: the one every deployment shares)
    --ledger-topic       NELI_LEDGER_TOPIC        (default <namespace>.ledger)
    -X key=value         librdkafka settings (security.protocol, sasl.*, ssl.*), repeatable
    --kafka-config-file  a Java-style properties file of librdkafka settings
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from neli_orchestrate.errors import ConfigError
from neli_orchestrate.settings import (
    DEFAULT_BOOTSTRAP_SERVERS,
    ClusterSettings,
    NeliSettings,
    choices,
    declaration,
    kind,
    parse,
)

__all__ = ["SettingOption", "Target", "connection_options", "setting_option"]

#: librdkafka's own log lines go through this logger (``-v`` shows them).
librdkafka_log = logging.getLogger("neli_orchestrate.cli.librdkafka")


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


class Target(ClusterSettings):
    """One cluster and namespace, as the options of a command named them
    (:class:`~neli_orchestrate.settings.ClusterSettings`; its clients log through Python)."""

    @property
    def timeout(self) -> float:
        """Seconds to wait for the cluster (``--timeout``: the ``connect_timeout`` setting)."""
        return self.connect_timeout

    @property
    def ledger_topic_option(self) -> str | None:
        """The ``--ledger-topic`` given (None: the namespace's)."""
        return self.ledger_topic

    def _client_defaults(self) -> dict[str, Any]:
        """The command line's clients: named, bounded by ``--timeout``, logging to
        ``neli_orchestrate.cli.librdkafka``."""
        return {"client.id": "neli-orchestrate-cli",
                "socket.timeout.ms": int(self.timeout * 1000), "logger": librdkafka_log}

    def with_timeout(self, timeout: float) -> Target:
        return self.model_copy(update={"connect_timeout": timeout})


#: Where each of the cluster options comes from: option -> setting it fills.
CLUSTER_OPTIONS = {"--bootstrap-servers": "bootstrap_servers", "--namespace": "namespace",
                   "--ledger-topic": "ledger_topic", "--timeout": "connect_timeout",
                   "-X": "kafka_config"}


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
    values = {"bootstrap_servers": bootstrap_servers.strip(), "namespace": namespace.strip(),
              "ledger_topic": ledger_topic, "kafka_config": kafka_config,
              "connect_timeout": timeout}
    try:
        target: Target = parse(Target, values, where="option")
        target.ledger_config()  # the settings the ledger owns are refused as well
    except ConfigError as exc:
        hints = [option for option, name in CLUSTER_OPTIONS.items() if f"'{name}'" in str(exc)]
        raise click.BadParameter(str(exc), param_hint="/".join(hints) or "-X/--kafka-config"
                                 ) from exc
    return target


class SettingOption(click.Option):
    """A command-line option that sets one of :mod:`neli_orchestrate.settings` (``setting``)."""

    def __init__(self, *args: Any, setting: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.setting = setting


def setting_option(name: str, *decls: str, model: type[ClusterSettings] = NeliSettings,
                   **overrides: Any) -> Callable[[Callable[..., Any]], Any]:
    """A click option for setting ``name``: type, choices, default and help from its one
    declaration (:mod:`neli_orchestrate.settings`)."""
    info = declaration(name, model)
    options = choices(name, model)
    kinds = {"number": float, "integer": int, "string": str}
    kwargs: dict[str, Any] = {
        "cls": SettingOption,
        "setting": name,
        "type": click.Choice(options) if options else kinds.get(kind(name, model), str),
        "help": info.description,
    }
    if info.is_required():
        kwargs["required"] = True
    else:
        kwargs["default"] = info.default
        kwargs["show_default"] = info.default is not None
    kwargs.update(overrides)
    return click.option(*decls, **kwargs)


def connection_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add the cluster options; the command receives one ``target: Target`` argument."""
    options = [
        setting_option("bootstrap_servers", "--bootstrap-servers", "-b", model=ClusterSettings,
                       envvar="NELI_BOOTSTRAP_SERVERS", show_envvar=True, required=False,
                       default=DEFAULT_BOOTSTRAP_SERVERS, show_default=True),
        setting_option("namespace", "--namespace", "-n", model=ClusterSettings,
                       envvar="NELI_NAMESPACE", show_envvar=True),
        setting_option("ledger_topic", "--ledger-topic", model=ClusterSettings,
                       envvar="NELI_LEDGER_TOPIC", show_envvar=True),
        click.option("-X", "--kafka-config", "settings", multiple=True, metavar="KEY=VALUE",
                     help="librdkafka setting, e.g. -X security.protocol=SASL_SSL (repeatable)"),
        click.option("--kafka-config-file", type=click.Path(exists=True, dir_okay=False,
                                                            path_type=Path),
                     help="properties file of librdkafka settings (key=value lines)"),
        setting_option("connect_timeout", "--timeout", "timeout", model=ClusterSettings),
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
