"""NeliHook turns a `neli` (or the Kafka provider's `kafka`) connection into NELI settings."""

from __future__ import annotations

import json
import re
import socket

import pytest
from airflow.sdk import Connection

from neli_orchestrate.airflow.hooks.neli import NeliHook, redacted, settings_from_connection
from neli_orchestrate.errors import ConfigError

pytestmark = pytest.mark.airflow

SECRET = "s3cr3t-SASL-passw0rd"
KEY_SECRET = "k3y-passw0rd-for-ssl"


def neli(extra: dict | None = None, **fields: object) -> Connection:
    values = {"conn_id": "neli_x", "conn_type": "neli", "host": "b1:9092,b2:9092"}
    values.update(fields)
    return Connection(extra=json.dumps({"deployment": "us-east-1", "namespace": "acme",
                                        **(extra or {})}), **values)


def test_neli_connection_gives_bootstrap_servers_namespace_and_topics() -> None:
    s = settings_from_connection(neli({"namespace": "acme"}))
    assert s.bootstrap_servers == "b1:9092,b2:9092"
    assert s.deployment == "us-east-1"
    assert (s.names.group_id("daily"), s.leader_topic, s.resolved_ledger_topic) == (
        "acme.daily",
        "acme.neli",
        "acme.ledger",
    )


def test_port_field_completes_a_single_host_without_port() -> None:
    s = settings_from_connection(neli(host="broker", port=9093))
    assert s.bootstrap_servers == "broker:9093"


def test_login_and_password_become_sasl_credentials_with_structured_security_extras() -> None:
    conn = neli(
        {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "ssl_ca_location": "/etc/ca.pem",
            "kafka_config": {"client.rack": "use1-az1"},
        },
        login="svc-airflow",
        password=SECRET,
    )
    config = dict(settings_from_connection(conn).client_config())
    assert config.pop("logger").name == "neli_orchestrate.librdkafka"   # librdkafka -> logging
    assert config == {
        "bootstrap.servers": "b1:9092,b2:9092",
        "client.rack": "use1-az1",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "ssl.ca.location": "/etc/ca.pem",
        "sasl.username": "svc-airflow",
        "sasl.password": SECRET,
    }


def test_kafka_config_may_be_given_as_a_json_string() -> None:
    conn = neli({"kafka_config": json.dumps({"client.id": "x"})})
    assert settings_from_connection(conn).kafka_config == {"client.id": "x"}


@pytest.mark.parametrize(
    ("conn", "message"),
    [
        (neli(host=""), "host (Bootstrap servers) is empty"),
        (neli(login="u", password=SECRET), "set security_protocol to SASL_SSL"),
        (
            neli({"security_protocol": "SSL", "kafka_config": {"security.protocol": "SASL_SSL"}}),
            "disagree",
        ),
        (neli({"kafka_config": "{not json"}), "not valid JSON"),
        (neli({"kafka_config": ["a"]}), "must be a JSON object"),
        (neli({"handoff_timeout": "soon"}), "'handoff_timeout' must be a number of seconds"),
        (neli({"acquire_timeout": 0}), "'acquire_timeout' must be > 0"),
        (neli({"max_attempts": "2.5"}), "'max_attempts' must be a whole number >= 1"),
        (
            Connection(conn_id="pg", conn_type="postgres", host="db"),
            "needs a 'neli' or 'kafka' connection",
        ),
    ],
)
def test_invalid_connections_fail_with_an_actionable_message(
    conn: Connection, message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        settings_from_connection(conn)
    assert SECRET not in str(info.value)


def test_missing_deployment_names_every_place_it_can_be_set(monkeypatch) -> None:
    monkeypatch.delenv("AIRFLOW__NELI__DEPLOYMENT", raising=False)
    conn = Connection(conn_id="neli_x", conn_type="neli", host="b:9092")
    with pytest.raises(ConfigError, match="AIRFLOW__NELI__DEPLOYMENT") as info:
        settings_from_connection(conn)
    assert "'deployment'" in str(info.value)


def test_deployment_falls_back_to_the_neli_config_section(monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW__NELI__DEPLOYMENT", "ap-south-1")
    monkeypatch.setenv("AIRFLOW__NELI__NAMESPACE", "acme")
    conn = Connection(conn_id="neli_x", conn_type="neli", host="b:9092")
    assert settings_from_connection(conn).deployment == "ap-south-1"
    assert settings_from_connection(conn).namespace == "acme"
    # an operator argument wins over the connection and the config
    assert settings_from_connection(neli(), deployment="eu-west-1").deployment == "eu-west-1"


def test_kafka_provider_connection_supplies_the_client_config(monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW__NELI__DEPLOYMENT", "eu-west-1")
    conn = Connection(
        conn_id="kafka_default",
        conn_type="kafka",
        extra=json.dumps(
            {
                "bootstrap.servers": "k1:9092",
                "group.id": "my-consumers",
                "auto.offset.reset": "earliest",
                "security.protocol": "SASL_SSL",
                "sasl.password": SECRET,
            }
        ),
    )
    s = settings_from_connection(conn, namespace="acme")
    assert s.bootstrap_servers == "k1:9092"
    assert s.deployment == "eu-west-1"
    assert s.namespace == "acme"
    # consumer settings of other hooks belong to the protocol here: dropped, not passed on
    assert s.kafka_config == {"security.protocol": "SASL_SSL", "sasl.password": SECRET}


def test_kafka_connection_without_bootstrap_servers_is_rejected() -> None:
    conn = Connection(conn_id="k", conn_type="kafka", extra=json.dumps({"client.id": "a"}))
    with pytest.raises(ConfigError, match="'bootstrap.servers' is missing"):
        settings_from_connection(conn, deployment="d")


def test_hook_builds_neli_and_singleton_config_from_the_connection() -> None:
    conn = neli(
        {
            "namespace": "acme",
            "handoff_timeout": 120,
            "acquire_timeout": "30",
            "session_timeout": 6,
            "heartbeat_timeout": 1.5,
            "profile": "fast",
            "max_attempts": 3,
        }
    )
    hook = NeliHook("neli_x", connection=conn)
    config = hook.singleton_config()
    assert config.deployment == "us-east-1"
    assert config.names.ledger_topic == "acme.ledger"
    assert (config.handoff_timeout, config.acquire_timeout) == (120.0, 30.0)
    assert config.max_attempts == 3
    resolved = config.neli.resolved
    assert (resolved.session_timeout, resolved.heartbeat_timeout) == (6.0, 1.5)
    assert resolved.bootstrap_servers == "b1:9092,b2:9092"
    # each role gets its own group in the namespace
    role = config.role_neli("daily").resolved
    assert (role.group_id, role.topic) == ("acme.daily", "acme.neli")
    # hook arguments override the connection
    hook = NeliHook("neli_x", connection=conn, acquire_timeout=2, deployment="eu-west-1")
    assert hook.singleton_config().acquire_timeout == 2.0
    assert hook.deployment == "eu-west-1"


def test_hook_rejects_unknown_and_invalid_settings() -> None:
    with pytest.raises(TypeError, match="handoff_timout"):
        NeliHook("neli_x", handoff_timout=3)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="'acquire_timeout' must be > 0"):
        NeliHook("neli_x", connection=neli(), acquire_timeout=-1).settings  # noqa: B018


def test_hook_reads_the_connection_from_airflow(monkeypatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_NELI_DEFAULT",
        json.dumps(
            {
                "conn_type": "neli",
                "host": "b9:9092",
                "extra": {"deployment": "us-west-2", "namespace": "env"},
            }
        ),
    )
    hook = NeliHook()
    assert hook.neli_conn_id == "neli_default"
    assert (hook.settings.bootstrap_servers, hook.deployment) == ("b9:9092", "us-west-2")


def test_secrets_never_appear_in_repr_description_or_logs(caplog) -> None:
    from airflow.sdk._shared.secrets_masker import redact

    conn = neli(
        {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "PLAIN",
            "ssl_key_password": KEY_SECRET,
        },
        login="user",
        password=SECRET,
    )
    caplog.set_level("DEBUG")
    hook = NeliHook("neli_x", connection=conn)
    settings = hook.settings
    shown = " ".join(
        [
            repr(hook),
            repr(settings),
            settings.describe(),
            repr(hook.neli_config()),
            repr(hook.singleton_config()),
            json.dumps(redacted(settings.client_config()), default=str),
            caplog.text,
        ]
    )
    assert settings.kafka_config["sasl.password"] == SECRET  # the client still gets it
    assert SECRET not in shown
    assert KEY_SECRET not in shown
    # the hook registered the secrets with Airflow's masker: task logs show *** instead
    assert SECRET not in redact(f"oops {SECRET} and {KEY_SECRET}")
    assert KEY_SECRET not in redact(f"oops {KEY_SECRET}")


@pytest.mark.kafka
def test_test_connection_reaches_the_broker(neli_conn) -> None:
    ok, message = NeliHook("n", connection=neli_conn("us-east-1")).test_connection()
    assert ok, message
    assert "reached 1 broker(s)" in message


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_test_connection_reports_an_unreachable_broker_without_secrets() -> None:
    conn = neli(
        {"connect_timeout": 2, "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"},
        host=f"127.0.0.1:{_closed_port()}",
        login="u",
        password=SECRET,
    )
    ok, message = NeliHook("n", connection=conn).test_connection()
    assert not ok
    assert "cannot reach Kafka" in message
    assert SECRET not in message


def test_test_connection_reports_an_invalid_connection() -> None:
    ok, message = NeliHook("n", connection=neli(host="")).test_connection()
    assert (ok, "invalid connection" in message) == (False, True)
