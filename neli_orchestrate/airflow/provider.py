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


def _field(label: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"label": label, "schema": schema, "description": description}


#: Structured extras of a ``neli`` connection that fill one librdkafka setting each (the form's
#: shortcut for the common security settings): extra -> (librdkafka key, label, choices).
KAFKA_EXTRAS: dict[str, tuple[str, str, list[str] | None]] = {
    "security_protocol": ("security.protocol", "Security protocol",
                          ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]),
    "sasl_mechanism": ("sasl.mechanism", "SASL mechanism",
                       ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI"]),
    "ssl_ca_location": ("ssl.ca.location", "SSL CA file", None),
    "ssl_certificate_location": ("ssl.certificate.location", "SSL client certificate", None),
    "ssl_key_location": ("ssl.key.location", "SSL client key", None),
    "ssl_key_password": ("ssl.key.password", "SSL key password", None),
}

#: What the connection adds to a setting's own description, where Airflow offers more.
_FALLBACKS = {
    "deployment": " Falls back to [neli] deployment (AIRFLOW__NELI__DEPLOYMENT).",
    "namespace": " Falls back to [neli] namespace (AIRFLOW__NELI__NAMESPACE).",
}


def _setting_field(name: str) -> dict[str, Any]:
    """A form field generated from the setting's one declaration (neli_orchestrate.settings)."""
    from neli_orchestrate import settings

    info = settings.declaration(name)
    schema: dict[str, Any] = {"type": [settings.kind(name), "null"]}
    options = settings.choices(name)
    if options:
        schema["enum"] = options
    if info.default is not None and not info.is_required() and info.default_factory is None:
        schema["default"] = info.default
    return _field(str(info.title), schema, str(info.description) + _FALLBACKS.get(name, ""))


def _kafka_field(name: str) -> dict[str, Any]:
    key, label, options = KAFKA_EXTRAS[name]
    schema: dict[str, Any] = {"type": ["string", "null"]}
    if options:
        schema["enum"] = options
    if "password" in name:
        schema["format"] = "password"
    text = f"librdkafka {key}." + (
        " Login/password are used as SASL credentials." if name == "security_protocol" else "")
    return _field(label, schema, text)


def _conn_fields() -> dict[str, dict[str, Any]]:
    from neli_orchestrate.settings import NeliSettings

    fields: dict[str, dict[str, Any]] = {}
    # the host field holds the bootstrap servers; the security shortcuts precede kafka_config
    for name in NeliSettings.model_fields:
        if name == "kafka_config":
            fields.update({extra: _kafka_field(extra) for extra in KAFKA_EXTRAS})
        if name != "bootstrap_servers":
            fields[name] = _setting_field(name)
    return fields


#: Extras of a ``neli`` connection, shown as form fields: every setting of
#: :class:`~neli_orchestrate.settings.NeliSettings` but the bootstrap servers (the host field),
#: and the security shortcuts. NeliHook reads the same names.
CONN_FIELDS: dict[str, dict[str, Any]] = _conn_fields()


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
                    "liveness": {
                        "description": (
                            "Announce this deployment's liveness in Kafka from the scheduler "
                            "(a listener spawns one announcer process; "
                            "docs/guide/guarantees.md), so other deployments take its "
                            "unfinished claims over within liveness_timeout once it is gone. On "
                            "by default; False turns it off (other deployments then wait "
                            "handoff_timeout for its claims)."
                        ),
                        "version_added": "0.1.0",
                        "type": "boolean",
                        "example": "False",
                        "default": "True",
                    },
                    "liveness_components": {
                        "description": (
                            "Airflow components that announce the deployment's liveness, comma "
                            "separated: scheduler, triggerer, dag-processor. The deployment is "
                            "gone only when none of them has announced for liveness_timeout."
                        ),
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "scheduler,triggerer",
                        "default": "scheduler",
                    },
                    "liveness_conn_id": {
                        "description": (
                            "The neli connection whose broker, namespace, deployment and "
                            "liveness_timeout the announcer uses (it may be created after the "
                            "scheduler starts: the announcer retries)."
                        ),
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "neli_us_east_1",
                        "default": "neli_default",
                    },
                },
            }
        },
    }
