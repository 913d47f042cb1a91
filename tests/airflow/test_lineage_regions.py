"""OpenLineage of one singleton run seen from two real Airflow 3.3 regions.

Each region is a real deployment (its own AIRFLOW_HOME and SQLite database; ``airflow dags
test`` runs the DAG through the real task runner) with apache-airflow-providers-openlineage
and its file transport; both use the real broker. "eu-west-1" runs the date (the gate claims,
the fenced try runs the work: a Delta write through the token-checked delta-rs sink, whose
commit it returns); then "us-east-1" runs the same date, and its gate skips it as completed
elsewhere, with the asset event by proxy. Every COMPLETE event's ``neli`` run facet must agree
on role, run key and token, name eu-west-1 as the deployment that ran it, and differ in
``proxy``; each facet validates against the schema in the package. The fenced try's event
names the Delta table with its version as its output.
"""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from integration.regions.regions import AirflowRegion, RegionConfig, neli_connection

pytestmark = [pytest.mark.airflow, pytest.mark.kafka]

REPO = Path(__file__).resolve().parents[2]
RAN, PROXY = "eu-west-1", "us-east-1"
ROLE = "lineage_producer"

PRODUCER = """
import pendulum
from airflow.sdk import DAG, Asset, task
from neli_orchestrate.airflow import LeaderGateOperator

with DAG("lineage_producer", schedule="@daily", start_date=pendulum.datetime(2013, 1, 1),
         catchup=False) as dag:
    gate = LeaderGateOperator(task_id="claim_run", role="lineage_producer", poke_interval=1,
                              timeout=120)

    @task(outlets=[Asset("lineage_table")])
    def job(neli_claim=None):
        # a token-checked Delta write (delta-rs) whose commit the task returns: the sink
        # reports its table and version, which the fenced try's lineage names as its output
        import pyarrow as pa
        from neli_orchestrate.sinks.delta import write_deltalake_fenced

        return write_deltalake_fenced(
            pa.table({{"date": [neli_claim["run_key"]], "flights": [1]}}), {table!r},
            neli_claim["run_key"], neli_claim["token"], role=neli_claim["role"],
            deployment=neli_claim["deployment"])

    gate >> job()
"""


def region(tmp_path: Path, name: str, bootstrap: str, namespace: str) -> tuple[AirflowRegion, Path]:
    base = tmp_path / name
    dags = base / "dags"
    dags.mkdir(parents=True)
    (dags / "lineage_producer.py").write_text(
        textwrap.dedent(PRODUCER.format(table=str(base.parent / "lake" / "flights"))))
    settings = base / "local_settings"
    settings.mkdir()
    (settings / "airflow_local_settings.py").write_text(
        "from neli_orchestrate.airflow.policy import dag_policy  # noqa: F401\n")
    events = base / "openlineage.jsonl"
    config = RegionConfig(
        name,
        connections={"neli_default": neli_connection(
            bootstrap, name, namespace=namespace, profile="fast", session_timeout=6,
            heartbeat_timeout=2, acquire_timeout=10)},
        connection_source="environment",
        env={
            "PYTHONPATH": f"{settings}:{REPO}",
            # the provider's file transport: one JSON event per line
            "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
                {"type": "file", "log_file_path": str(events), "append": True}),
            "AIRFLOW__OPENLINEAGE__NAMESPACE": name,
        },
    )
    deployment = AirflowRegion(base / "region", dags, config)
    deployment.prepare()
    return deployment, events


def outputs(events: Path, task: str) -> list[dict[str, Any]]:
    """The outputs of the task's COMPLETE event."""
    for line in events.read_text().splitlines():
        event = json.loads(line)
        if event["job"]["name"].endswith(f".{task}") and event["eventType"] == "COMPLETE":
            return list(event.get("outputs") or [])
    raise AssertionError(f"no COMPLETE event of {task} in {events}")


def neli_facets(events: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """The ``neli`` run facet of each (task, eventType) in the region's OpenLineage file."""
    assert events.exists(), f"no OpenLineage events written to {events}"
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for line in events.read_text().splitlines():
        event = json.loads(line)
        task = event["job"]["name"].rsplit(".", 1)[-1]
        facet = event["run"]["facets"].get("neli")
        if facet is not None:
            found[(task, event["eventType"])] = facet
    return found


@pytest.mark.timeout(600)
def test_a_run_and_its_proxy_tell_the_same_story_in_openlineage(
    warm_broker: str, tmp_path: Path
) -> None:
    import jsonschema

    from neli_orchestrate.lineage.facet import SCHEMA_URL, schema_file

    schema = json.loads(schema_file(SCHEMA_URL).read_text())
    namespace = f"lineage{uuid.uuid4().hex[:8]}"
    ran, ran_events = region(tmp_path, RAN, warm_broker, namespace)
    proxy, proxy_events = region(tmp_path, PROXY, warm_broker, namespace)

    for deployment in (ran, proxy):
        result = deployment.cli("dags", "test", "lineage_producer", "2013-01-05", timeout=300)
        assert result.returncode == 0, result.stdout[-5000:]

    there, here = neli_facets(ran_events), neli_facets(proxy_events)
    for key in (("claim_run", "COMPLETE"), ("job", "COMPLETE")):
        assert key in there, f"{RAN}: no neli facet on {key}:\n{ran_events.read_text()}"
    assert ("claim_run", "COMPLETE") in here, f"{PROXY}:\n{proxy_events.read_text()}"
    gate, job = there[("claim_run", "COMPLETE")], there[("job", "COMPLETE")]
    proxied = here[("claim_run", "COMPLETE")]
    assert ("job", "COMPLETE") not in here  # skipped here: it did not run
    for facet in (gate, job, proxied):
        jsonschema.validate(facet, schema)
        assert facet["_schemaURL"] == SCHEMA_URL
        assert (facet["role"], facet["deployment"]) == (ROLE, RAN)
    # one run: the same run key and token everywhere
    assert gate["run_key"] == job["run_key"] == proxied["run_key"]
    assert gate["token"] == job["token"] == proxied["token"]
    # the region that ran it records it; the other records a proxy of it
    assert (gate["recorded_by"], gate["proxy"], gate["state"]) == (RAN, False, "CLAIMED")
    assert (job["recorded_by"], job["proxy"], job["state"]) == (RAN, False, "COMPLETED")
    assert (proxied["recorded_by"], proxied["proxy"], proxied["state"]) == (PROXY, True,
                                                                            "COMPLETED")
    # the offsets of the records each reports: the claim below the completion it read
    assert gate["ledger_offset"] < job["ledger_offset"] == proxied["ledger_offset"]
    # the fenced try names the table the sink committed, with its Delta version
    [table] = outputs(ran_events, "job")
    assert (table["namespace"], table["name"]) == ("file", str(tmp_path / "lake" / "flights"))
    assert table["facets"]["version"]["datasetVersion"] == "1"  # 0: the empty table it created
    assert outputs(proxy_events, "claim_run") == []  # a proxy writes nothing
