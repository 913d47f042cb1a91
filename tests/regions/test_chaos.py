"""The chaos suite's kill -9 scenario, as CI runs it: one trial, zero duplicates, zero lost.

The full suite (every scenario, many trials) runs outside CI: docs/internals/chaos.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from integration.chaos.history import check, load

pytestmark = [pytest.mark.airflow, pytest.mark.kafka, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(1500)
def test_kill_9_mid_job_is_taken_over_without_duplicates_or_loss(
    patient_broker: str, tmp_path: Path
) -> None:
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "integration.chaos", "--scenario", "kill-mid-job",
         "--trials", "1", "--bootstrap", patient_broker, "--out", str(tmp_path / "results"),
         "--workdir", str(tmp_path / "work")],
        cwd=REPO, env={**os.environ, "PYTHONPATH": path},
        capture_output=True, text=True, timeout=1400,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    latest = tmp_path / "results" / "latest"
    summary = json.loads((latest / "summary.json").read_text())["results"]
    row = summary["kill-mid-job"]
    assert (row["trials"], row["faults_injected"], row["errors"]) == (1, 1, 0), row
    assert (row["duplicates"], row["lost"]) == (0, 0), row
    trial = json.loads((latest / "kill-mid-job-001.json").read_text())
    (fault,) = trial["report"]["faults"]
    assert fault["kind"] == "kill-mid-job" and fault["pids"], fault
    assert trial["takeover_seconds"], "no new claim after the kill"
    # the take-over as the user feels it: the new owner's Spark application started, after
    # its claim (read from the job's start line in the Spark task's log)
    assert trial["running_seconds"] and trial["running_seconds"][0] > trial["takeover_seconds"][0]
    assert (latest / "kill-mid-job-001.png").read_bytes()[:4] == b"\x89PNG"
    # the trial's history, checked from the file alone (integration/chaos/history.py): the
    # claims of the kill and the take-over, both Spark executions, the table's commit
    assert trial["history_violations"] == [], trial["history_violations"]
    events = load(latest / "kill-mid-job-001.history.jsonl")
    tokens = {e["token"] for e in events if e["kind"] == "ledger"}
    assert len(tokens) >= 2, events  # the killed claim and the take-over's
    assert {e["token"] for e in events if e["kind"] == "process"} <= tokens, events
    assert [e for e in events if e["kind"] == "commit"], events
    assert check(events) == []
