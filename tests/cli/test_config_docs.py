"""docs/guide/configuration.md is generated from the configuration classes and must be current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "guide" / "configuration.md"
GENERATOR = [sys.executable, str(REPO / "integration" / "gen_config_docs.py")]


def test_committed_configuration_reference_matches_the_classes() -> None:
    check = subprocess.run([*GENERATOR, "--check"], capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, (
        f"{check.stderr}\ndocs/guide/configuration.md is stale:"
        " run `python integration/gen_config_docs.py`")


def test_a_stale_reference_is_caught(tmp_path) -> None:
    stale = tmp_path / "configuration.md"
    text = REFERENCE.read_text()
    stale.write_text(text.replace("| `handoff_timeout` | `float` | `300.0`",
                                  "| `handoff_timeout` | `float` | `30.0`", 1))
    assert stale.read_text() != text
    check = subprocess.run([*GENERATOR, "--check", "--output", str(stale)], capture_output=True,
                           text=True, timeout=300)
    assert check.returncode == 1 and "is stale" in check.stderr


def test_every_front_door_is_in_the_reference() -> None:
    text = REFERENCE.read_text()
    for heading in ("`SingletonConfig`", "`NeliConfig`", "`KafkaLedgerConfig`",
                    "Airflow connection", "Dagster resource", "Timing profiles"):
        assert heading in text
    # values come from the code: the fast profile's session timeout, a protected setting
    from neli_orchestrate.core.config import PROFILES, PROTECTED_KAFKA_SETTINGS

    assert f"| `fast` | {PROFILES['fast'].session_timeout:g} |" in text
    assert all(f"| `{key}` |" in text for key in PROTECTED_KAFKA_SETTINGS)

