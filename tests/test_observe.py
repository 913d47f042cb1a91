"""The read model is the library's, not the CLI's: no module reaches into another package."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "neli_orchestrate"


def _package(module: str) -> str:
    """``neli_orchestrate.cli.status`` -> ``neli_orchestrate.cli``; top-level modules alone."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_no_module_imports_a_private_name_of_another_package() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                    "neli_orchestrate"):
                continue
            module = node.module or ""
            if _package(module) == _package(here):
                continue
            private = [part for part in module.split(".") if part.startswith("_")]
            private += [a.name for a in node.names if a.name.startswith("_")
                        and not a.name.startswith("__")]
            if private:
                found.append(f"{here} imports {private} from {module}")
    assert found == []


def test_the_cli_and_the_airflow_page_read_through_the_read_model() -> None:
    import importlib

    from neli_orchestrate import observe
    from neli_orchestrate.airflow.plugins import leadership

    status, ledger, _output = (importlib.import_module(f"neli_orchestrate.cli.{name}")
                               for name in ("status", "ledger", "_output"))

    assert status.collect_status is observe.collect_status
    assert ledger._entry_json is observe.entry_data and _output.when is observe.iso_time
    assert leadership.collect_overview is observe.collect_overview


def test_the_dagster_resource_reads_through_the_read_model(monkeypatch) -> None:
    from neli_orchestrate.dagster import NeliResource, resource

    seen = {}
    monkeypatch.setattr(resource, "collect_overview",
                        lambda *args: seen.setdefault("args", args))
    neli = NeliResource(bootstrap_servers="kafka:9092", deployment="eu-1", namespace="acme",
                        kafka_config={"client.rack": "az1"})
    neli.overview(["daily"], "2013-01-05")
    cluster, deployment, roles, run_key = seen["args"]
    assert (deployment, roles, run_key) == ("eu-1", ["daily"], "2013-01-05")
    assert cluster.names.ledger_topic == "acme.ledger"
    config = cluster.client_config()
    assert config["logger"].name == "neli_orchestrate.librdkafka"
    assert {k: v for k, v in config.items() if k != "logger"} == {
        "bootstrap.servers": "kafka:9092", "client.rack": "az1"}


def test_outcome_phrase_says_where_a_run_was_skipped_by_its_task() -> None:
    from dataclasses import replace

    from neli_orchestrate.decision import skipped_reason
    from neli_orchestrate.ledger.record import LedgerRecord, RunState
    from neli_orchestrate.observe import outcome_phrase

    done = LedgerRecord(role="daily", run_key="2013-01-02", state=RunState.COMPLETED, token=4,
                        deployment="us-east-1", member="m#1", attempt=1, at=1.0)
    assert outcome_phrase(done) == "completed in us-east-1"
    skipped = replace(done, reason=skipped_reason("exit code 99"))
    assert outcome_phrase(skipped) == "skipped by the task in us-east-1"
    failed = replace(done, state=RunState.FAILED, reason="skipped by the task? no: boom")
    assert outcome_phrase(failed) == "failed in us-east-1"


def test_no_module_but_a_package_init_re_exports_what_it_imports() -> None:
    # A name is exported where it is defined; packages' __init__ files gather them (#32). A
    # module that defines nothing is an old path kept importable (spark/delta.py after the
    # sinks moved to sinks/): its whole purpose is to re-export, and it is left alone.
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        defined: set[str] = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Assign):
                defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                defined.add(node.target.id)
        if defined <= {"__all__"}:
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                found += [f"{path.relative_to(PACKAGE.parent)}: {name}"
                          for name in ast.literal_eval(node.value) if name not in defined]
    assert found == [], found


class _Future:
    def __init__(self, answer: object) -> None:
        self.answer = answer

    def result(self, timeout: float | None = None) -> object:
        if isinstance(self.answer, Exception):
            raise self.answer
        from types import SimpleNamespace

        return SimpleNamespace(offset=self.answer)


class _Admin:
    """list_offsets answers per partition, one answer a call, the last one repeated."""

    def __init__(self, answers: dict[int, list[object]]) -> None:
        self.answers = answers
        self.calls = 0

    def list_offsets(self, specs: dict, request_timeout: float) -> dict:
        self.calls += 1
        out = {}
        for tp in specs:
            queue = self.answers[tp.partition]
            out[tp] = _Future(queue.pop(0) if len(queue) > 1 else queue[0])
        return out


def _target(timeout: float):
    from neli_orchestrate.settings import ClusterSettings

    return ClusterSettings(bootstrap_servers="localhost:1", namespace="obs",
                           connect_timeout=timeout)


def test_a_heartbeat_partitions_end_is_asked_again_never_read_as_empty() -> None:
    """-1001 (a leader change) is asked again; one that stays unknown is reported unread, so
    `status` says who leads is not known instead of "no fresh heartbeat: fenced" (issue 31)."""
    from neli_orchestrate.observe import _heartbeat_ends

    admin = _Admin({0: [-1001, -1001, 42], 1: [7]})
    assert _heartbeat_ends(admin, _target(30.0), "obs.neli", 2) == ({0: 42, 1: 7}, {})
    assert admin.calls == 3

    ends, unread = _heartbeat_ends(_Admin({0: [-1001], 1: [RuntimeError("timed out")],
                                           2: [5]}), _target(0.5), "obs.neli", 3)
    assert ends == {2: 5}
    assert set(unread) == {0, 1}
    assert "-1001" in unread[0] and "timed out" in unread[1]
