"""SASL settings reach every client through the Dagster resource,
and the password shows up nowhere: logs (librdkafka's included), XCom, metadata, run config.

Each test runs a real singleton run as an ordinary principal holding exactly the documented
ACLs on the secured broker: if any client (member, ledger, admin) missed the credentials, the
broker would refuse it and the run would fail.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import pytest
from security_harness import logged, materialize_a_day

from neli_orchestrate.acls import required_acls

pytestmark = pytest.mark.kafka

TIMINGS = {"profile": "fast", "session_timeout": 10, "heartbeat_timeout": 4}


@pytest.mark.dagster
def test_dagster_resource_passes_sasl_to_every_client_and_keeps_the_secret_out_of_the_run(
        secured_kafka, account, monkeypatch, caplog, capfd) -> None:  # type: ignore[no-untyped-def]
    import dagster as dg

    from neli_orchestrate.dagster import NeliResource

    caplog.set_level(logging.DEBUG)
    user, password = account
    monkeypatch.setenv("NELI_TEST_KAFKA_PASSWORD", password)
    namespace = f"dg{uuid.uuid4().hex[:8]}"
    fields: dict[str, Any] = {
        "bootstrap_servers": secured_kafka.bootstrap_servers, "deployment": "us-east-1",
        "namespace": namespace, "acquire_timeout": 60.0, "handoff_timeout": 60.0, **TIMINGS,
    }
    kafka_config = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                    "sasl.username": user, "debug": "security"}
    names_only = NeliResource(**fields, kafka_config=kafka_config)
    secured_kafka.grant(required_acls(names_only.singleton_config(), f"User:{user}"))
    resource = NeliResource(**fields, kafka_config={
        **kafka_config, "sasl.password": dg.EnvVar("NELI_TEST_KAFKA_PASSWORD")})

    result, executed = materialize_a_day(resource)
    assert result.success
    assert len(executed) == 1
    [materialization] = result.asset_materializations_for_node("flights")
    assert str(executed[0]) in json.dumps({k: str(v) for k, v in
                                           materialization.metadata.items()})
    out, err = capfd.readouterr()
    events = "\n".join(str(event) for event in result.all_events)
    run_config = json.dumps(result.dagster_run.run_config, default=str)
    assert "SCRAM" in logged(caplog), "librdkafka's SASL debug log was not captured"
    for text in (events, run_config, logged(caplog), out, err):
        assert password not in text
