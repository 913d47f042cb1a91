"""The `run --hold` chaos scenario (integration/chaos/hold.py) as CI runs it: one trial per
fault, every process of the work sampled from /proc, the history checked with no allowance.

The ≥10-trial series runs outside CI: docs/internals/chaos.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from integration.chaos.history import check, load
from integration.chaos.hold import FAULTS

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[2]


def _chaos(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    out = tmp_path / "results"
    result = subprocess.run(
        [sys.executable, "-m", "integration.chaos.hold", "--out", str(out),
         "--workdir", str(tmp_path / "work"), *args],
        cwd=REPO, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True,
        timeout=900)
    return result, out


@pytest.mark.timeout(1000)
def test_no_fault_lets_two_stints_work_run_at_once(tmp_path: Path) -> None:
    result, out = _chaos(tmp_path, "--trials", "1")
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-6000:]
    table = json.loads((out / "latest" / "summary.json").read_text())["results"]
    assert list(table) == list(FAULTS), table
    for fault in FAULTS:
        row = table[fault]
        assert (row["trials"], row["errors"], row["with_violations"]) == (1, 0, 0), (fault, row)
        assert row["overlap_max_seconds"] == 0.0, (fault, row)
        trial = json.loads((out / "latest" / f"{fault}-001.json").read_text())
        assert trial["takeover_seconds"] and trial["takeover_seconds"] > 0, trial
        assert trial["samples"] > 100 and trial["samples_two_tokens_alive"] == 0, trial
        events = load(out / "latest" / f"{fault}-001.history.jsonl")
        processes = [e for e in events if e["kind"] == "process"]
        # both stints' COMMAND and setsid worker were seen, and the checker agrees
        assert {e["mode"] for e in processes} >= {"worker"}, processes
        assert len({e["token"] for e in processes}) >= 2, processes
        assert check(events, allowance=0.0) == []


@pytest.mark.timeout(600)
def test_the_scenario_catches_a_supervisor_whose_setsid_worker_escapes(tmp_path: Path) -> None:
    """The deliberately broken supervisor (no child subreaper, no cgroup): the setsid worker
    outlives the stop, and the checker reports two tokens' work alive at once."""
    result, out = _chaos(tmp_path, "--trials", "1", "--fault", "double-sigterm",
                         "--broken", "no-subreaper")
    assert result.returncode == 1, (result.stdout + result.stderr)[-6000:]
    trial = json.loads((out / "broken-no-subreaper" / "double-sigterm-001.json").read_text())
    assert trial["overlap_seconds"] > 0.0, trial
    assert any("were alive at once" in v for v in trial["violations"]), trial
