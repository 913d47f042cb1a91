"""docs/configuration.md is generated from the configuration classes and must be current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
GENERATOR = [sys.executable, str(DOCS / "gen_config_docs.py")]


def test_committed_configuration_reference_matches_the_classes() -> None:
    check = subprocess.run([*GENERATOR, "--check"], capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, (
        f"{check.stderr}\ndocs/configuration.md is stale: run `python docs/gen_config_docs.py`")


def test_a_stale_reference_is_caught(tmp_path) -> None:
    stale = tmp_path / "configuration.md"
    text = (DOCS / "configuration.md").read_text()
    stale.write_text(text.replace("| `handoff_timeout` | `float` | `300.0`",
                                  "| `handoff_timeout` | `float` | `30.0`", 1))
    assert stale.read_text() != text
    check = subprocess.run([*GENERATOR, "--check", "--output", str(stale)], capture_output=True,
                           text=True, timeout=300)
    assert check.returncode == 1 and "is stale" in check.stderr


def test_every_front_door_is_in_the_reference() -> None:
    text = (DOCS / "configuration.md").read_text()
    for heading in ("`SingletonConfig`", "`NeliConfig`", "`KafkaLedgerConfig`",
                    "Airflow connection", "Dagster resource", "Timing profiles"):
        assert heading in text
    # values come from the code: the fast profile's session timeout, a protected setting
    from neli_orchestrate.core.config import PROFILES, PROTECTED_KAFKA_SETTINGS

    assert f"| `fast` | {PROFILES['fast'].session_timeout:g} |" in text
    assert all(f"| `{key}` |" in text for key in PROTECTED_KAFKA_SETTINGS)


def test_every_page_the_docs_index_links_exists() -> None:
    import re

    index = (DOCS / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+\.md)\)", index)
    assert {"concepts.md", "guarantees.md", "topologies.md", "security.md", "failure-modes.md",
            "cli.md", "configuration.md"} <= set(links)
    missing = [link for link in links if not (DOCS / link).exists()]
    assert missing == []
