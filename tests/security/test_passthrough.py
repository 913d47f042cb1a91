"""SASL settings reach every client through the Airflow connection and the Dagster resource,
and the password shows up nowhere: logs (librdkafka's included), XCom, metadata, run config.

Each test runs a real singleton run as an ordinary principal holding exactly the documented
ACLs on the secured broker: if any client (member, ledger, admin) missed the credentials, the
broker would refuse it and the run would fail.
"""

from __future__ import annotations

import json
import logging
import secrets
import uuid
from typing import Any

import pendulum
import pytest

from neli_orchestrate.acls import required_acls
from neli_orchestrate.ledger import RunState

pytestmark = pytest.mark.kafka

TIMINGS = {"profile": "fast", "session_timeout": 10, "heartbeat_timeout": 4}


@pytest.fixture
def account(secured_kafka) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    user, password = f"svc-{uuid.uuid4().hex[:8]}", f"pw-{secrets.token_hex(8)}-secret"
    secured_kafka.add_user(user, password)
    return user, password


def _logged(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records)


@pytest.mark.airflow
def test_airflow_connection_passes_sasl_to_gate_executor_and_admin(
        secured_kafka, account, monkeypatch, caplog, capfd) -> None:  # type: ignore[no-untyped-def]
    import structlog
    from airflow.sdk import DAG, BaseOperator, Connection

    from neli_orchestrate.airflow.hooks.neli import NeliHook
    from neli_orchestrate.airflow.operators.fenced import fenced
    from neli_orchestrate.airflow.operators.gate import LeaderGateOperator

    caplog.set_level(logging.DEBUG)
    user, password = account
    namespace = f"af{uuid.uuid4().hex[:8]}"
    conn = Connection(
        conn_id="neli_secure", conn_type="neli", host=secured_kafka.bootstrap_servers,
        login=user, password=password,
        extra=json.dumps({"deployment": "us-east-1", "namespace": namespace,
                          "security_protocol": "SASL_PLAINTEXT",
                          "sasl_mechanism": "SCRAM-SHA-512", "acquire_timeout": 60,
                          "handoff_timeout": 60, **TIMINGS,
                          "kafka_config": {"debug": "security"}}))
    monkeypatch.setenv("AIRFLOW_CONN_NELI_SECURE", conn.as_json())
    hook = NeliHook("neli_secure")
    secured_kafka.grant(required_acls(hook.singleton_config(), f"User:{user}"))

    executed: list[int] = []

    class Work(BaseOperator):
        def execute(self, context: Any) -> str:
            executed.append(1)
            return "done"

    logical = pendulum.datetime(2013, 1, 5, tz="UTC")
    with DAG("secure_dag", schedule=None, start_date=logical):
        gate = LeaderGateOperator(task_id="claim_run", role="daily", neli_conn_id="neli_secure",
                                  poke_interval=0.5, timeout=120)
        job = fenced(Work)(task_id="job", neli_conn_id="neli_secure")
        gate >> job

    class TI:
        map_index, try_number = -1, 1

        def __init__(self) -> None:
            self.xcom: dict[str, Any] = {}

        def xcom_push(self, key: str, value: Any) -> None:
            self.xcom[key] = value

        def xcom_pull(self, task_ids: str) -> Any:
            return self.xcom["return_value"]

        def get_first_reschedule_date(self, context: Any) -> None:
            return None

    ti = TI()
    context: dict[str, Any] = {"dag": gate.dag, "ti": ti, "task_instance": ti,
                               "logical_date": logical, "ts": logical.isoformat(),
                               "run_id": "manual__2013-01-05"}
    with structlog.testing.capture_logs() as task_logs:
        gate.render_template_fields(context)
        claim = gate.execute(context)
        ti.xcom["return_value"] = claim
        job.render_template_fields(context)
        assert job.execute(context) == "done"
    assert executed == [1]
    with hook.get_singleton() as singleton:
        latest = singleton.status("daily", claim["run_key"])
        assert latest is not None and latest.state is RunState.COMPLETED
        assert latest.token >= claim["token"]
    assert hook.role_members("daily") == 0

    out, err = capfd.readouterr()
    texts = [json.dumps(ti.xcom, default=str), repr(hook), repr(hook.settings), _logged(caplog),
             json.dumps(task_logs, default=str), out, err]
    assert "SCRAM" in _logged(caplog), "librdkafka's SASL debug log was not captured"
    for text in texts:
        assert password not in text


@pytest.mark.dagster
def test_dagster_resource_passes_sasl_to_every_client_and_keeps_the_secret_out_of_the_run(
        secured_kafka, account, monkeypatch, caplog, capfd) -> None:  # type: ignore[no-untyped-def]
    import dagster as dg

    from neli_orchestrate.dagster import NeliResource, NeliRun, singleton_asset

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

    days = dg.DailyPartitionsDefinition(start_date="2013-01-01", end_date="2013-02-01")
    executed: list[int] = []

    @singleton_asset(partitions_def=days)
    def flights(context: dg.AssetExecutionContext, run: NeliRun) -> int:
        executed.append(run.token)
        return run.token

    result = dg.materialize([flights], resources={"neli": resource}, partition_key="2013-01-05")
    assert result.success
    assert len(executed) == 1
    [materialization] = result.asset_materializations_for_node("flights")
    assert str(executed[0]) in json.dumps({k: str(v) for k, v in
                                           materialization.metadata.items()})
    out, err = capfd.readouterr()
    events = "\n".join(str(event) for event in result.all_events)
    run_config = json.dumps(result.dagster_run.run_config, default=str)
    assert "SCRAM" in _logged(caplog), "librdkafka's SASL debug log was not captured"
    for text in (events, run_config, _logged(caplog), out, err):
        assert password not in text
