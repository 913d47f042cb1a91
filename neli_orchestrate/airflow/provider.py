"""Airflow provider registration: ``get_provider_info()``, entry point ``apache_airflow_provider``.

Airflow reads this dict (without importing the hooks) to list the provider in
``airflow providers list``, to offer the ``neli`` connection type in the UI with its form
fields, and to register the ``[neli]`` configuration section.
"""

from __future__ import annotations

from typing import Any

from neli_orchestrate import __version__

PACKAGE_NAME = "neli-orchestrate"
CONNECTION_TYPE = "neli"
INTEGRATION = "NELI (Kafka leadership)"
#: The provider's user guide; the same address as ``[project.urls] Documentation`` in
#: pyproject.toml (tests/airflow/test_provider.py keeps them equal).
DOCS_URL = "https://github.com/neli-orchestrate/neli-orchestrate/blob/main/docs/airflow.md"

_STRING = {"type": ["string", "null"]}
_NUMBER = {"type": ["number", "null"]}


def _field(label: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"label": label, "schema": schema, "description": description}


# Extras of a ``neli`` connection, shown as form fields. NeliHook reads the same names.
CONN_FIELDS: dict[str, dict[str, Any]] = {
    "deployment": _field(
        "Deployment id",
        _STRING,
        "This Airflow deployment's region id, e.g. us-east-1. Must differ between deployments "
        "and stay stable. Falls back to [neli] deployment (AIRFLOW__NELI__DEPLOYMENT).",
    ),
    "namespace": _field(
        "Namespace",
        {"type": ["string", "null"]},
        "Required (here or in [neli] namespace); the same in every deployment that coordinates: "
        "groups <namespace>.<role>, leader topic <namespace>.neli, ledger <namespace>.ledger.",
    ),
    "ledger_topic": _field(
        "Ledger topic", _STRING, "Run ledger topic; default <namespace>.ledger."
    ),
    "security_protocol": _field(
        "Security protocol",
        {
            "type": ["string", "null"],
            "enum": ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"],
        },
        "librdkafka security.protocol. Login/password are used as SASL credentials.",
    ),
    "sasl_mechanism": _field(
        "SASL mechanism",
        {
            "type": ["string", "null"],
            "enum": ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI"],
        },
        "librdkafka sasl.mechanism.",
    ),
    "ssl_ca_location": _field("SSL CA file", _STRING, "librdkafka ssl.ca.location."),
    "ssl_certificate_location": _field(
        "SSL client certificate", _STRING, "librdkafka ssl.certificate.location."
    ),
    "ssl_key_location": _field("SSL client key", _STRING, "librdkafka ssl.key.location."),
    "ssl_key_password": _field(
        "SSL key password",
        {"type": ["string", "null"], "format": "password"},
        "librdkafka ssl.key.password.",
    ),
    "kafka_config": _field(
        "Kafka client config",
        {"type": ["object", "null"]},
        "Further librdkafka settings as a JSON object, e.g. "
        '{"client.rack": "use1-az1", "sasl.oauthbearer.method": "oidc"}.',
    ),
    "handoff_timeout": _field(
        "Handoff timeout (s)",
        _NUMBER,
        "How long another deployment respects this deployment's claim before taking over.",
    ),
    "acquire_timeout": _field(
        "Acquire timeout (s)",
        _NUMBER,
        "How long one attempt waits to lead a role before reporting 'wait'.",
    ),
    "max_attempts": _field(
        "Max attempts",
        {"type": ["integer", "null"]},
        "Attempts per run (all deployments) before a run fails for good; empty: no limit.",
    ),
    "heartbeat_timeout": _field(
        "Heartbeat timeout (s)",
        _NUMBER,
        "NELI: a leader that has not seen its own heartbeat for this long fences itself.",
    ),
    "session_timeout": _field(
        "Session timeout (s)",
        _NUMBER,
        "Kafka consumer group session timeout; a dead deployment is replaced after it.",
    ),
    "profile": _field(
        "Timing profile",
        {"type": ["string", "null"], "enum": ["default", "fast"]},
        "NELI timing defaults: 'default' (WAN, 10 s session) or 'fast' (one data centre).",
    ),
    "group_protocol": _field(
        "Group protocol",
        {"type": ["string", "null"], "enum": ["auto", "classic", "consumer"]},
        "Kafka consumer group protocol: empty or 'auto' (KIP-848 when the broker supports it, "
        "else classic; see docs/protocol.md), 'classic' or 'consumer' (KIP-848).",
    ),
    "connect_timeout": _field(
        "Connect timeout (s)",
        {"type": ["number", "null"], "default": 10},
        "Broker round-trip timeout for Test connection and metadata calls.",
    ),
}


def get_provider_info() -> dict[str, Any]:
    """Describe the neli-orchestrate provider to Airflow (its ``provider_info`` entry point)."""
    return {
        "package-name": PACKAGE_NAME,
        "name": "NELI orchestrate",
        "description": (
            "Exactly-once singleton tasks across active-active Airflow deployments in several "
            "regions, with leadership from Kafka consumer groups (NELI)."
        ),
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": DOCS_URL,
                "tags": ["protocol"],
            }
        ],
        "hooks": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["neli_orchestrate.airflow.hooks.neli"],
            }
        ],
        "operators": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "neli_orchestrate.airflow.operators.gate",
                    "neli_orchestrate.airflow.operators.fenced",
                    "neli_orchestrate.airflow.operators.spark_submit",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["neli_orchestrate.airflow.sensors.leader"],
            }
        ],
        "triggers": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["neli_orchestrate.airflow.triggers.leader"],
            }
        ],
        "connection-types": [
            {
                "connection-type": CONNECTION_TYPE,
                "hook-class-name": "neli_orchestrate.airflow.hooks.neli.NeliHook",
                "hook-name": "NELI (Kafka leadership)",
                "conn-fields": CONN_FIELDS,
                "ui-field-behaviour": {
                    "hidden-fields": ["schema"],
                    "relabeling": {
                        "host": "Bootstrap servers",
                        "port": "Port (if Bootstrap servers has none)",
                        "login": "SASL username",
                        "password": "SASL password",
                    },
                    "placeholders": {
                        "host": "broker1:9092,broker2:9092",
                        "login": "only with SASL_PLAINTEXT / SASL_SSL",
                        "deployment": "us-east-1",
                        "namespace": "acme",
                    },
                },
            }
        ],
        "config": {
            "neli": {
                "description": "Defaults for neli-orchestrate hooks and operators.",
                "options": {
                    "deployment": {
                        "description": (
                            "This deployment's region id, used when the connection has no "
                            "'deployment' extra (e.g. a shared `kafka` connection). Every "
                            "deployment that coordinates through the same namespace needs its "
                            "own, stable id."
                        ),
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "us-east-1",
                        "default": None,
                    },
                    "namespace": {
                        "description": (
                            "NELI namespace (consumer group and topic prefix) when neither the "
                            "operator nor the connection sets one. Required somewhere: there is "
                            "no default. Must be the same in every deployment that coordinates."
                        ),
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "acme",
                        "default": None,
                    },
                },
            }
        },
    }
