"""The chaos summary reports the running time beside the take-over, and reads older result
files, which have no running time, as not measured (no components needed)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from integration.chaos.run import markdown, summarize, trials_held  # noqa: E402


def trial(n: int, takeover: list[float], running: list[float] | None) -> dict[str, Any]:
    result: dict[str, Any] = {
        "scenario": "rolling-restart", "trial": n, "fault_injected": True, "error": None,
        "duplicates": 0, "lost": 0, "fenced_as_expected": None, "takeover_seconds": takeover,
        "seconds": 100.0, "report": {"faults": [{"detail": "restarted in 20 s"}]},
    }
    if running is not None:
        result["running_seconds"] = running
    return result


def test_running_percentiles_beside_the_takeover_and_old_results_count_as_not_measured() -> None:
    old = trial(1, [857.0], None)  # written before the running time was recorded
    table = summarize([old, trial(2, [12.0], [21.0]), trial(3, [14.0], [25.0])])
    row = table["rolling-restart"]
    assert (row["takeover_p50_s"], row["takeover_p99_s"]) == (14.0, 857.0)
    assert (row["running_p50_s"], row["running_p99_s"], row["running_measured"]) == (
        21.0, 25.0, 2)
    text = markdown(table, "### t")
    assert "running_p50_s | running_p99_s" in text and "| 21.0 | 25.0 |" in text
    only_old = summarize([old])["rolling-restart"]
    assert (only_old["running_p50_s"], only_old["running_measured"]) == (None, 0)
    assert "| - | - |" in markdown({"rolling-restart": only_old}, "### t")


def test_fill_counts_the_trials_held_per_scenario_and_spark_master(tmp_path: Path) -> None:
    import json

    for n, master in [(1, None), (2, "local-cluster"), (3, None)]:
        result = trial(n, [12.0], [20.0])
        if master:
            result["spark_master"] = master
        (tmp_path / f"rolling-restart-{n:03d}.json").write_text(json.dumps(result))
    assert trials_held(tmp_path, "rolling-restart", None) == 2
    assert trials_held(tmp_path, "rolling-restart", "local-cluster") == 1
    assert trials_held(tmp_path, "kill-mid-job", None) == 0
