"""Generate docs/guide/configuration.md from the configuration classes (the one source of truth).

    python integration/gen_config_docs.py           # rewrite docs/guide/configuration.md
    python integration/gen_config_docs.py --check   # exit 1 if the committed file is stale (CI)

Field descriptions come from ``#:`` comments above dataclass fields, from ``- ``name``: ...``
bullets of a class docstring, from pydantic ``Field(description=...)`` and from the Airflow
provider's connection-form metadata; defaults and types from the classes themselves.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import inspect
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

OUTPUT = Path(__file__).resolve().parents[1] / "docs" / "guide" / "configuration.md"

UNDOCUMENTED = "(not documented yet: add a `#:` comment above the field)"
_FIELD = re.compile(r"^    (\w+): ")
_BULLET = re.compile(r"^\s*- ``(\w+)``: (.*)$")


def _cell(text: object) -> str:
    """One table cell: one line, reStructuredText markup as Markdown, pipes escaped."""
    value = " ".join(str(text).split())
    value = re.sub(r"``(.+?)``", r"`\1`", value)
    value = re.sub(r":\w+:`~?([\w.]+)`", r"`\1`", value)
    return value.replace("|", "\\|")


def _comments(cls: type) -> dict[str, str]:
    """``#:`` comments above each field of ``cls``, or an attribute docstring below it."""
    found: dict[str, str] = {}
    pending: list[str] = []
    previous: str | None = None  # the field just above, for an attribute docstring below it
    lines = iter(inspect.getsource(cls).splitlines())
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        if previous and stripped.startswith('"""') and previous not in found:
            text = [stripped[3:]]
            while not text[-1].endswith('"""'):
                text.append(next(lines).strip())
            found[previous] = " ".join(text)[:-3].strip()
            previous = None
            continue
        match = _FIELD.match(line)
        previous = match.group(1) if match else None
        if match and pending:
            found[match.group(1)] = " ".join(pending)
        pending = []
    return found


def _bullets(cls: type) -> dict[str, str]:
    """``- ``field``: text`` bullets of the class docstring (continuation lines joined)."""
    found: dict[str, str] = {}
    current: str | None = None
    for line in (inspect.getdoc(cls) or "").splitlines():
        match = _BULLET.match(line)
        if match:
            current = match.group(1)
            found[current] = match.group(2)
        elif current and line.startswith("  ") and line.strip():
            found[current] += " " + line.strip()
        else:
            current = None
    return found


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
        if isinstance(value, enum.Enum):
            return f"`{type(value).__name__}.{value.name}`"
        return f"`{value!r}`"
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f"`{f.default_factory()!r}`"  # type: ignore[misc]
    return "required"


def _dataclass_table(cls: type, skip: Iterable[str] = ()) -> list[str]:
    docs = {**_bullets(cls), **_comments(cls)}
    rows = ["| Field | Type | Default | Meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if not f.init or f.name in skip:
            continue
        text = docs.get(f.name) or UNDOCUMENTED
        rows.append(f"| `{f.name}` | `{_cell(f.type)}` | {_default(f)} | {_cell(text)} |")
    return rows


def _profiles() -> list[str]:
    from neli_orchestrate.core.config import PROFILES, TimingProfile

    names = [f.name for f in dataclasses.fields(TimingProfile) if f.name != "description"]
    rows = ["| Profile | " + " | ".join(f"`{n}` (s)" for n in names) + " | Use |",
            "|---|" + "---|" * len(names) + "---|"]
    for key, profile in PROFILES.items():
        values = " | ".join(f"{getattr(profile, n):g}" for n in names)
        rows.append(f"| `{key}` | {values} | {_cell(profile.description)} |")
    return rows


def _protected() -> list[str]:
    from neli_orchestrate.core.config import PROTECTED_KAFKA_SETTINGS

    rows = ["| librdkafka setting | Why it is refused in `kafka_config` |", "|---|---|"]
    rows += [f"| `{key}` | {_cell(why)} |" for key, why in PROTECTED_KAFKA_SETTINGS.items()]
    return rows


def _airflow() -> list[str]:
    from neli_orchestrate.airflow.provider import CONN_FIELDS, get_provider_info

    info = get_provider_info()
    [conn] = info["connection-types"]
    relabel = conn["ui-field-behaviour"]["relabeling"]
    rows = [f"Connection type `{conn['connection-type']}` (hook "
            f"`{conn['hook-class-name']}`). Standard fields:", "",
            "| Connection field | Meaning |", "|---|---|"]
    rows += [f"| `{name}` | {_cell(label)} |" for name, label in relabel.items()]
    rows += ["", "Extras (form fields; the same names in the extra JSON):", "",
             "| Extra | Label | Type | Meaning |", "|---|---|---|---|"]
    for name, spec in CONN_FIELDS.items():
        kind = spec["schema"].get("type")
        kind = "/".join(k for k in kind if k != "null") if isinstance(kind, list) else kind
        choices = spec["schema"].get("enum")
        text = spec["description"] + (
            f" One of: {', '.join(f'`{c}`' for c in choices)}." if choices else "")
        rows.append(f"| `{name}` | {_cell(spec['label'])} | {kind} | {_cell(text)} |")
    rows += ["", "Airflow configuration (`airflow.cfg` or `AIRFLOW__NELI__<OPTION>`):", "",
             "| `[neli]` option | Default | Example | Meaning |", "|---|---|---|---|"]
    for name, option in info["config"]["neli"]["options"].items():
        default = option.get("default")
        rows.append(f"| `{name}` | {'-' if default is None else f'`{default}`'} | "
                    f"`{option.get('example')}` | {_cell(option['description'])} |")
    return rows


def _settings() -> list[str]:
    """The settings every front door shares, with the name each front door gives them."""
    from neli_orchestrate.airflow.provider import CONN_FIELDS
    from neli_orchestrate.cli import cli
    from neli_orchestrate.cli._context import CLUSTER_OPTIONS, SettingOption
    from neli_orchestrate.dagster.resource import NeliResource
    from neli_orchestrate.settings import NeliSettings

    options: dict[str, set[str]] = {}
    for option, setting in CLUSTER_OPTIONS.items():
        options.setdefault(setting, set()).add(option)
    commands = [cli]
    while commands:
        command = commands.pop()
        commands += list(getattr(command, "commands", {}).values())
        for param in command.params:
            if isinstance(param, SettingOption):
                options.setdefault(param.setting, set()).add(param.opts[0])
    rows = ["| Setting | Type | Default | Airflow extra | Dagster field | CLI option | Meaning |",
            "|---|---|---|---|---|---|---|"]
    for name, info in NeliSettings.model_fields.items():
        if info.is_required():
            default = "required"
        elif info.default_factory is not None:
            default = f"`{info.default_factory()!r}`"  # type: ignore[call-arg]
        else:
            default = f"`{info.default!r}`"
        bounds = " ".join(f"{sign} {getattr(m, attr):g}" for m in info.metadata
                          for attr, sign in (("gt", ">"), ("ge", ">="))
                          if getattr(m, attr, None) is not None)
        kind = (info.annotation.__name__ if isinstance(info.annotation, type)
                else str(info.annotation).replace("typing.", "")) + (
            f" ({bounds})" if bounds else "")
        airflow = "host" if name == "bootstrap_servers" else (
            f"`{name}`" if name in CONN_FIELDS else "-")
        dagster = f"`{name}`" if name in NeliResource.model_fields else "-"
        cli_options = ", ".join(f"`{o}`" for o in sorted(options.get(name, ()))) or "-"
        rows.append(f"| `{name}` | `{_cell(kind)}` | {default} | {airflow} | {dagster} | "
                    f"{cli_options} | {_cell(info.description or UNDOCUMENTED)} |")
    return rows


def _dagster() -> list[str]:
    from neli_orchestrate.dagster.resource import NeliResource

    rows = ["| Field | Type | Default | Meaning |", "|---|---|---|---|"]
    for name, info in NeliResource.model_fields.items():
        if info.is_required():
            default = "required"
        elif info.default_factory is not None:
            default = f"`{info.default_factory()!r}`"  # type: ignore[call-arg]
        else:
            default = f"`{info.default!r}`"
        annotation = getattr(info.annotation, "__name__", None) or str(info.annotation)
        annotation = annotation.replace("typing.", "")
        rows.append(f"| `{name}` | `{_cell(annotation)}` | {default} | "
                    f"{_cell(info.description or UNDOCUMENTED)} |")
    return rows


def render() -> str:
    """The whole of docs/guide/configuration.md."""
    from neli_orchestrate.core.config import NeliConfig
    from neli_orchestrate.ledger.kafka import KafkaLedgerConfig
    from neli_orchestrate.singleton.config import SingletonConfig

    parts: list[str | list[str]] = [
        "<!-- Generated by integration/gen_config_docs.py from the configuration classes. "
        "Do not edit; run `python integration/gen_config_docs.py`. -->",
        "",
        "# Configuration reference",
        "",
        "Every setting of every front door, generated from the classes that validate it. "
        "Times are seconds. Deployments that share runs must agree on the namespace (and so "
        "on the group, topic and transactional-id names derived from it, see "
        "`neli_orchestrate.core.namespace.derive`) and on the timing profile; each has its own "
        "`deployment` id.",
        "",
        "## Settings of every front door (`neli_orchestrate.settings.NeliSettings`)",
        "",
        "Each setting a deployment gives is declared once, in `neli_orchestrate/settings.py`, "
        "and the Airflow connection, the Dagster resource and the command line are built from "
        "that declaration (tests/test_settings.py fails when one drifts). "
        "`NeliSettings.singleton_config()` is the one conversion to the classes below.",
        "",
        _settings(),
        "",
        "## `SingletonConfig` (plain Python: `neli_orchestrate.SingletonConfig`)",
        "",
        _dataclass_table(SingletonConfig),
        "",
        "## `NeliConfig` (the protocol core: `neli_orchestrate.NeliConfig`)",
        "",
        "Unset (`None`) timings come from the profile; relationships between them are checked "
        "when the config is built (a `ConfigError` names the field and the fix).",
        "",
        _dataclass_table(NeliConfig),
        "",
        "### Timing profiles",
        "",
        _profiles(),
        "",
        "### Settings the protocol owns",
        "",
        _protected(),
        "",
        "## `KafkaLedgerConfig` (the run ledger: "
        "`neli_orchestrate.ledger.kafka.KafkaLedgerConfig`)",
        "",
        "`SingletonConfig.ledger_config()` builds it; set it directly only to read or write "
        "the ledger yourself.",
        "",
        _dataclass_table(KafkaLedgerConfig),
        "",
        "## Airflow connection (`neli`)",
        "",
        _airflow(),
        "",
        "## Dagster resource (`neli_orchestrate.dagster.NeliResource`)",
        "",
        _dagster(),
        "",
    ]
    lines: list[str] = []
    for part in parts:
        lines.extend(part if isinstance(part, list) else [part])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if docs/guide/configuration.md differs from the generated"
                        " text")
    parser.add_argument("--output", type=Path, default=OUTPUT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run `python integration/gen_config_docs.py` and"
                  " commit it", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
