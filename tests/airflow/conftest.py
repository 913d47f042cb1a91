"""Fixtures of the Airflow provider tests: connections to the session's real Kafka broker."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
# integration/ (the multi-region harness, integration/regions) is imported as a namespace package.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# In-process Airflow (connections, operators) reads and writes $AIRFLOW_HOME on import: keep it
# out of the user's ~/airflow. Subprocess deployments get their own homes from the harness.
if "AIRFLOW_HOME" not in os.environ:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="neli-airflow-tests-")


@pytest.fixture(scope="session", autouse=True)
def fencing_policy() -> Any:
    """The provider's cluster policy, registered as Airflow does from the ``airflow.policy``
    entry point (an installed wheel has it; a checkout on PYTHONPATH may not)."""
    from airflow import settings

    from neli_orchestrate.airflow import policy

    manager = settings.get_policy_plugin_manager()
    if not policy.policy_loaded():
        manager.register(policy)
    assert policy.policy_loaded()
    return policy


@pytest.fixture
def namespace() -> str:
    """A fresh NELI namespace: its own groups, leader topic and ledger topic."""
    return f"t{uuid.uuid4().hex[:10]}"


NeliConnFactory = Callable[..., Any]


@pytest.fixture(scope="session")
def warm_broker(kafka_broker: str) -> str:
    """The broker after one full claim: offsets and transaction-state topics loaded.

    On a fresh broker the first group commit and the first ``init_transactions()`` wait for
    their coordinators to load (seconds); a member with a 1 s lease fences itself meanwhile.
    Production brokers are long warm; tests start from the same state.
    """
    from airflow.sdk import Connection

    from neli_orchestrate.airflow.hooks.neli import NeliHook

    conn = Connection(
        conn_id="warmup",
        conn_type="neli",
        host=kafka_broker,
        extra=json.dumps({"deployment": "warmup", "namespace": f"warm{uuid.uuid4().hex[:8]}"}),
    )
    with NeliHook("warmup", connection=conn).get_singleton() as singleton:
        reservation = singleton.reserve("warmup", "warmup")
        assert reservation.should_run, reservation
        singleton.execute("warmup", "warmup", reservation.token, lambda run: None)
    return kafka_broker


@pytest.fixture
def neli_conn(warm_broker: str, namespace: str) -> NeliConnFactory:
    """Factory of ``neli`` connections to the test broker: ``neli_conn(deployment, **extras)``.

    Loopback timings with room for a loaded 2-core machine (profile ``fast`` with a 3 s
    session and a 1 s heartbeat lease), short acquire and handoff timeouts so a test of WAIT
    and TAKE_OVER takes seconds.
    """
    from airflow.sdk import Connection

    def make(deployment: str, conn_id: str | None = None, **extras: Any) -> Connection:
        extra = {
            "deployment": deployment,
            "namespace": namespace,
            "profile": "fast",
            "session_timeout": 3,
            "heartbeat_timeout": 1,
            "acquire_timeout": 3,
            "handoff_timeout": 4,
            **extras,
        }
        return Connection(
            conn_id=conn_id or f"neli_{deployment.replace('-', '_')}",
            conn_type="neli",
            host=warm_broker,
            extra=json.dumps(extra),
        )

    return make


@pytest.fixture
def neli_env(neli_conn: NeliConnFactory, monkeypatch: pytest.MonkeyPatch) -> Callable[..., str]:
    """Register a `neli` connection as AIRFLOW_CONN_<ID> for operators; returns its conn id."""

    def make(deployment: str, **extras: Any) -> str:
        conn = neli_conn(deployment, **extras)
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn.conn_id.upper()}", conn.as_json())
        return conn.conn_id

    return make
