"""`./demo` end to end, as a user runs it: every date once, a PNG, exit 0.

Runs the real demo (two Airflow regions, real spark-submit, kill -9 of a task mid-job) as a
subprocess against the session's broker, then reads the ledger itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from integration.regions.regions import ledger_history

pytestmark = [pytest.mark.airflow, pytest.mark.kafka, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]
DATES = ("2013-01-01", "2013-01-02", "2013-01-03")


@pytest.mark.timeout(2700)
def test_demo_runs_each_date_once_through_a_kill_and_draws_the_timeline(
    patient_broker: str, tmp_path: Path
) -> None:
    # (the demo warms the broker's coordinators up itself)
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    result = subprocess.run(
        [sys.executable, "-m", "integration.regions", "--bootstrap", patient_broker,
         "--workdir", str(tmp_path / "work"), "--output-dir", str(tmp_path),
         # room for a small shared machine (idle 2 cores: about 5 minutes in all)
         "--timeout", "1800"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=2600,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    assert "duplicates = 0, lost = 0" in out, out[-3000:]
    assert "%3|" not in out and "%4|" not in out, "raw librdkafka output on the console"

    report = json.loads((tmp_path / "neli-demo-report.json").read_text())
    assert (report["duplicates"], report["lost"]) == (0, 0), report["problems"]
    (kill,) = report["faults"]
    assert kill["kind"] == "kill"
    killed = next(d for d in report["dates"] if d["date"] == kill["date"])
    assert killed["takeovers"] >= 1, killed

    # From the ledger itself: each date COMPLETED exactly once, under the published token.
    history = ledger_history(patient_broker, report["ledger_topic"])
    completed = Counter(r.run_key for r in history if str(r.state) == "COMPLETED")
    keys = [f"nycflights_daily/{d}T00:00:00+00:00" for d in DATES]
    assert [completed[k] for k in keys] == [1, 1, 1], completed
    # The Delta table's own history (the demo's default sink): the last commit of each date
    # carries the COMPLETED token; an earlier one only a lower, superseded token.
    assert report["sink"] == "delta"
    for outcome in report["dates"]:
        assert outcome["sink_token"] == outcome["token"], outcome
        versions = outcome["table_versions"]
        assert versions and versions[-1][1] == outcome["token"], outcome
        assert all(token <= outcome["token"] for _, token in versions), outcome

    check_asset_events(report)

    png = tmp_path / "neli-demo-timeline.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 20_000
    assert report["leadership"], "the observer saw no leader"
    assert report["executions"], "the observer saw no Spark job"


def check_asset_events(report: dict) -> None:  # type: ignore[type-arg]
    """The table's asset event column (``report["asset_events"]``, read from each region's
    REST API): in every region, for every date, the runner's own event or an event by proxy,
    each naming the runner and the ledger's token. The killed region included: its gate had
    claimed the killed date, and its task's retry, finding it completed by the region that took
    it over, emits the event by proxy (docs/guide/airflow.md, "What the other regions see"),
    also when that retry came while the other region still ran the job: it waits as the gate
    does and uses no try."""
    assert len(report["faults"]) == 1, report["faults"]
    for outcome in report["dates"]:
        events = report["asset_events"][outcome["date"]]
        for region, neli in events.items():
            assert neli is not None, (region, outcome["date"], events)
            assert (neli["deployment"], neli["token"]) == (outcome["ran_in"], outcome["token"])
            assert neli["proxy"] is (region != outcome["ran_in"]), (region, neli)
