"""SASL_SSL: the ssl settings of an Airflow connection reach every client; TLS is verified."""

from __future__ import annotations

import json
import logging
import uuid

import pytest
from airflow.sdk import Connection
from security_harness import logged, materialize_a_day

from neli_orchestrate.acls import required_acls
from neli_orchestrate.airflow.hooks.neli import NeliHook
from neli_orchestrate.errors import KafkaUnavailableError
from neli_orchestrate.ledger.record import RunState

pytestmark = [pytest.mark.kafka, pytest.mark.airflow]


def test_airflow_connection_over_sasl_ssl_runs_a_singleton_and_verifies_the_broker(
        secured_kafka_tls, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)
    user, password = f"svc-{uuid.uuid4().hex[:8]}", f"pw-{uuid.uuid4().hex}-secret"
    secured_kafka_tls.add_user(user, password)
    extra = {"deployment": "us-east-1", "namespace": f"tls{uuid.uuid4().hex[:8]}",
             "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
             "ssl_ca_location": str(secured_kafka_tls.ca_location), "profile": "fast",
             "session_timeout": 10, "heartbeat_timeout": 4, "acquire_timeout": 60,
             "handoff_timeout": 60}
    conn = Connection(conn_id="neli_tls", conn_type="neli", login=user, password=password,
                      host=secured_kafka_tls.bootstrap_servers, extra=json.dumps(extra))
    hook = NeliHook("neli_tls", connection=conn)
    secured_kafka_tls.grant(required_acls(hook.singleton_config(), f"User:{user}"))
    with hook.get_singleton() as singleton:
        reservation = singleton.reserve("daily", "2013-01-05")
        assert reservation.should_run, reservation
        ran = singleton.execute("daily", "2013-01-05", reservation.token, lambda run: run.token)
        latest = singleton.status("daily", "2013-01-05")
        assert latest is not None and latest.state is RunState.COMPLETED
        assert latest.token == ran
        assert singleton.role_members("daily") == 0
    assert password not in logged(caplog)

    # Without the CA the client cannot verify the broker's certificate: no connection at all.
    untrusted = Connection(conn_id="neli_tls", conn_type="neli", login=user, password=password,
                           host=secured_kafka_tls.bootstrap_servers,
                           extra=json.dumps({**extra, "ssl_ca_location": "",
                                             "connect_timeout": 5, "acquire_timeout": 5}))
    with NeliHook("neli_tls", connection=untrusted).get_singleton() as singleton, \
            pytest.raises(KafkaUnavailableError):
        singleton.status("daily", "2013-01-05")


@pytest.mark.dagster
def test_dagster_resource_over_sasl_ssl_runs_a_singleton_asset_and_verifies_the_broker(
        secured_kafka_tls, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    import dagster as dg

    from neli_orchestrate.dagster import NeliResource

    caplog.set_level(logging.DEBUG)
    user, password = f"svc-{uuid.uuid4().hex[:8]}", f"pw-{uuid.uuid4().hex}-secret"
    secured_kafka_tls.add_user(user, password)
    monkeypatch.setenv("NELI_TEST_KAFKA_PASSWORD", password)
    fields = {"bootstrap_servers": secured_kafka_tls.bootstrap_servers,
              "deployment": "us-east-1", "namespace": f"tlsdg{uuid.uuid4().hex[:8]}",
              "profile": "fast", "session_timeout": 10, "heartbeat_timeout": 4,
              "acquire_timeout": 60.0, "handoff_timeout": 60.0}
    tls = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
           "sasl.username": user, "ssl.ca.location": str(secured_kafka_tls.ca_location)}
    names_only = NeliResource(**fields, kafka_config=tls)
    secured_kafka_tls.grant(required_acls(names_only.singleton_config(), f"User:{user}"))
    resource = NeliResource(**fields, kafka_config={
        **tls, "sasl.password": dg.EnvVar("NELI_TEST_KAFKA_PASSWORD")})
    result, executed = materialize_a_day(resource)
    assert result.success and len(executed) == 1
    # Outside a Dagster run EnvVar fields are not resolved: read back with a literal password.
    reader = NeliResource(**fields, kafka_config={**tls, "sasl.password": password})
    latest = reader.status("flights", "2013-01-05")
    assert latest is not None and latest.state is RunState.COMPLETED
    assert latest.token == executed[0]
    assert password not in logged(caplog)

    # Without the CA the client cannot verify the broker's certificate: no connection at all.
    untrusted = NeliResource(**{**fields, "acquire_timeout": 5.0}, kafka_config={
        **tls, "ssl.ca.location": "", "sasl.password": password})
    with pytest.raises(KafkaUnavailableError):
        untrusted.status("flights", "2013-01-05")
