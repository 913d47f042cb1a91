"""Every setting's default is written once.

A default the layers below need (SingletonConfig's hand-off, acquire and liveness timeouts,
NeliConfig's request timeout) is written in that dataclass; settings.py and every other config
class take it from there. The scan fails when the same setting gets a literal default in two
places, and is shown failing on a deliberate second literal.
"""

from __future__ import annotations

import ast
import shutil
import typing
from collections import defaultdict
from pathlib import Path

import pytest

from neli_orchestrate.errors import ConfigError

PACKAGE = Path(__file__).resolve().parents[1] / "neli_orchestrate"


def _number(node: ast.expr | None) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, int | float)
            and not isinstance(node.value, bool))


def written_twice(root: Path) -> dict[tuple[str, object], list[str]]:
    """{(setting, value): places} of literal defaults written in more than one place.

    A setting is a field of a class (a dataclass field, or a pydantic/Dagster ``Field(default=)``)
    and a ``*_timeout`` parameter that mirrors such a field. The test harness is left out.
    """
    literals: dict[tuple[str, object], list[str]] = defaultdict(list)
    fields: set[str] = set()
    params: list[tuple[str, object, str]] = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative.parts[0] == "testing":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                for statement in node.body:
                    if not (isinstance(statement, ast.AnnAssign)
                            and isinstance(statement.target, ast.Name)):
                        continue
                    name, value = statement.target.id, statement.value
                    fields.add(name)
                    if isinstance(value, ast.Call):
                        value = next((k.value for k in value.keywords if k.arg == "default"),
                                     None)
                    if _number(value):
                        assert isinstance(value, ast.Constant)
                        literals[(name, value.value)].append(f"{relative}:{statement.lineno}")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = node.args
                positional = args.posonlyargs + args.args
                pairs = list(zip(positional[len(positional) - len(args.defaults):],
                                 args.defaults, strict=True))
                pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
                          if d is not None]
                for arg, default in pairs:
                    if arg.arg.endswith("_timeout") and _number(default):
                        assert isinstance(default, ast.Constant)
                        params.append((arg.arg, default.value,
                                       f"{relative}:{node.lineno} ({node.name})"))
    for name, value, where in params:
        if name in fields:
            literals[(name, value)].append(where)
    return {key: places for key, places in literals.items() if len(places) > 1}


def test_no_default_is_written_twice() -> None:
    assert written_twice(PACKAGE) == {}


def test_the_scan_catches_a_default_written_twice(tmp_path: Path) -> None:
    copy = tmp_path / "neli_orchestrate"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "kafka",
                                                                 "table_formats"))
    settings = copy / "settings.py"
    text = settings.read_text()
    assert "default=_default(SingletonConfig, 'handoff_timeout')," in text
    settings.write_text(text.replace("default=_default(SingletonConfig, 'handoff_timeout'),",
                                     "default=300.0,"))
    reader = copy / "liveness.py"
    reader.write_text(reader.read_text().replace(
        "request_timeout: float = NeliConfig.request_timeout) -> None:",
        "request_timeout: float = 10.0) -> None:"))
    found = written_twice(copy)
    assert set(found) == {("handoff_timeout", 300.0), ("request_timeout", 10.0)}, found
    assert any("liveness.py" in place for place in found[("request_timeout", 10.0)])


def test_the_front_doors_defaults_are_the_protocols() -> None:
    """The declarations and the classes below them agree (drift, not only duplication)."""
    from neli_orchestrate import NeliConfig, SingletonConfig
    from neli_orchestrate.ledger.kafka import KafkaLedgerConfig
    from neli_orchestrate.liveness import AnnouncerConfig
    from neli_orchestrate.settings import ClusterSettings, NeliSettings

    singleton = SingletonConfig.__dataclass_fields__
    for name in ("handoff_timeout", "acquire_timeout", "liveness_timeout"):
        assert NeliSettings.model_fields[name].default == singleton[name].default, name
    assert (AnnouncerConfig.__dataclass_fields__["timeout"].default
            == NeliSettings.model_fields["liveness_timeout"].default)
    request = NeliConfig.__dataclass_fields__["request_timeout"].default
    assert ClusterSettings.model_fields["connect_timeout"].default == request
    assert KafkaLedgerConfig.__dataclass_fields__["request_timeout"].default == request


@pytest.mark.parametrize("name", ["handoff_timeout", "acquire_timeout", "liveness_timeout"])
def test_the_dagster_resource_takes_the_declaration(name: str) -> None:
    pytest.importorskip("dagster")
    from neli_orchestrate.dagster.resource import NeliResource
    from neli_orchestrate.settings import NeliSettings

    assert NeliResource.model_fields[name].default == NeliSettings.model_fields[name].default


def hook_redeclarations(hook: type) -> list[str]:
    """The keywords of ``hook.__init__`` that declare a setting their own way. The settings come
    in through ``**overrides: Unpack[SettingOverrides]`` (settings.py's one list); a keyword
    written out must name a NeliSettings field and default to None (unset: the connection's
    value, or the declaration's default, with the declaration's bounds)."""
    import inspect

    from neli_orchestrate.settings import NeliSettings

    found = []
    for name, param in inspect.signature(hook.__init__).parameters.items():
        if name in ("self", "neli_conn_id", "connection"):
            continue
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            if "SettingOverrides" not in str(param.annotation):
                found.append(f"**{name}: not Unpack[SettingOverrides]")
            continue
        if name not in NeliSettings.model_fields:
            found.append(f"{name}: not a setting of settings.py")
        elif param.default is not None:
            found.append(f"{name}: default {param.default!r} (the declaration's applies)")
    return found


def override_drift(overrides: type) -> list[str]:
    """Keys of a settings TypedDict that are not a NeliSettings field typed as the field or
    None (a second declaration that has drifted from the first)."""
    import typing

    from neli_orchestrate.settings import NeliSettings

    found = []
    for name, hint in typing.get_type_hints(overrides).items():
        declared = NeliSettings.model_fields.get(name)
        if declared is None:
            found.append(f"{name}: not a setting of settings.py")
        elif hint != declared.annotation | None:
            found.append(f"{name}: {hint} (declared {declared.annotation})")
    return found


def test_the_hooks_keywords_are_the_declared_settings() -> None:
    from neli_orchestrate.airflow.hooks.neli import NeliHook
    from neli_orchestrate.settings import SettingOverrides

    assert hook_redeclarations(NeliHook) == []
    assert override_drift(SettingOverrides) == []

    class Drifted(NeliHook):
        def __init__(self, neli_conn_id: str = "neli_default", *,
                     handoff_timeout: float | None = 300.0, poll: float | None = None,
                     **rest: typing.Any) -> None:
            super().__init__(neli_conn_id, handoff_timeout=handoff_timeout)

    assert hook_redeclarations(Drifted) == [
        "handoff_timeout: default 300.0 (the declaration's applies)",
        "poll: not a setting of settings.py",
        "**rest: not Unpack[SettingOverrides]"]

    class DriftedOverrides(typing.TypedDict, total=False):
        handoff_timeout: int | None
        poll: float | None
        deployment: str | None

    assert override_drift(DriftedOverrides) == [
        "handoff_timeout: int | None (declared <class 'float'>)",
        "poll: not a setting of settings.py"]


def test_the_hook_takes_each_declared_setting_and_refuses_others() -> None:
    pytest.importorskip("airflow")
    from airflow.models.connection import Connection

    from neli_orchestrate.airflow.hooks.neli import NeliHook, settings_from_connection
    from neli_orchestrate.settings import SettingOverrides

    conn = Connection(conn_id="c", conn_type="neli", host="k:9092",
                      extra='{"deployment": "eu-1", "namespace": "acme", "handoff_timeout": 50}')
    given: dict[str, typing.Any] = {"deployment": "us-1", "namespace": "other",
                                    "ledger_topic": "other.runs", "handoff_timeout": 40.0,
                                    "acquire_timeout": 3.0, "heartbeat_timeout": 2.0,
                                    "session_timeout": 9.0, "connect_timeout": 4.0}
    assert sorted(given) == sorted(SettingOverrides.__annotations__)
    settings = NeliHook("c", connection=conn, **given).settings
    assert {name: getattr(settings, name) for name in given} == given
    # None leaves the connection's value; the declaration's bounds still apply
    assert NeliHook("c", connection=conn, handoff_timeout=None).settings.handoff_timeout == 50
    with pytest.raises(ConfigError, match="handoff_timeout"):
        settings_from_connection(conn, handoff_timeout=-1.0)
    with pytest.raises(TypeError, match="poll"):
        NeliHook("c", connection=conn, poll=1.0)  # type: ignore[call-arg]
