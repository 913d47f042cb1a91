"""Benchmark the ways of running a DAG under Airflow's real task supervisor, for tests.

Usage::

    python integration/airflow/bench_harness.py [--trials 2]

Ways, each a fresh deployment with its own AIRFLOW_HOME and SQLite database, running the same
one-task DAG (a BashOperator) for one logical date:

- ``harness``: this directory's AirflowRegion: DB copied from a migrated template, DAGs
  serialized once (``dags reserialize``), api-server + scheduler (LocalExecutor) [+ triggerer];
  runs created through the REST API.
- ``standalone``: ``airflow standalone`` (api-server, scheduler, dag-processor, triggerer; it
  migrates the DB itself); run created through the REST API once the DAG is parsed.
- ``dags-test``: ``airflow dags test --use-executor`` against a running api-server (the
  execution API the supervisor talks to); one process per DAG run.

Reported per way: seconds to ready, seconds for the DAG run, CPU seconds of every process the
way started (user + system, so a loaded machine's wall-clock noise is visible), and peak RSS.

Writes ``integration/bench/results/airflow_harness.json`` and ``airflow_harness.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from integration.regions.regions import (  # noqa: E402
    AIRFLOW,
    MARKER_ENV,
    AirflowRegion,
    RegionConfig,
    template_database,
)

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"

DAG = """
import pendulum
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG

with DAG("bench_one_task", schedule=None, start_date=pendulum.datetime(2013, 1, 1, tz="UTC")):
    BashOperator(task_id="echo", bash_command="echo hello")
"""


class Sampler:
    """Samples CPU time and RSS of every process carrying a marker in its environment."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.cpu: dict[int, float] = {}
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> None:
        import psutil

        rss = 0
        for proc in psutil.process_iter(["pid"]):
            try:
                if proc.environ().get(MARKER_ENV) != self.marker:
                    continue
                times = proc.cpu_times()
                self.cpu[proc.pid] = (
                    times.user + times.system + times.children_user + (times.children_system)
                )
                rss += proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        self.peak_rss = max(self.peak_rss, rss)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(0.5)

    @property
    def cpu_seconds(self) -> float:
        return sum(self.cpu.values())


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.5)


def _dag_listed(region: AirflowRegion) -> bool:
    try:
        return bool(region.api("GET", "/api/v2/dags/bench_one_task"))
    except Exception:  # noqa: BLE001 - not parsed yet / api not up
        return False


def _run_once(region: AirflowRegion) -> float:
    start = time.monotonic()
    run_id = region.trigger("bench_one_task", "2013-01-01")
    states = region.wait_for_runs("bench_one_task", [run_id], timeout=600)
    assert states[run_id] == "success", states
    return time.monotonic() - start


def way_harness(root: Path, triggerer: bool) -> dict[str, Any]:
    dags = root / "dags"
    region = AirflowRegion(root, dags, RegionConfig("harness", triggerer=triggerer))
    with Sampler(region.marker) as sampler:
        start = time.monotonic()
        region.prepare()
        region.launch()
        region.wait_healthy(300)
        ready = time.monotonic() - start
        try:
            run = _run_once(region)
            sampler.sample()
        finally:
            region.stop()
    return {
        "ready_s": ready,
        "run_s": run,
        "cpu_s": sampler.cpu_seconds,
        "peak_rss_mb": sampler.peak_rss / 2**20,
    }


def way_standalone(root: Path) -> dict[str, Any]:
    dags = root / "dags"
    region = AirflowRegion(root, dags, RegionConfig("standalone", dag_processor=True))
    region.home.mkdir(parents=True)
    env = region.environ()
    with Sampler(region.marker) as sampler:
        start = time.monotonic()
        log = open(region.home / "standalone.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            [AIRFLOW, "standalone"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        try:
            region._procs["standalone"] = proc  # so stop() ends its process group
            region.wait_healthy(600)
            _wait(lambda: _dag_listed(region), 300, "DAG never parsed")
            ready = time.monotonic() - start
            run = _run_once(region)
            sampler.sample()
        finally:
            region.stop()
    return {
        "ready_s": ready,
        "run_s": run,
        "cpu_s": sampler.cpu_seconds,
        "peak_rss_mb": sampler.peak_rss / 2**20,
    }


def way_dags_test(root: Path) -> dict[str, Any]:
    dags = root / "dags"
    region = AirflowRegion(root, dags, RegionConfig("dagstest", triggerer=False))
    with Sampler(region.marker) as sampler:
        start = time.monotonic()
        region.prepare()
        env = region.environ()
        log = open(region.home / "api-server.log", "ab")  # noqa: SIM115
        api = subprocess.Popen(
            [AIRFLOW, "api-server"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        region._procs["api-server"] = api
        try:
            _wait(lambda: _api_up(region), 300, "api-server never answered")
            ready = time.monotonic() - start
            t = time.monotonic()
            result = subprocess.run(
                [AIRFLOW, "dags", "test", "bench_one_task", "2013-01-01", "--use-executor"],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            run = time.monotonic() - t
            assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
            sampler.sample()
        finally:
            region.stop()
    return {
        "ready_s": ready,
        "run_s": run,
        "cpu_s": sampler.cpu_seconds,
        "peak_rss_mb": sampler.peak_rss / 2**20,
    }


def _api_up(region: AirflowRegion) -> bool:
    try:
        region.api("GET", "/api/v2/monitor/health")
        return True
    except Exception:  # noqa: BLE001
        return False


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="neli-airflow-bench-"))
    (root / "dags").mkdir()
    (root / "dags" / "bench_one_task.py").write_text(DAG)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


WAYS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "harness (api-server + scheduler)": lambda root: way_harness(root, triggerer=False),
    "harness + triggerer": lambda root: way_harness(root, triggerer=True),
    "airflow standalone": way_standalone,
    "dags test --use-executor + api-server": way_dags_test,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    load_before = os.getloadavg()[0]
    t = time.monotonic()
    template_database()
    template_s = time.monotonic() - t
    results: dict[str, list[dict[str, Any]]] = {}
    for name, way in WAYS.items():
        for _ in range(args.trials):
            with workdir() as root:
                results.setdefault(name, []).append(way(root))
            print(name, results[name][-1], flush=True)
    summary = {
        name: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for name, runs in results.items()
    }
    report = {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "template_db_s": template_s,
        "trials": args.trials,
        "results": results,
        "median": summary,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "airflow_harness.json").write_text(json.dumps(report, indent=2))
    lines = [
        "# Running a DAG under Airflow's real task supervisor (one-task DAG, one run)",
        "",
        f"{os.cpu_count()} CPUs, load average {load_before:.2f} before / "
        f"{report['load_after']:.2f} after; medians of {args.trials} trial(s). The migrated "
        f"template DB is built once per Airflow version (here {template_s:.1f} s, cached).",
        "",
        "| way | ready (s) | DAG run (s) | CPU (s) | peak RSS (MB) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, m in summary.items():
        lines.append(
            f"| {name} | {m['ready_s']:.1f} | {m['run_s']:.1f} | {m['cpu_s']:.1f} | "
            f"{m['peak_rss_mb']:.0f} |"
        )
    (RESULTS / "airflow_harness.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
