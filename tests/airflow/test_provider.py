"""The provider is discovered by Airflow and describes the `neli` connection for the UI."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from importlib.metadata import distribution, entry_points
from pathlib import Path
from typing import Any

import pytest

from neli_orchestrate.airflow.provider import CONN_FIELDS, get_provider_info

pytestmark = pytest.mark.airflow

REPO = Path(__file__).resolve().parents[2]
AIRFLOW = str(Path(sys.executable).with_name("airflow"))


def test_entry_point_points_at_get_provider_info() -> None:
    points = [
        ep
        for ep in entry_points(group="apache_airflow_provider")
        if ep.value.startswith("neli_orchestrate.")
    ]
    assert [(ep.name, ep.value) for ep in points] == [
        ("provider_info", "neli_orchestrate.airflow.provider:get_provider_info")
    ]
    assert points[0].load() is get_provider_info


def test_policy_entry_point_is_declared_and_no_guessed_docs_url_is() -> None:
    import tomllib

    from neli_orchestrate.airflow import policy

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (target,) = project["entry-points"]["airflow.policy"].values()
    assert importlib.import_module(target) is policy and hasattr(policy.dag_policy, "__name__")
    # until the project has a real home, no link that may not exist
    (integration,) = get_provider_info()["integrations"]
    assert "external-doc-url" not in integration and "urls" not in project


def test_package_name_is_the_distributions_canonical_name() -> None:
    dist = distribution("neli-orchestrate")
    assert get_provider_info()["package-name"] == dist.metadata["Name"].lower().replace("_", "-")
    assert get_provider_info()["versions"] == [dist.version]


def test_provider_info_is_valid_for_airflow() -> None:
    import airflow
    import jsonschema

    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)


def test_neli_connection_type_relabels_host_and_offers_kafka_and_neli_extras() -> None:
    (conn_type,) = get_provider_info()["connection-types"]
    assert conn_type["connection-type"] == "neli"
    assert conn_type["hook-class-name"] == "neli_orchestrate.airflow.hooks.neli.NeliHook"
    behaviour = conn_type["ui-field-behaviour"]
    assert behaviour["relabeling"]["host"] == "Bootstrap servers"
    assert {"login", "password"} <= behaviour["relabeling"].keys()
    fields = conn_type["conn-fields"]
    assert fields is CONN_FIELDS
    for name in (
        "deployment",
        "namespace",
        "security_protocol",
        "sasl_mechanism",
        "ssl_ca_location",
        "ssl_key_password",
        "kafka_config",
        "handoff_timeout",
        "acquire_timeout",
        "session_timeout",
        "heartbeat_timeout",
    ):
        assert name in fields, name
        assert fields[name]["label"] and fields[name]["schema"]
    # The form must mask the key password like a password field.
    assert fields["ssl_key_password"]["schema"]["format"] == "password"
    assert "SASL_SSL" in fields["security_protocol"]["schema"]["enum"]


def test_airflow_providers_list_shows_the_provider(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["AIRFLOW_HOME"] = str(tmp_path)
    listing = subprocess.run(
        [AIRFLOW, "providers", "list", "-o", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listing.returncode == 0, listing.stderr[-2000:]
    start = listing.stdout.index("[")
    providers = {p["package_name"]: p for p in json.loads(listing.stdout[start:])}
    assert "neli-orchestrate" in providers, sorted(providers)
    assert providers["neli-orchestrate"]["version"] == distribution("neli-orchestrate").version

    hooks = subprocess.run(
        [AIRFLOW, "providers", "hooks", "-o", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert hooks.returncode == 0, hooks.stderr[-2000:]
    start = hooks.stdout.index("[")
    by_type = {h["connection_type"]: h for h in json.loads(hooks.stdout[start:])}
    assert by_type["neli"]["class"] == "neli_orchestrate.airflow.hooks.neli.NeliHook"


def test_the_user_guides_first_example_is_the_dag_file_the_tests_run() -> None:
    guide = (REPO / "docs" / "guide" / "airflow.md").read_text()
    example = guide.split("```python\n", 1)[1].split("```", 1)[0].strip()
    dag_file = (REPO / "dags" / "stock_downstream.py").read_text()
    assert example and example in dag_file
    assert "SparkSubmitOperator" in guide.split("```python", 1)[0]  # stock form named first


def test_plugin_entry_point_is_declared_and_loads_the_page_and_the_link() -> None:
    import tomllib

    from airflow.plugins_manager import AirflowPlugin, is_valid_plugin

    from neli_orchestrate.airflow.plugins.leadership import (
        NeliPlugin,
        NeliRanInLink,
        NeliRunLink,
        app,
    )

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (target,) = project["entry-points"]["airflow.plugins"].values()
    module, _, name = target.partition(":")
    plugin = getattr(importlib.import_module(module), name)
    assert plugin is NeliPlugin and issubclass(plugin, AirflowPlugin) and is_valid_plugin(plugin)
    assert plugin.fastapi_apps == [{"app": app, "url_prefix": "/neli", "name": "NELI leadership"}]
    assert [type(link) for link in plugin.global_operator_extra_links] == [NeliRunLink,
                                                                        NeliRanInLink]
    # the provider's "plugins" list would load it a second time (with lazy discovery off)
    assert "plugins" not in get_provider_info()


def test_run_link_points_gate_and_fenced_child_at_the_run_and_nothing_else(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from neli_orchestrate.airflow.plugins import leadership

    rendered = {("d", "gate", "r1", -1): {"role": "daily", "run_key": "d/2013-01-05 x"}}
    monkeypatch.setattr(leadership, "_rendered", lambda *key: rendered.get(key, {}))
    gate = SimpleNamespace(task_id="gate", task_type="LeaderGateOperator",
                           _task_module="neli_orchestrate.airflow.operators.gate",
                           upstream_task_ids=set(), neli_conn_id="neli_eu")
    job = SimpleNamespace(task_id="job", task_type="BashOperator",
                          _task_module="airflow.providers.standard.operators.bash",
                          upstream_task_ids={"gate"})
    after = SimpleNamespace(task_id="after", task_type="BashOperator", _task_module="x",
                            upstream_task_ids={"job"})
    dag = SimpleNamespace(task_dict={"gate": gate, "job": job, "after": after})
    for task in (gate, job, after):
        task.dag = dag
    key = SimpleNamespace(dag_id="d", run_id="r1", map_index=-1)
    link = leadership.NeliRunLink()
    expected = "/neli/?role=daily&run_key=d%2F2013-01-05+x&conn_id=neli_eu&dag_id=d#run"
    assert link.get_link(gate, ti_key=key) == expected
    assert link.get_link(job, ti_key=key) == expected
    assert link.get_link(after, ti_key=key) == ""
    # a run whose gate has not started yet has no rendered fields: no link
    other = SimpleNamespace(dag_id="d", run_id="r2", map_index=-1)
    assert link.get_link(job, ti_key=other) == ""


def test_ran_in_link_of_a_retry_that_found_the_run_taken_over_and_of_what_it_skipped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Not only the gate's XCom: a fenced task whose retry found the run completed by the
    region that took it over records ``neli_done`` itself (operators.fenced)."""
    from types import SimpleNamespace

    from neli_orchestrate.airflow.plugins import leadership

    url = "http://airflow.eu-west-1.invalid/neli/ran?role=daily&token=9"
    xcoms = {("d", "job", "r1", "neli_done"): {"token": 9, "skipped": ["cleanup"], "url": url}}
    monkeypatch.setattr(leadership, "_xcom", lambda *key: xcoms.get(key))
    gate = SimpleNamespace(task_id="gate", task_type="LeaderGateOperator",
                           _task_module="neli_orchestrate.airflow.operators.gate",
                           downstream_task_ids={"job"})
    job = SimpleNamespace(task_id="job", task_type="BashOperator", _task_module="x")
    cleanup = SimpleNamespace(task_id="cleanup", task_type="BashOperator", _task_module="x")
    report = SimpleNamespace(task_id="report", task_type="BashOperator", _task_module="x")
    dag = SimpleNamespace(task_dict={t.task_id: t for t in (gate, job, cleanup, report)})
    for task in dag.task_dict.values():
        task.dag = dag
    link = leadership.NeliRanInLink()
    key = SimpleNamespace(dag_id="d", run_id="r1", map_index=-1)
    assert [link.get_link(t, ti_key=key) for t in (gate, job, cleanup, report)] == [
        "", url, url, ""]


def test_the_plugin_links_proxy_aliases_before_airflow_handles_a_tasks_success(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The api-server's root middleware: a task-state PATCH with events by proxy first links
    alias and asset (alias_links.ensure_links), then reaches Airflow with its body intact;
    other requests pass untouched."""
    import asyncio

    from neli_orchestrate.airflow.plugins import alias_links
    from neli_orchestrate.airflow.plugins.leadership import NeliPlugin

    (entry,) = NeliPlugin.fastapi_root_middlewares
    assert entry["middleware"] is alias_links.ProxyAliasLinks
    linked: list[set[Any]] = []
    monkeypatch.setattr(alias_links, "ensure_links", lambda links: linked.append(set(links)))
    received: list[bytes] = []

    async def airflow(scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        received.append(body)

    payload = json.dumps({"state": "success", "outlet_events": [
        {"dest_asset_key": {"name": "t", "uri": "t"}, "source_alias_name": "neli-proxy/d/g",
         "extra": {}},
        {"dest_asset_key": {"name": "u", "uri": "u"}, "source_alias_name": "user-alias",
         "extra": {}},
        {"dest_asset_key": {"name": "v", "uri": "v"}, "extra": {}}]}).encode()

    def call(method: str, path: str) -> None:
        chunks = [payload[:40], payload[40:]]

        async def receive() -> Any:
            chunk = chunks.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

        scope = {"type": "http", "method": method, "path": path}
        asyncio.run(alias_links.ProxyAliasLinks(airflow)(scope, receive, None))

    call("PATCH", "/execution/task-instances/0199-abc/state")
    assert linked == [{("neli-proxy/d/g", "t", "t")}]
    assert received == [payload]
    call("PATCH", "/api/v2/dags/d")  # not a task's state: untouched
    assert len(linked) == 1 and received[-1] == payload
