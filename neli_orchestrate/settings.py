"""Every user-facing setting, declared once: where the cluster is, who this deployment is, timings.

Usage::

    settings = NeliSettings(bootstrap_servers="kafka:9092", namespace="acme",
                            deployment="us-east-1", profile="fast")
    singleton = Singleton(settings.singleton_config())      # the one conversion

    cluster = ClusterSettings(bootstrap_servers="kafka:9092", namespace="acme")
    cluster.ledger_config()                                  # what a reader of the ledger needs

The front doors are built from these declarations, not beside them: the Airflow connection form
(:data:`neli_orchestrate.airflow.provider.CONN_FIELDS`) and :class:`NeliHook
<neli_orchestrate.airflow.hooks.neli.NeliHook>`, the Dagster resource's fields
(:class:`~neli_orchestrate.dagster.NeliResource`, through :func:`field`), the command line's
options and docs/guide/configuration.md. tests/test_settings.py fails when one of them drifts.

The protocol underneath (:class:`~neli_orchestrate.NeliConfig`,
:class:`~neli_orchestrate.SingletonConfig`) stays plain dataclasses: it holds many
more settings than a front door shows, and imports no pydantic.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any, Literal, TypedDict, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.fields import FieldInfo

from neli_orchestrate.core.client_settings import KafkaSettings, client_settings
from neli_orchestrate.core.config import PROFILES, PROTECTED_KAFKA_SETTINGS, NeliConfig
from neli_orchestrate.core.confluent import new_admin, new_consumer, new_producer
from neli_orchestrate.core.namespace import Namespace, derive
from neli_orchestrate.errors import ConfigError
from neli_orchestrate.singleton.config import SingletonConfig

__all__ = ["ClusterSettings", "NeliSettings", "SettingOverrides", "choices", "declaration",
           "drop_protocol_owned", "field", "kind", "parse"]

#: The group protocols a setting may name (None: the core's default, ``auto``).
GroupProtocolName = Literal["auto", "classic", "consumer"]

def drop_protocol_owned(kafka_config: dict[str, Any]) -> list[str]:
    """Remove from ``kafka_config`` the librdkafka settings the protocol sets itself
    (``group.id``, ``enable.auto.commit``, ...), which ``ClusterSettings.kafka_config`` refuses;
    the removed keys, sorted. For config shared with other Kafka clients (the extras of an
    Airflow ``kafka`` connection), where such keys are meant for those clients."""
    dropped = sorted(k for k in kafka_config if k.strip().lower() in PROTECTED_KAFKA_SETTINGS)
    for key in dropped:
        del kafka_config[key]
    return dropped


def _default(config: type, name: str) -> Any:
    """The default of field ``name`` of the protocol's dataclass ``config``: a value the layers
    below need is written once, there, and every declaration here takes it from there
    (tests/test_settings_declared_once.py fails on a default written twice)."""
    return {f.name: f.default for f in dataclasses.fields(config)}[name]


#: The brokers a command line connects to when none are named (the core's default).
DEFAULT_BOOTSTRAP_SERVERS: str = _default(NeliConfig, "bootstrap_servers")

#: The numeric settings (seconds, attempts).
_NUMBERS = ("connect_timeout", "session_timeout", "heartbeat_timeout", "handoff_timeout",
            "acquire_timeout", "max_attempts", "liveness_timeout")


class ClusterSettings(BaseModel):
    """Where a deployment's shared Kafka resources are: what every reader and writer needs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap_servers: str = Field(
        min_length=1,
        title="Bootstrap servers",
        description="Kafka bootstrap servers shared by every deployment, "
        "'host:port[,host:port]'.",
    )
    namespace: str = Field(
        title="Namespace",
        description="Namespace every Kafka name derives from (role groups '<namespace>.<role>', "
        "leader topic '<namespace>.neli', ledger '<namespace>.ledger'). Required; the same in "
        "every deployment that shares runs, whatever front door it uses.",
    )
    ledger_topic: str | None = Field(
        default=None,
        title="Ledger topic",
        description="Compacted run-ledger topic (unset: '<namespace>.ledger'); the same in every "
        "deployment.",
    )
    kafka_config: dict[str, Any] = Field(
        default_factory=dict,
        repr=False,  # holds secrets (sasl.password, ssl.key.password)
        title="Kafka client config",
        description="Extra librdkafka settings (security.protocol, sasl.*, ssl.*, client.rack); "
        "keep secrets out of code (Airflow connection, Dagster EnvVar). Settings the protocol "
        "owns are refused.",
    )
    connect_timeout: float = Field(
        default=_default(NeliConfig, 'request_timeout'),
        gt=0,
        title="Connect timeout (s)",
        description="Seconds for one round trip to the brokers when reading or checking "
        "(test connection, status, ledger reads).",
    )

    @field_validator("namespace")
    @classmethod
    def _legal_namespace(cls, value: str) -> str:
        derive(value)  # ConfigError (a ValueError) names what is wrong and where to set it
        return value

    @field_validator("kafka_config")
    @classmethod
    def _unprotected(cls, value: dict[str, Any]) -> dict[str, Any]:
        refused = [f"{key!r}: {PROTECTED_KAFKA_SETTINGS[key.strip().lower()]}" for key in value
                   if key.strip().lower() in PROTECTED_KAFKA_SETTINGS]
        if refused:
            raise ValueError("kafka_config sets settings the protocol owns: " + "; ".join(refused))
        return value

    @field_validator(*_NUMBERS, mode="before", check_fields=False)
    @classmethod
    def _no_bool(cls, value: Any) -> Any:
        # pydantic would read True as 1: a switch is not a number of seconds or attempts
        if isinstance(value, bool):
            raise ValueError(f"must be a number, not {value!r}")
        return value

    @property
    def names(self) -> Namespace:
        """Every Kafka name of the namespace (the core's one derivation)."""
        return derive(self.namespace, ledger_topic=self.ledger_topic)

    def client_config(self, **call: Any) -> KafkaSettings:
        """librdkafka settings for a client of this cluster (contains secrets), from core's one
        builder: ``call`` (this client's own settings) over ``kafka_config`` over the defaults;
        librdkafka's logs go to Python's ``logging``."""
        return client_settings(self.bootstrap_servers, logger="neli_orchestrate.librdkafka",
                               call=call, user=self.kafka_config,
                               defaults=self._client_defaults())

    def _client_defaults(self) -> dict[str, Any]:
        """Defaults a subclass gives its clients (``kafka_config`` may replace them)."""
        return {}

    def admin_client(self, **call: Any) -> Any:
        """A confluent-kafka ``AdminClient`` of this cluster (made by the core's seam)."""
        return new_admin(self.client_config(**call))

    def consumer_client(self, **call: Any) -> Any:
        """A confluent-kafka ``Consumer`` of this cluster; ``call`` names its group and reads."""
        return new_consumer(self.client_config(**call))

    def producer_client(self, **call: Any) -> Any:
        """A confluent-kafka ``Producer`` of this cluster."""
        return new_producer(self.client_config(**call))

    def ledger_config(self) -> Any:
        """The :class:`~neli_orchestrate.ledger.kafka.KafkaLedgerConfig` of a ledger reader: the
        namespace's topic and writers' prefix, never creating the topic."""
        from neli_orchestrate.ledger.kafka import KafkaLedgerConfig
        from neli_orchestrate.singleton.config import ledger_client_settings

        names = self.names
        return KafkaLedgerConfig(
            bootstrap_servers=self.bootstrap_servers,
            topic=names.ledger_topic,
            transactional_id_prefix=names.transactional_id_prefix,
            kafka_config=ledger_client_settings(self.kafka_config),
            create_topic=False,
            replay_timeout=self.connect_timeout,
            request_timeout=self.connect_timeout,
        )


class NeliSettings(ClusterSettings):
    """What a deployment needs to take part in singleton runs (converted by
    :meth:`singleton_config`); unset timings come from the profile."""

    deployment: str = Field(
        min_length=1,
        pattern=r"\S",
        title="Deployment id",
        description="Id of this deployment (region), e.g. 'us-east-1': unique per deployment, "
        "stable across restarts, recorded in the run ledger.",
    )
    profile: str = Field(
        default="default",
        title="Timing profile",
        description="NELI timing profile: 'default' (conservative, clusters across regions) or "
        "'fast' (loopback or one data centre; needs a broker allowing short sessions).",
        json_schema_extra={"enum": list(sorted(PROFILES))},  # type: ignore[dict-item]
    )
    group_protocol: GroupProtocolName | None = Field(
        default=None,
        title="Group protocol",
        description="Kafka group protocol of the roles' consumer groups: None or 'auto' "
        "(KIP-848 when the broker supports it and accepts the session timeout, else classic; "
        "the choice is logged), 'consumer' (KIP-848) or 'classic'.",
    )
    session_timeout: float | None = Field(
        default=None,
        gt=0,
        title="Session timeout (s)",
        description="Kafka group session timeout in seconds (unset: from the profile); a paused "
        "or cut-off deployment loses the role after about this long.",
    )
    heartbeat_timeout: float | None = Field(
        default=None,
        gt=0,
        title="Heartbeat timeout (s)",
        description="NELI heartbeat timeout in seconds (unset: a third of the session timeout): "
        "a leader that has not read back its own heartbeat for this long fences itself.",
    )
    handoff_timeout: float = Field(
        default=_default(SingletonConfig, 'handoff_timeout'),
        ge=0,
        title="Handoff timeout (s)",
        description="Seconds another deployment's CLAIMED record is respected before this "
        "deployment may take the run over; must cover the orchestrator's gate-to-executor "
        "delay.",
    )
    acquire_timeout: float = Field(
        default=_default(SingletonConfig, 'acquire_timeout'),
        gt=0,
        title="Acquire timeout (s)",
        description="Seconds one attempt waits to become leader of the role before it answers "
        "WAIT.",
    )
    liveness_timeout: float = Field(
        default=_default(SingletonConfig, 'liveness_timeout'),
        gt=0,
        title="Liveness timeout (s)",
        description="Seconds of silence after which Kafka shows this deployment gone (its "
        "liveness announcer: the Airflow scheduler listener, the Dagster sidecar); other "
        "deployments then take its unfinished claims over at once. Longer than a routine "
        "restart of the announcing component.",
    )
    max_attempts: int | None = Field(
        default=None,
        ge=1,
        title="Max attempts",
        description="Attempts per run key, in all deployments, before it fails for good "
        "(unset: no limit).",
    )
    region_urls: dict[str, str] = Field(
        default_factory=dict,
        title="Region UI URLs",
        description="Optional UI base URL of each deployment, e.g. {'us-east-1': "
        "'https://airflow.us-east-1.example.com'}: where a run another deployment completed is "
        "linked to that deployment's run (Airflow extra link and NELI page, Dagster "
        "materialization by proxy). Unknown deployments get no link.",
    )

    @field_validator("region_urls", mode="before")
    @classmethod
    def _urls_object(cls, value: Any) -> Any:
        # a connection form or an environment variable gives the JSON object as text
        if isinstance(value, str):
            import json

            try:
                value = json.loads(value)
            except ValueError:
                raise ValueError("must be a JSON object of deployment id -> URL") from None
        return value

    @field_validator("region_urls")
    @classmethod
    def _bare_urls(cls, value: dict[str, str]) -> dict[str, str]:
        return {deployment: url.rstrip("/") for deployment, url in value.items() if url}

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, value: str) -> str:
        if value not in PROFILES:
            raise ValueError(f"is not a timing profile: choose one of {sorted(PROFILES)}")
        return value

    def neli_config(self) -> Any:
        """The protocol core's :class:`~neli_orchestrate.NeliConfig` (group and topic stay
        unset: the singleton layer derives them per role from the namespace)."""
        from neli_orchestrate.core.config import NeliConfig

        options: dict[str, Any] = {"bootstrap_servers": self.bootstrap_servers,
                                   "kafka_config": dict(self.kafka_config),
                                   "profile": self.profile}
        for name in ("group_protocol", "session_timeout", "heartbeat_timeout"):
            if getattr(self, name) is not None:
                options[name] = getattr(self, name)
        return NeliConfig(**options)

    def singleton_config(self) -> Any:
        """The :class:`~neli_orchestrate.SingletonConfig` (the one conversion);
        ConfigError names a setting that does not fit the others."""
        from neli_orchestrate.singleton.config import SingletonConfig

        return SingletonConfig(
            neli=self.neli_config(),
            deployment=self.deployment,
            namespace=self.namespace,
            ledger_topic=self.ledger_topic,
            handoff_timeout=self.handoff_timeout,
            acquire_timeout=self.acquire_timeout,
            max_attempts=self.max_attempts,
            liveness_timeout=self.liveness_timeout,
        )

    def check(self) -> None:
        """Apply the core's checks across settings (heartbeat within the session, ...)."""
        self.singleton_config()


class SettingOverrides(TypedDict, total=False):
    """The :class:`NeliSettings` a front door's code may give over its stored configuration
    (an Airflow connection's extras and ``[neli]`` options): ``NeliHook(conn_id, **overrides)``
    and the operators that build it. Each key is a field above, typed as the field or None, and
    has no default of its own: None or absent means the stored value, else the field's default,
    with the field's bounds (tests/test_settings_declared_once.py checks both)."""

    deployment: str | None
    namespace: str | None
    ledger_topic: str | None
    handoff_timeout: float | None
    acquire_timeout: float | None
    heartbeat_timeout: float | None
    session_timeout: float | None
    connect_timeout: float | None


def field(name: str, model: type[ClusterSettings] = NeliSettings) -> Any:
    """A copy of setting ``name``'s declaration (default, bounds, title, description), for a
    model that must declare its fields itself (a Dagster ``ConfigurableResource``)::

        class NeliResource(dg.ConfigurableResource):
            deployment: str = settings.field("deployment")
    """
    return copy.copy(model.model_fields[name])


def declaration(name: str, model: type[ClusterSettings] = NeliSettings) -> FieldInfo:
    """The declaration of setting ``name`` (read-only: docs, forms, options)."""
    return model.model_fields[name]


def choices(name: str, model: type[ClusterSettings] = NeliSettings) -> list[str] | None:
    """The values setting ``name`` may take, when it is a choice (None otherwise)."""
    info = model.model_fields[name]
    extra = info.json_schema_extra
    listed = extra.get("enum") if isinstance(extra, dict) else None
    if isinstance(listed, list):
        return [str(value) for value in listed]
    for arg in get_args(info.annotation) or (info.annotation,):
        values = get_args(arg) if getattr(arg, "__origin__", None) is Literal else ()
        if values:
            return [str(value) for value in values]
    return None


def kind(name: str, model: type[ClusterSettings] = NeliSettings) -> str:
    """``string``, ``number``, ``integer`` or ``object``: the JSON type of setting ``name``."""
    annotation = model.model_fields[name].annotation
    types = [a for a in (get_args(annotation) or (annotation,)) if a is not type(None)]
    first = getattr(types[0], "__origin__", types[0]) if types else str
    return {float: "number", int: "integer", dict: "object"}.get(first, "string")


def _problem(error: Mapping[str, Any], model: type[ClusterSettings]) -> str:
    """What is wrong with one value, in the words a person fixing a form needs."""
    name = str(error["loc"][0]) if error.get("loc") else ""
    ctx = error.get("ctx") or {}
    kind_of = kind(name, model) if name in model.model_fields else "string"
    bound = {"greater_than": ("gt", ">"), "greater_than_equal": ("ge", ">=")}.get(error["type"])
    if kind_of == "integer":
        minimum = next((getattr(m, "ge", None) for m in model.model_fields[name].metadata
                        if getattr(m, "ge", None) is not None), 1)
        return f"must be a whole number >= {minimum} (or empty for no limit)"
    if bound is not None:
        return f"must be {bound[1]} {ctx.get(bound[0]):g}"
    if kind_of == "number":
        return "must be a number of seconds"
    if error["type"] == "literal_error":
        return f"must be one of {ctx.get('expected')} (or empty)"
    if error["type"] == "string_too_short":
        return "must not be empty"
    message = str(error.get("msg", "is invalid"))
    return message.removeprefix("Value error, ")


def parse(model: type[ClusterSettings], values: Mapping[str, Any], *, where: str) -> Any:
    """Build ``model`` from ``values``; a ConfigError says ``{where} 'name' must be ...``.

    Empty values (None, "") mean "not set": the declared default applies. Settings that do not
    fit together (the core's cross-checks) are reported too, so a front door fails at once.
    """
    given = {key: value for key, value in values.items() if value not in (None, "")}
    try:
        settings = model(**given)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            name = str(error["loc"][0]) if error.get("loc") else "?"
            shown = "" if name == "kafka_config" else f", got {given.get(name, '<missing>')!r}"
            problems.append(f"{where} {name!r} {_problem(error, model)}{shown}")
        raise ConfigError("; ".join(problems)) from None
    if isinstance(settings, NeliSettings):
        settings.check()
    return settings
