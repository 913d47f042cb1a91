"""The chaos suite's Dagster scenario: two Dagster instances, kill -9 mid-step.

Two deployments ("east", "west"), each its own Dagster instance (own ``DAGSTER_HOME``), run the
partitioned ``counted_job`` of ``tests/dagster`` (the two-instance harness of the Dagster tests:
``dagster_region.py`` and ``dagster_test_defs.py``) for the same partition at once, with the
multiprocess executor, so each step runs in a process of its own. Its asset is a
``singleton_asset`` whose work appends ``<role> <run key> <deployment> <token> <pid>`` to
``work.log`` and then works ``NELI_TEST_WORK_SECONDS``. The trial watches ``work.log``; as soon
as the first execution of the partition starts, it kills its step process with SIGKILL (mid-
step), and waits for both deployments to finish. The other deployment, waiting for the run at
the revoke barrier, must take the run over with a larger token once the killed member's session
has expired, and complete it.

Checks, as for the Airflow scenarios: duplicates = 0 (the run key COMPLETED once in the ledger,
and no execution of the work started before the killed one was killed: two live executions),
lost = 0 (COMPLETED), takeover time (kill → the next claim in the ledger).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from integration.regions.evidence import Fault, Observer, Report, Span, assess

logger = logging.getLogger("integration.chaos.dagster")

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "tests" / "dagster"
ROLE = "daily_counted"
DEPLOYMENTS = ("east", "west")
SESSION_TIMEOUT = 10.0
WORK_SECONDS = 8.0


def _harness() -> Any:
    if str(HARNESS) not in sys.path:
        sys.path.insert(0, str(HARNESS))
    import dagster_harness

    return dagster_harness


class DagsterWorld:
    """A broker (LocalKafka, or ``bootstrap``) and a namespace the trials share; each trial
    starts two fresh Dagster instances."""

    def __init__(self, workdir: Path, bootstrap: str | None = None) -> None:
        self.workdir = workdir
        self.kafka: Any = None
        self.bootstrap = bootstrap or ""
        self.namespace = _harness().unique_namespace()

    def __enter__(self) -> DagsterWorld:
        if not self.bootstrap:
            from neli_orchestrate.testing.local_kafka import LocalKafka

            self.kafka = LocalKafka(workdir=self.workdir / "kafka").start(timeout=300)
            self.bootstrap = self.kafka.bootstrap_servers
        return self

    def __exit__(self, *exc: object) -> None:
        if self.kafka is not None:
            self.kafka.stop()

    @property
    def ledger_topic(self) -> str:
        from neli_orchestrate.core.namespace import derive

        return derive(self.namespace).ledger_topic


def run_dagster_trial(world: DagsterWorld, n: int, date: str, out: Path,
                      timeout: float) -> dict[str, Any]:
    from integration.regions.timeline import draw_timeline

    harness = _harness()
    root = world.workdir / f"trial-{n:03d}"
    root.mkdir(parents=True)
    env = {
        "NELI_TEST_SESSION_TIMEOUT": str(SESSION_TIMEOUT),
        "NELI_TEST_WORK_SECONDS": str(WORK_SECONDS),
        # both deployments reach the step before either claims: either may win
        "NELI_TEST_PEERS": ",".join(DEPLOYMENTS),
        # the loser waits for the run at the revoke barrier past the kill and the session
        "NELI_TEST_HANDOFF_TIMEOUT": "120",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    deployments = [harness.make_deployment(name, root, world.bootstrap, world.namespace,
                                           extra_env=env) for name in DEPLOYMENTS]
    observer = Observer([], world.bootstrap, {})  # not started: the trial records what it saw
    began = time.time()
    run_key = date
    error = None
    fault: Fault | None = None
    seen: dict[tuple[str, int], Span] = {}
    try:
        for deployment in deployments:
            deployment.start("counted_job", "multiprocess", [date])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = time.time()
            for role, key, name, token, pid in _work_lines(root):
                if role == ROLE and key == run_key and (name, token) not in seen:
                    span = Span(name, date, now, now, token, pid)
                    seen[(name, token)] = span
                    observer.executions.append(span)
                    if fault is None:
                        os.kill(pid, signal.SIGKILL)
                        at = time.time()
                        span.end = at
                        fault = observer.fault(Fault("kill-mid-step", name, date, at, [pid],
                                                     detail=f"step process {pid}"))
            if all(d.process is not None and d.process.poll() is not None
                   for d in deployments):
                break
            time.sleep(0.05)
        else:
            raise TimeoutError(f"the deployments did not finish within {timeout:g} s")
        for deployment in deployments:
            deployment.wait(timeout=10)
    except Exception as exc:  # noqa: BLE001 - a failed trial is a result, not a crash
        error = f"{type(exc).__name__}: {exc}"
        logger.exception("dagster trial %s", n)
    finally:
        for deployment in deployments:
            deployment.stop()
    history = [r for r in harness.ledger_history(world.bootstrap, world.ledger_topic)
               if r.role == ROLE]
    # an execution lives until its deployment's COMPLETED (or until it was killed)
    for (_name, token), span in seen.items():
        if fault is None or span.end != fault.at:
            done = [r.at for r in history if r.run_key == run_key and r.token == token
                    and str(r.state) in ("COMPLETED", "FAILED")]
            span.end = done[-1] if done else time.time()
    report: Report = assess(observer, history, [date], lambda d: d)
    report.started_at = began
    outcome = report.dates[0]
    result = {
        "scenario": "dagster-kill-mid-step",
        "trial": n,
        "date": date,
        "fault_injected": fault is not None,
        "error": error,
        "duplicates": report.duplicates,
        "lost": report.lost,
        "fenced_as_expected": None,
        "takeover_seconds": outcome.takeover_seconds,
        "ran_in": outcome.ran_in,
        "token": outcome.token,
        "seconds": round(time.time() - began, 1),
        "executions": [[s.region, s.token, s.start, s.end] for s in observer.executions],
        "report": report.to_json(),
    }
    name = f"dagster-kill-mid-step-{n:03d}"
    (out / f"{name}.json").write_text(json.dumps(result, indent=2, default=str))
    draw_timeline(report, observer, history, list(DEPLOYMENTS), out / f"{name}.png",
                  title=f"dagster-kill-mid-step #{n}")
    return result


def _work_lines(root: Path) -> list[tuple[str, str, str, int, int]]:
    path = root / "work.log"
    if not path.exists():
        return []
    lines = []
    for line in path.read_text().splitlines():
        parts = line.split(" ")
        if len(parts) == 5:
            lines.append((parts[0], parts[1], parts[2], int(parts[3]), int(parts[4])))
    return lines
