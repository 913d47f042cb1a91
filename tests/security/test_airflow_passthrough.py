"""SASL settings reach every client through the Airflow connection,
and the password shows up nowhere: logs (librdkafka's included), XCom, metadata, run config.

Airflow's modules are imported at the top: importing them configures logging and would
replace pytest's capture handler in the middle of a test.

Each test runs a real singleton run as an ordinary principal holding exactly the documented
ACLs on the secured broker: if any client (member, ledger, admin) missed the credentials, the
broker would refuse it and the run would fail.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import pendulum
import pytest
import structlog
from airflow.sdk import DAG, BaseOperator, Connection
from security_harness import logged

from neli_orchestrate.acls import required_acls
from neli_orchestrate.airflow.hooks.neli import NeliHook
from neli_orchestrate.airflow.operators.fenced import fenced
from neli_orchestrate.airflow.operators.gate import LeaderGateOperator
from neli_orchestrate.ledger.record import RunState

pytestmark = pytest.mark.kafka

TIMINGS = {"profile": "fast", "session_timeout": 10, "heartbeat_timeout": 4}


@pytest.mark.airflow
def test_airflow_connection_passes_sasl_to_gate_executor_and_admin(
        secured_kafka, account, monkeypatch, caplog, capfd) -> None:  # type: ignore[no-untyped-def]
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
    texts = [json.dumps(ti.xcom, default=str), repr(hook), repr(hook.settings), logged(caplog),
             json.dumps(task_logs, default=str), out, err]
    assert "SCRAM" in logged(caplog), "librdkafka's SASL debug log was not captured"
    for text in texts:
        assert password not in text


