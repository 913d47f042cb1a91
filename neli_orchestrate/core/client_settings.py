"""The one builder of librdkafka settings: every Kafka client of the package gets its settings here.

Four layers, highest first (docs/internals/design.md, "Kafka client settings")::

    required  >  per call  >  user extras  >  defaults

- **required**: what this client's correctness depends on (``isolation.level`` of a ledger
  reader, ``enable.idempotence`` of a ledger writer, a member's ``group.id``, ...), and
  ``bootstrap.servers`` for every client. A user extra naming one is refused with a
  :class:`~neli_orchestrate.errors.ConfigError` that names the key: never overridden silently.
- **per call**: what the caller chooses for this one client (a probe's ``group.id``, fetch
  sizes, a timeout); it replaces a user extra of the same key.
- **user extras**: ``kafka_config`` (``security.protocol``, ``sasl.*``, ``ssl.*``,
  ``client.rack``, ...).
- **defaults**: the package's defaults, which a user extra may replace: ``client.id``, the short
  first reconnect, and ``logger``, so librdkafka's log lines go to Python's ``logging``.

The result is a :class:`KafkaSettings`; the client constructors of the seam
(:func:`neli_orchestrate.core.confluent.new_admin`, ``new_consumer``, ``new_producer``) accept
nothing else, so no client is made from a dict assembled by hand.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from neli_orchestrate.errors import ConfigError

__all__ = ["KafkaSettings", "client_settings"]


class KafkaSettings(dict[str, Any]):
    """librdkafka settings made by :func:`client_settings` (the only kind a client takes)."""


def _key(name: str) -> str:
    return name.strip().lower()


def client_settings(bootstrap_servers: str, *, logger: str | logging.Logger,
                    required: Mapping[str, Any] | None = None,
                    call: Mapping[str, Any] | None = None,
                    user: Mapping[str, Any] | None = None,
                    defaults: Mapping[str, Any] | None = None,
                    why: Mapping[str, str] | None = None) -> KafkaSettings:
    """The librdkafka settings of one client: ``required > call > user > defaults``.

    ``logger`` (a name or a Logger) is the default ``logger`` setting. ``why`` gives, per
    required key, the reason shown when a user extra sets it. Raises ConfigError if ``user``
    sets a required key (or ``bootstrap.servers``) or if ``bootstrap_servers`` is empty.
    """
    if not isinstance(bootstrap_servers, str) or not bootstrap_servers.strip():
        raise ConfigError("bootstrap_servers must be a non-empty 'host:port[,host:port]'")
    must = {"bootstrap.servers": bootstrap_servers, **dict(required or {})}
    user = dict(user or {})
    reasons = {_key(k): v for k, v in (why or {}).items()}
    refused = [k for k in user if _key(k) in {_key(m) for m in must}]
    if refused:
        detail = "; ".join(
            f"{k!r} ({reasons.get(_key(k), 'the package sets it for this client')})"
            for k in sorted(refused))
        raise ConfigError(f"kafka_config may not set {detail}: remove it from kafka_config")
    if isinstance(logger, str):
        logger = logging.getLogger(logger)
    settings = KafkaSettings({"logger": logger})
    for layer in (defaults, user, call, must):
        settings.update(layer or {})
    return settings
