"""`neli-orchestrate status` shows which deployments are alive, and since when (real broker)."""

from __future__ import annotations

import time

import pytest
from cli_helpers import cli, new_namespace, singleton

from neli_orchestrate.liveness import AnnouncerConfig, LivenessAnnouncer

pytestmark = pytest.mark.kafka


def test_status_lists_deployments_alive_and_gone_with_since_and_not_as_roles(
        kafka_broker) -> None:
    namespace = new_namespace()
    with singleton(kafka_broker, namespace, "eu-west-1") as west:
        assert west.run("hourly", "2013-01-01T05", lambda run: None) is None  # topics exist
    before = time.time()
    announcers = [LivenessAnnouncer(AnnouncerConfig(
        bootstrap_servers=kafka_broker, namespace=namespace, deployment=name, timeout=1.0,
        poll_interval=0.1, component="test")).start() for name in ("eu-west-1", "us-east-1")]
    try:
        assert all(a.wait_joined(60) for a in announcers)
        out = cli("status", "-b", kafka_broker, "-n", namespace, "--json")
        assert out.code == 0, out.stderr
        data = out.json()
        deployments = {d["deployment"]: d for d in data["deployments"]}
        assert {n: d["state"] for n, d in deployments.items()} == {
            "eu-west-1": "ALIVE", "us-east-1": "ALIVE"}
        assert before - 1 <= deployments["eu-west-1"]["since"] <= time.time()
        assert deployments["eu-west-1"]["timeout"] == 1.0
        assert [r["role"] for r in data["roles"]] == ["hourly"]  # liveness groups are no roles
        table = cli("status", "-b", kafka_broker, "-n", namespace)
        assert "deployments (liveness in Kafka)" in table.stdout
        assert "us-east-1" in table.stdout and "ALIVE" in table.stdout
    finally:
        announcers[1].close()
    deadline = time.monotonic() + 30
    while True:
        states = {d["deployment"]: d["state"] for d in cli(
            "status", "-b", kafka_broker, "-n", namespace, "--json").json()["deployments"]}
        if states["us-east-1"] == "GONE":
            break
        assert time.monotonic() < deadline, states
        time.sleep(0.2)
    assert states["eu-west-1"] == "ALIVE"
    # whether each deployment's announcer runs (Airflow: neli.liveness_announcer_up)
    up = {d["deployment"]: d["announcer_up"] for d in cli(
        "status", "-b", kafka_broker, "-n", namespace, "--json").json()["deployments"]}
    assert up == {"eu-west-1": True, "us-east-1": False}
    table = " ".join(cli("status", "-b", kafka_broker, "-n", namespace).stdout.split())
    assert "deployment us-east-1: no liveness announcer runs" in table, table
    assert "deployment eu-west-1: no liveness announcer runs" not in table
    announcers[0].close()
