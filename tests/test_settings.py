"""Each user-facing setting is declared once (neli_orchestrate.settings); no front door drifts.

The Airflow connection form, the hook, the Dagster resource and the command line are built
from the declarations; these tests fail when one of them declares a setting its own way.
"""

from __future__ import annotations

import json
import re
import types
import typing
from typing import Any

import click
import pytest

from neli_orchestrate import settings
from neli_orchestrate.settings import ClusterSettings, NeliSettings

#: Settings a front door need not offer, and why.
NOT_IN_DAGSTER = {"connect_timeout": "a resource makes no test-connection round trip"}


def _plain(annotation: Any) -> Any:
    """The annotation with choices as ``str`` and any value as ``str`` (what Dagster config
    can declare for a Literal or an open mapping)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return str
    if origin in (typing.Union, types.UnionType):
        return typing.Union[tuple(_plain(a) for a in typing.get_args(annotation))]  # noqa: UP007
    if origin is dict:
        return dict[str, str]
    return annotation


def _same_declaration(ours: Any, theirs: Any) -> None:
    assert theirs.description == ours.description
    assert theirs.title == ours.title
    assert theirs.is_required() == ours.is_required()
    assert theirs.default == ours.default and theirs.default_factory == ours.default_factory
    assert theirs.metadata == ours.metadata


def test_dagster_resource_fields_are_the_declared_settings() -> None:
    from neli_orchestrate.dagster import NeliResource

    fields = NeliResource.model_fields
    for name, ours in NeliSettings.model_fields.items():
        if name in NOT_IN_DAGSTER:
            assert name not in fields
            continue
        assert name in fields, f"NeliResource does not offer the setting {name!r}"
        _same_declaration(ours, fields[name])
        assert _plain(fields[name].annotation) == _plain(ours.annotation), name


def test_a_hand_declared_resource_field_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import Field

    from neli_orchestrate.dagster import NeliResource

    drifted = Field(default=300.0, ge=0, description="Seconds before a take-over.")
    monkeypatch.setitem(NeliResource.model_fields, "handoff_timeout", drifted)
    with pytest.raises(AssertionError):
        test_dagster_resource_fields_are_the_declared_settings()


def test_airflow_form_fields_are_generated_from_the_settings() -> None:
    from neli_orchestrate.airflow.provider import CONN_FIELDS, KAFKA_EXTRAS

    generated = [name for name in NeliSettings.model_fields if name != "bootstrap_servers"]
    assert set(CONN_FIELDS) == set(generated) | set(KAFKA_EXTRAS)
    for name in generated:
        info, spec = NeliSettings.model_fields[name], CONN_FIELDS[name]
        assert spec["label"] == info.title
        assert spec["description"].startswith(str(info.description))
        assert spec["schema"]["type"] == [settings.kind(name), "null"]
        assert spec["schema"].get("enum") == settings.choices(name)


def _connection(extra: dict[str, Any]) -> Any:
    from airflow.sdk import Connection

    return Connection(conn_id="c", conn_type="neli", host="b:9092", extra=json.dumps(extra))


SAMPLES = {"deployment": "eu-1", "namespace": "acme2", "ledger_topic": "acme2.runs",
           "kafka_config": {"client.rack": "az2"}, "connect_timeout": 3.5,
           "profile": "fast", "group_protocol": "classic", "session_timeout": 4.0,
           "heartbeat_timeout": 1.0, "handoff_timeout": 99.0, "acquire_timeout": 7.0,
           "max_attempts": 4, "liveness_timeout": 12.0,
           "region_urls": {"eu-1": "https://airflow.eu-1.example", "us-1": "http://u:8080"}}


def test_the_hook_reads_every_form_field_into_the_settings() -> None:
    from neli_orchestrate.airflow.hooks.neli import settings_from_connection

    assert set(SAMPLES) == set(NeliSettings.model_fields) - {"bootstrap_servers"}
    read = settings_from_connection(_connection(SAMPLES))
    for name, value in SAMPLES.items():
        assert getattr(read, name) == value, name
    assert read.bootstrap_servers == "b:9092"
    # and the one conversion carries them to the core
    config = read.singleton_config()
    assert (config.handoff_timeout, config.acquire_timeout, config.max_attempts) == (99, 7, 4)
    assert config.liveness_timeout == 12.0
    assert (config.neli.session_timeout, config.neli.group_protocol) == (4.0, "classic")


def _all_commands(group: click.Command, path: str = "") -> list[tuple[str, click.Command]]:
    found = [(path, group)]
    if isinstance(group, click.Group):
        for name, command in group.commands.items():
            found += _all_commands(command, f"{path} {name}".strip())
    return found


def test_cli_options_named_after_a_setting_come_from_its_declaration() -> None:
    from neli_orchestrate.cli import cli as main
    from neli_orchestrate.cli._context import CLUSTER_OPTIONS, SettingOption

    names = set(NeliSettings.model_fields) | {"timeout"}
    checked = 0
    for path, command in _all_commands(main):
        cluster = "namespace" in {p.name for p in command.params}
        for param in command.params:
            if param.name not in names or not isinstance(param, click.Option):
                continue
            if param.name == "timeout" and not cluster:
                continue  # e.g. `kafka start --timeout`: waiting for a local broker
            assert isinstance(param, SettingOption), (
                f"`{path}` declares --{param.name} itself: use setting_option({param.name!r})")
            info = settings.declaration(param.setting)
            assert param.help in (info.description, param.help)
            if isinstance(param.type, click.Choice):
                assert list(param.type.choices) == settings.choices(param.setting)
            checked += 1
    assert checked >= 4
    assert set(CLUSTER_OPTIONS.values()) <= set(ClusterSettings.model_fields)


def test_the_cli_target_is_the_cluster_settings() -> None:
    from neli_orchestrate.cli._context import Target

    assert issubclass(Target, ClusterSettings)
    assert set(Target.model_fields) == set(ClusterSettings.model_fields)


def test_front_door_errors_name_the_setting_and_the_fix() -> None:
    from neli_orchestrate.errors import ConfigError

    base = {"bootstrap_servers": "b:1", "namespace": "acme", "deployment": "d"}
    for given, message in [({"acquire_timeout": 0}, "'acquire_timeout' must be > 0"),
                           ({"handoff_timeout": True}, "'handoff_timeout'"),
                           ({"profile": "turbo"}, "['default', 'fast']"),
                           ({"kafka_config": {"sasl.password": "pw", "group.id": "g"}},
                            "'group.id'")]:
        with pytest.raises(ConfigError, match=re.escape(message)) as info:
            settings.parse(NeliSettings, {**base, **given}, where="setting")
        assert "pw" not in str(info.value)


def test_the_protocol_imports_no_pydantic() -> None:
    import subprocess
    import sys

    code = ("import sys, neli_orchestrate.singleton, neli_orchestrate.core, "
            "neli_orchestrate.ledger; print('pydantic' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr
