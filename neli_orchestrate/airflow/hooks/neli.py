"""NeliHook: the NELI / singleton configuration of an Airflow connection.

Usage::

    hook = NeliHook("neli_default")
    with hook.get_singleton() as singleton:       # neli_orchestrate.Singleton
        reservation = singleton.reserve("daily_flights", "2013-01-05")

Two kinds of connection work:

- ``neli`` (this provider's type): host = bootstrap servers, login/password = SASL credentials,
  extras = ``deployment``, ``namespace``, ``security_protocol``, ``sasl_mechanism``,
  ``ssl_*``, ``kafka_config`` (any librdkafka setting) and timeouts.
- ``kafka`` (the official Apache Kafka provider's type): extras are the librdkafka config
  (``bootstrap.servers`` required). The NELI settings it cannot hold come from the hook's
  arguments and the ``[neli]`` Airflow config section (``AIRFLOW__NELI__DEPLOYMENT``).

Secrets (SASL password, key passwords, OAuth secrets) are registered with Airflow's secrets
masker as soon as the connection is read, and never appear in this hook's ``repr`` or logs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Unpack

from airflow.sdk import BaseHook

from neli_orchestrate.airflow.provider import KAFKA_EXTRAS
from neli_orchestrate.errors import ConfigError
from neli_orchestrate.settings import NeliSettings, SettingOverrides, drop_protocol_owned, parse

if TYPE_CHECKING:
    from airflow.sdk import Connection

    from neli_orchestrate import NeliConfig
    from neli_orchestrate.singleton.config import SingletonConfig
    from neli_orchestrate.singleton.singleton import Singleton

logger = logging.getLogger(__name__)

NELI_CONN_TYPE = "neli"
KAFKA_CONN_TYPE = "kafka"

# librdkafka keys whose values are secrets; matched as substrings of the lower-cased key.
_SECRET_KEY_PARTS = ("password", "secret", "jaas", "key.pem", "oauthbearer.config", "token")

#: The settings a hook's (or an operator's) keywords give over the connection: settings.py's.
_OVERRIDES = tuple(SettingOverrides.__annotations__)


def is_secret_key(key: str) -> bool:
    """True when a librdkafka setting named ``key`` holds a secret that must never be shown."""
    lowered = key.lower()
    return any(part in lowered for part in _SECRET_KEY_PARTS)


def redacted(kafka_config: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``kafka_config`` with every secret value replaced by ``***`` (for logs, errors)."""
    return {k: ("***" if is_secret_key(k) else v) for k, v in kafka_config.items()}


class NeliConnectionSettings(NeliSettings):
    """What NeliHook read from a connection: the settings (:class:`NeliSettings`) and where
    they came from; ``repr`` never shows secrets."""

    conn_id: str
    conn_type: str

    @property
    def leader_topic(self) -> str:
        """The NELI leader (heartbeat) topic of this namespace."""
        return self.names.leader_topic

    @property
    def resolved_ledger_topic(self) -> str:
        """The run ledger topic: the ``ledger_topic`` extra, else ``<namespace>.ledger``."""
        return self.names.ledger_topic

    def describe(self) -> str:
        """One log-safe line: where this deployment coordinates, without any secret."""
        protocol = self.kafka_config.get("security.protocol", "PLAINTEXT")
        return (
            f"deployment={self.deployment!r} namespace={self.namespace!r} "
            f"bootstrap={self.bootstrap_servers!r} security.protocol={protocol} "
            f"ledger={self.resolved_ledger_topic!r} (connection {self.conn_id!r}, "
            f"type {self.conn_type!r})"
        )


def _extras(conn: Connection) -> dict[str, Any]:
    raw = conn.extra_dejson or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"connection {conn.conn_id!r}: extra must be a JSON object")
    # The connection form may store fields as extra__<type>__<name>; accept both spellings.
    extras: dict[str, Any] = {}
    for key, value in raw.items():
        for prefix in (f"extra__{NELI_CONN_TYPE}__", f"extra__{KAFKA_CONN_TYPE}__"):
            if key.startswith(prefix):
                key = key[len(prefix) :]
        extras[key] = value
    return extras


def _kafka_config_extra(conn_id: str, value: Any) -> dict[str, Any]:
    if value in (None, ""):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"connection {conn_id!r}: extra 'kafka_config' is not valid JSON ({exc.msg}); "
                'give a JSON object such as {"client.rack": "az1"}'
            ) from None
    if not isinstance(value, dict):
        raise ConfigError(
            f"connection {conn_id!r}: extra 'kafka_config' must be a JSON object of librdkafka "
            f"settings, got {type(value).__name__}"
        )
    return {str(k): v for k, v in value.items()}


def _bootstrap_from_host(conn: Connection) -> str:
    host = (conn.host or "").strip()
    if not host:
        raise ConfigError(
            f"connection {conn.conn_id!r}: host (Bootstrap servers) is empty; set it to "
            "broker1:9092[,broker2:9092]"
        )
    if conn.port and "," not in host and ":" not in host:
        host = f"{host}:{conn.port}"
    return host


def _configured(option: str) -> str | None:
    """An option of the ``[neli]`` Airflow config section (``AIRFLOW__NELI__<OPTION>``)."""
    try:
        from airflow.sdk.configuration import conf

        value = conf.get("neli", option, fallback=None)
    except Exception:  # noqa: BLE001 - no Airflow config available: the caller reports it
        return None
    return value or None


def _neli_connection(conn: Connection, conn_id: str, extras: dict[str, Any]) -> dict[str, Any]:
    """The settings a ``neli`` connection holds: host, SASL login, structured and JSON extras."""
    kafka_config = _kafka_config_extra(conn_id, extras.get("kafka_config"))
    for extra_name, (kafka_key, _, _) in KAFKA_EXTRAS.items():
        value = extras.get(extra_name)
        if value in (None, ""):
            continue
        previous = kafka_config.get(kafka_key)
        if previous not in (None, value):
            raise ConfigError(
                f"connection {conn_id!r}: extra {extra_name!r} and kafka_config "
                f"{kafka_key!r} disagree; set it in one place"
            )
        kafka_config[kafka_key] = value
    if conn.login:
        kafka_config["sasl.username"] = conn.login
    if conn.password:
        kafka_config["sasl.password"] = conn.password
    if conn.login or conn.password:
        protocol = str(kafka_config.get("security.protocol", "PLAINTEXT")).upper()
        if not protocol.startswith("SASL"):
            raise ConfigError(
                f"connection {conn_id!r}: login/password are SASL credentials but "
                f"security_protocol is {protocol}; set security_protocol to SASL_SSL or "
                "SASL_PLAINTEXT (or clear login and password)"
            )
    values = {name: extras.get(name) for name in NeliSettings.model_fields}
    values.update(bootstrap_servers=_bootstrap_from_host(conn), kafka_config=kafka_config)
    return values


def _kafka_connection(conn_id: str, extras: dict[str, Any]) -> dict[str, Any]:
    """The settings a ``kafka`` connection holds: only the librdkafka config in its extras."""
    kafka_config = {str(k): v for k, v in extras.items() if "." in str(k) or str(k) == "debug"}
    bootstrap = str(kafka_config.pop("bootstrap.servers", "") or "").strip()
    if not bootstrap:
        raise ConfigError(
            f"connection {conn_id!r} (type kafka): extra 'bootstrap.servers' is missing; "
            "the kafka connection type keeps the librdkafka config in its extras"
        )
    # A kafka connection's extras are pure librdkafka config: NELI settings come from the
    # hook's arguments and [neli] config, never from unknown keys the client would reject.
    # Consumer settings meant for other hooks (group.id, auto.offset.reset, ...) are the
    # protocol's business here: drop them rather than fail.
    ignored = drop_protocol_owned(kafka_config)
    if ignored:
        logger.info("connection %r: ignoring %s, NELI sets them itself", conn_id, ignored)
    return {"bootstrap_servers": bootstrap, "kafka_config": kafka_config}


def settings_from_connection(
    conn: Connection, **overrides: Unpack[SettingOverrides],
) -> NeliConnectionSettings:
    """Read the NELI settings of a ``neli`` or ``kafka`` connection; ConfigError says what to fix.

    ``overrides`` (:class:`~neli_orchestrate.settings.SettingOverrides`; None values are unset)
    win over the connection's extras; deployment id and namespace fall back to the
    ``[neli] deployment`` / ``[neli] namespace`` Airflow options. There is no default
    namespace: without one the connection is refused.
    """
    given: dict[str, Any] = dict(overrides)
    conn_id = conn.conn_id or "<unnamed>"
    conn_type = (conn.conn_type or "").lower()
    extras = _extras(conn)
    if conn_type == NELI_CONN_TYPE:
        values = _neli_connection(conn, conn_id, extras)
    elif conn_type == KAFKA_CONN_TYPE:
        values = _kafka_connection(conn_id, extras)
    else:
        raise ConfigError(
            f"connection {conn_id!r} has type {conn.conn_type!r}; NeliHook needs a 'neli' or "
            "'kafka' connection (install neli-orchestrate before `airflow connections add "
            "--conn-type neli`, or Airflow stores it as generic)"
        )
    for name, value in given.items():
        if name not in _OVERRIDES:
            raise ConfigError(f"unknown NELI setting {name!r}; known: {list(_OVERRIDES)}")
        if value is not None and name not in ("deployment", "namespace"):
            values[name] = value
    # Deployment id and namespace: argument, else the connection, else the [neli] section.
    for name, example, note in (
        ("deployment", '"us-east-1"', "deployment id"),
        ("namespace", '"acme"', "namespace"),
    ):
        values[name] = given.get(name) or values.get(name) or _configured(name)
        if not values[name]:
            raise ConfigError(
                f"connection {conn_id!r}: no {note}; set the extra {name!r} (e.g. {example}), "
                f"the [neli] {name} option (AIRFLOW__NELI__{name.upper()}) or pass {name}= to "
                "the hook/operator."
                + (" Every deployment that shares runs must use the same namespace."
                   if name == "namespace" else "")
            )
    values["ledger_topic"] = values.get("ledger_topic") or None
    for key, value in values["kafka_config"].items():
        if is_secret_key(key) and isinstance(value, str):
            _mask(value)
    settings: NeliConnectionSettings = parse(
        NeliConnectionSettings, {**values, "conn_id": conn_id, "conn_type": conn_type},
        where=f"connection {conn_id!r}: extra")
    return settings


def _mask(secret: str) -> None:
    try:
        from airflow.sdk.log import mask_secret

        mask_secret(secret)
    except Exception:  # noqa: BLE001 - masking is best effort outside a task process
        logger.debug("could not register a secret with the masker", exc_info=True)


class NeliHook(BaseHook):
    """Build NELI and singleton configuration from an Airflow connection (``neli`` or ``kafka``).

    :param neli_conn_id: the connection; type ``neli`` or the Kafka provider's ``kafka``.
    :param connection: an already fetched connection (triggers fetch it asynchronously).
    :param overrides: settings over the connection's extras of the same name, declared (with
        their meaning, bounds and defaults) once in settings.py
        (:class:`~neli_orchestrate.settings.SettingOverrides`): ``deployment`` (this
        deployment's id; also over ``[neli] deployment``), ``namespace`` (also over
        ``[neli] namespace``; required somewhere), ``ledger_topic``, and the timeouts in seconds
        ``handoff_timeout``, ``acquire_timeout``, ``heartbeat_timeout``, ``session_timeout``,
        ``connect_timeout``. None (or absent) leaves the connection's value.
    """

    conn_name_attr = "neli_conn_id"
    default_conn_name = "neli_default"
    conn_type = NELI_CONN_TYPE
    hook_name = "NELI (Kafka leadership)"

    def __init__(
        self,
        neli_conn_id: str = default_conn_name,
        *,
        connection: Connection | None = None,
        **overrides: Unpack[SettingOverrides],
    ) -> None:
        unknown = sorted(set(overrides) - set(_OVERRIDES))
        if unknown:
            raise TypeError(f"NeliHook() got unexpected keyword argument(s) {unknown}; the "
                            f"settings it takes: {list(_OVERRIDES)}")
        super().__init__()
        self.neli_conn_id = neli_conn_id
        self._overrides = overrides
        self._connection = connection
        self._settings: NeliConnectionSettings | None = None

    def __repr__(self) -> str:
        return f"NeliHook(neli_conn_id={self.neli_conn_id!r})"

    def _get_neli_connection(self) -> Connection:
        from airflow.sdk.exceptions import AirflowNotFoundException

        try:
            return self.get_connection(self.neli_conn_id)
        except AirflowNotFoundException as exc:
            conn_id = self.neli_conn_id
            raise ConfigError(
                f"Airflow connection {conn_id!r} is not defined (in this deployment's "
                f"metadata database, secrets backend or environment); create it, e.g. "
                f"`airflow connections add {conn_id} --conn-type neli --conn-host "
                f"broker1:9092,broker2:9092 --conn-extra "
                f"'{{\"deployment\": \"us-east-1\", \"namespace\": \"acme\"}}'`, or set "
                f"AIRFLOW_CONN_{conn_id.upper()}, or pass neli_conn_id= naming an existing one"
            ) from exc

    @property
    def settings(self) -> NeliConnectionSettings:
        """The connection's NELI settings (read once, cached)."""
        if self._settings is None:
            conn = self._connection or self._get_neli_connection()
            self._settings = settings_from_connection(conn, **self._overrides)
            logger.debug("NELI settings: %s", self._settings.describe())
        return self._settings

    @property
    def deployment(self) -> str:
        """This deployment's id."""
        return self.settings.deployment

    def get_conn(self) -> Singleton:
        """Return a new Singleton for this connection (same as :meth:`get_singleton`)."""
        return self.get_singleton()

    def neli_config(self) -> NeliConfig:
        """Build the protocol core's NeliConfig: connection and timing settings.

        Group and topic stay unset: the singleton layer derives each role's group
        (``<namespace>.<role>``) and the leader topic from the namespace.
        """
        config: NeliConfig = self.settings.neli_config()
        return config

    def singleton_config(self) -> SingletonConfig:
        """Build the SingletonConfig (deployment, ledger topic, handoff/acquire timeouts)."""
        config: SingletonConfig = self.settings.singleton_config()
        return config

    def get_singleton(self) -> Singleton:
        """Return a new :class:`~neli_orchestrate.Singleton`; close it after use."""
        from neli_orchestrate.airflow.metrics import to_airflow_stats
        from neli_orchestrate.singleton.singleton import Singleton

        # Claims, skips, takeovers, fences and time-to-lead go to Airflow's Stats.
        return Singleton(self.singleton_config(), metrics=to_airflow_stats)

    def role_group(self, role: str) -> str:
        """The consumer group whose members compete to lead ``role``."""
        return str(self.singleton_config().role_neli(role).resolved.group_id)

    def role_members(self, role: str) -> int:
        """How many members are in ``role``'s group right now, read-only (no join, no rebalance).

        Non-zero means some deployment leads the role or is trying to: a waiting gate should
        not join then, because every join rebalances the group the running leader is in.
        Raises KafkaUnavailableError when the brokers do not answer.
        """
        return self.get_singleton().role_members(role)

    def test_connection(self) -> tuple[bool, str]:
        """Check that the brokers answer and the ledger topic exists; return (ok, message)."""
        try:
            s = self.settings
        except Exception as exc:  # noqa: BLE001 - the UI shows the message
            return False, f"invalid connection: {exc}"
        timeout = s.connect_timeout
        try:
            admin = s.admin_client(**{
                "socket.timeout.ms": int(timeout * 1000),
                "logger": logging.getLogger("neli_orchestrate.airflow.kafka"),
            })
            metadata = admin.list_topics(timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - KafkaException, config errors, timeouts
            return False, (
                f"cannot reach Kafka at {s.bootstrap_servers} within {timeout:g} s "
                f"({type(exc).__name__}: {_safe_text(str(exc), s)})"
            )
        brokers = len(metadata.brokers)
        ledger = s.resolved_ledger_topic
        topics = (
            f"ledger topic {ledger!r} exists"
            if ledger in metadata.topics
            else f"ledger topic {ledger!r} does not exist yet (created on first use, which "
            "needs the CreateTopics permission)"
        )
        return True, (
            f"reached {brokers} broker(s) at {s.bootstrap_servers}; {topics}; deployment "
            f"{s.deployment!r}, namespace {s.namespace!r}"
        )


def _safe_text(text: str, settings: NeliConnectionSettings) -> str:
    for key, value in settings.kafka_config.items():
        if is_secret_key(key) and isinstance(value, str) and value:
            text = text.replace(value, "***")
    return text
