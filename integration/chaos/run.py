"""Chaos suite: inject faults into real Airflow regions and a real Kafka broker; count
duplicates and lost runs.

Usage::

    python -m integration.chaos --trials 5                       # every scenario, 5 trials each
    python -m integration.chaos --scenario kill-mid-job --trials 20
    python -m integration.chaos --scenario stop-past-session --broken no-fence   # must FAIL
    python -m integration.chaos --spark-master local-cluster --scenario kill-mid-job

One invocation starts the local Kafka (one broker, or ``--kafka-nodes 3``) and two regions
once, then runs the trials one after another, round robin over the scenarios, each on a date
(run key) of its own, after the last date any trial in the results directory used:
trigger the nycflights DAG for the date in every region at once, inject the scenario's fault,
wait for every run to end, and check (integration.regions.evidence):

- duplicates = 0: no run key COMPLETED twice, no two live Spark executions of the date
  overlapping in time (beyond the fence allowance; a frozen worker is not live); with the Delta
  sink (default) every commit of the date in the table's history carries the COMPLETED token or
  a lower, superseded one, the last carries the COMPLETED token and the rows are its rows (with
  ``--sink directory``: the published output's token equals the COMPLETED record's);
- lost = 0: the date is COMPLETED;
- the faulted region's Spark task FAILED with a fencing reason, where the scenario fences it;
- takeover time: fault → the other region's claim;
- running time: fault → the Spark application that continues the run *started* (its
  SparkContext's start time, which the job logs once it exists and the harness reads from the
  Spark task's log in each region): the take-over as the user feels it. Also recorded per
  trial: fault → its driver JVM seen (``launch_seconds``; running minus launch is Spark's own
  start-up).

Each trial writes ``<out>/<scenario>-<n>.json`` and ``.png`` (timeline); the run writes
``<out>/summary.json`` and ``summary.md``. Exit status 1 when any trial has a duplicate, a lost
run or a missing fence. See docs/internals/chaos.md for the scenarios and the latest results.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from integration.chaos.history import check as check_history
from integration.chaos.history import record as record_history
from integration.chaos.history import write as write_history
from integration.regions.evidence import Fault, kill_tree
from integration.regions.world import (
    SINKS,
    SPARK_TASK,
    Settings,
    World,
    log_to_file,
    remove_workdir,
    run_key_of,
    spark_master_arg,
    task_pids,
)

logger = logging.getLogger("integration.chaos")

REPO = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
FIRST_DATE = dt.date(2013, 2, 1)
REGION_NAMES = ("us-east-1", "eu-west-1", "ap-south-1")
#: Airflow settings of the chaos regions: a region killed or restarted leaves task instances
#: "running" under a dead scheduler job; Airflow resets them (orphaned_tasks_check_interval,
#: default 300 s, once the job is older than scheduler_health_check_threshold) or fails them
#: when their heartbeats stop (task_instance_heartbeat_timeout, default 300 s). Shorter, so a
#: trial's runs end in about a minute rather than five; what happens is the same.
CHAOS_REGION_ENV = {
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "15",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "20",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
}


@dataclass
class Trial:
    world: World
    date: str
    runs: dict[str, dict[str, str]]
    started: float
    #: undo steps of the fault, run after the trial's checks (e.g. restart a killed broker)
    after: list[Callable[[], None]] = field(default_factory=list)

    def claims(self) -> list[Any]:
        key = run_key_of(self.date)
        return [r for r in self.world.history()
                if r.run_key == key and str(r.state) == "CLAIMED"]

    def wait_claim(self, *, not_by: str, above: int, timeout: float = 300.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for claim in self.claims():
                if claim.deployment != not_by and claim.token > above:
                    return claim
            time.sleep(0.5)
        raise TimeoutError(f"{self.date}: no region but {not_by} claimed within {timeout:g} s")


# -- scenarios: each injects its fault and returns it (or None when the window was missed) --


def kill_before_claim(trial: Trial) -> Fault | None:
    """kill -9 the first task process of the trial seen in any region, before any claim.

    Every run of the previous trial has ended, so the first Airflow task process
    (``airflow worker -- <task instance id>``) that appears is a gate (``claim_run``): the
    process table alone is polled (every 50 ms), no REST call stands between its start and
    the kill. The fault's detail says whether a claim of the run key already existed then (a
    missed window; counted in the table's ``window_missed``)."""
    import psutil

    world = trial.world
    observer = world.observer
    assert observer is not None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        for proc in psutil.process_iter(["pid", "cmdline"]):
            title = " ".join(proc.info["cmdline"] or [])
            if not title.startswith("airflow worker -- ") or "LocalExecutor" in title:
                continue
            region = observer._region_of_pid(proc.pid)
            if region is None:
                continue
            at = time.time()
            killed = kill_tree(proc.pid, signal.SIGKILL)
            earlier = [c for c in trial.claims() if c.at < at]
            detail = "gate process, before any claim" if not earlier else (
                f"gate process, after {earlier[0].deployment}'s claim at token "
                f"{earlier[0].token} (window missed)"
            )
            return observer.fault(
                Fault("kill-before-claim", region, trial.date, at, killed, detail=detail)
            )
        time.sleep(0.05)
    return None


def kill_mid_job(trial: Trial) -> Fault | None:
    """kill -9 the task process running the Spark job (and spark-submit under it) mid-job."""
    span = trial.world.wait_mid_job([trial.date])
    return trial.world.kill_task(span, kind="kill-mid-job")


def kill_after_job(trial: Trial) -> Fault | None:
    """kill -9 the task process after its job published the output, before COMPLETED."""
    world = trial.world
    key = run_key_of(trial.date)
    deadline = time.monotonic() + 600
    spark_pids: dict[str, list[int]] = {}
    while time.monotonic() < deadline:
        for name, by_date in trial.runs.items():
            pids = task_pids(world.region(name), by_date[trial.date], SPARK_TASK)
            if pids:
                spark_pids[name] = pids
        committed = world.sink_committed(trial.date)
        if committed is not None:
            deployment, _token = committed
            pids = spark_pids.get(deployment) or task_pids(
                world.region(deployment), trial.runs[deployment][trial.date], SPARK_TASK,
            )
            at = time.time()
            killed = [p for pid in pids for p in kill_tree(pid, signal.SIGKILL)]
            done = any(r.run_key == key and str(r.state) == "COMPLETED"
                       for r in world.history())
            detail = "after publish, COMPLETED already written" if done else "after publish"
            return world.observer.fault(  # type: ignore[union-attr]
                Fault("kill-after-job", deployment, trial.date, at, killed, detail=detail)
            )
        time.sleep(0.05)
    return None


def _wait_new_owner_running(world: Any, trial: Any, span: Any) -> None:
    """Wait (up to 300 s) for another region's claim above ``span`` and for its Spark job to
    start, so a zombie that is not fenced would run beside it."""
    claim = trial.wait_claim(not_by=span.region, above=span.token or -1)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if any(s.token == claim.token for s in world.observer.running_jvms()):
            return
        time.sleep(0.2)


def stop_past_session(trial: Trial) -> Fault | None:
    """SIGSTOP the running task (and its Spark job) past the session timeout; SIGCONT once the
    other region has claimed the run and started its own job."""
    world = trial.world
    span = world.wait_mid_job([trial.date])
    import psutil

    task_pid = psutil.Process(span.pid).ppid()  # type: ignore[arg-type]
    pids = kill_tree(task_pid, signal.SIGSTOP)
    fault = world.observer.fault(  # type: ignore[union-attr]
        Fault("stop-past-session", span.region, trial.date, time.time(), pids,
              detail=f"task pid {task_pid}")
    )
    try:
        _wait_new_owner_running(world, trial, span)
    finally:
        for pid in pids:
            with _quiet():
                psutil.Process(pid).send_signal(signal.SIGCONT)
        fault.resumed_at = time.time()
    return fault


def broker_restart(trial: Trial) -> Fault | None:
    """Stop the broker mid-job (SIGTERM), keep it down past the session timeout, start it
    again with its data."""
    from neli_orchestrate.testing.local_kafka import restart_broker

    world = trial.world
    span = world.wait_mid_job([trial.date])
    at = time.time()
    down = world.settings.session_timeout + 2
    restart_broker(world.kafka, down=down)
    return world.observer.fault(  # type: ignore[union-attr]
        Fault("broker-restart", span.region, trial.date, at, [], detail=f"down {down:g} s")
    )


def ledger_leader_kill(trial: Trial) -> Fault | None:
    """Three-broker cluster: kill -9 the broker leading the ledger partition mid-job (it is
    restarted after the trial)."""
    world = trial.world
    cluster = world.kafka
    if not hasattr(cluster, "leader_of"):
        raise RuntimeError("ledger-leader-kill needs --kafka-nodes 3")
    span = world.wait_mid_job([trial.date])
    node = cluster.leader_of(world.ledger_topic, 0)
    at = time.time()
    cluster.kill(node)
    trial.after.append(lambda: cluster.restart(node))
    return world.observer.fault(  # type: ignore[union-attr]
        Fault("ledger-leader-kill", span.region, trial.date, at, [],
              detail=f"broker node {node}")
    )


def rolling_restart(trial: Trial) -> Fault | None:
    """Restart every region in turn, as an upgrade does (stop: SIGTERM then SIGKILL; start;
    wait healthy), beginning mid-job with the region running the job; the next region is
    restarted once the previous one is healthy again."""
    world = trial.world
    span = world.wait_mid_job([trial.date])
    order = [span.region, *(r for r in world.settings.regions if r != span.region)]
    first = None
    for name in order:
        at = time.time()
        world.restart_region(name)
        fault = world.observer.fault(  # type: ignore[union-attr]
            Fault("rolling-restart", name, trial.date, at, [],
                  detail=f"restarted in {time.time() - at:.1f} s")
        )
        first = first or fault
    return first


def two_regions_fail(trial: Trial) -> Fault | None:
    """Three regions: kill -9 the whole region running the job mid-job (every process:
    api-server, scheduler, workers, the task and its Spark job), then the region that takes
    over, mid-job too; the third must complete the run. Both regions are started again once
    the run is COMPLETED, and their orphaned tries must not run it again."""
    world = trial.world
    if len(world.settings.regions) < 3:
        raise RuntimeError("three-regions-two-fail needs --regions 3")
    key = run_key_of(trial.date)
    dead: list[str] = []
    first = None
    for _ in range(2):
        deadline = time.monotonic() + 600
        span = None
        while time.monotonic() < deadline:
            candidate = world.mid_job([trial.date])
            if candidate is not None and candidate.region not in dead:
                span = candidate
                break
            time.sleep(0.2)
        if span is None:
            raise TimeoutError(f"{trial.date}: no live region ran the job after {dead}")
        at = time.time()
        pids = world.kill_region(span.region)
        dead.append(span.region)
        fault = world.observer.fault(  # type: ignore[union-attr]
            Fault("region-lost", span.region, trial.date, at, pids,
                  detail="whole region killed -9 (its components' process groups and "
                         "every process left in its home)")
        )
        first = first or fault
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if any(r.run_key == key and str(r.state) == "COMPLETED" for r in world.history()):
            break
        time.sleep(1.0)
    for name in dead:
        world.start_region(name)
    return first


def network_cut(trial: Trial) -> Fault | None:
    """Each region in its own network namespace: set the veth link of the region running the
    job down mid-job, keep it down until the other region has claimed the run and started its
    job, then up again. The cut region must be fenced; the other region must not notice."""
    world = trial.world
    if not world.namespaces:
        raise RuntimeError("network-cut needs --netns (each region in its own namespace)")
    span = world.wait_mid_job([trial.date])
    namespace = world.namespaces[span.region]
    at = time.time()
    namespace.cut()
    fault = world.observer.fault(  # type: ignore[union-attr]
        Fault("network-cut", span.region, trial.date, at, [],
              detail=f"link {namespace.host_link} down")
    )
    try:
        _wait_new_owner_running(world, trial, span)
    finally:
        namespace.heal()
        fault.resumed_at = time.time()
    return fault


@dataclass(frozen=True)
class Scenario:
    inject: Callable[[Trial], Fault | None]
    #: the faulted region survives the fault and its Spark task must FAIL with a fencing reason
    must_fence: bool = False
    #: the world it needs: "" (two regions, one broker), "cluster" (--kafka-nodes 3),
    #: "regions3" (--regions 3), "netns" (--netns)
    world: str = ""
    #: no region but the faulted one may have a failed Spark task
    others_untouched: bool = False


SCENARIOS: dict[str, Scenario] = {
    "kill-before-claim": Scenario(kill_before_claim),
    "kill-mid-job": Scenario(kill_mid_job),
    "kill-after-job": Scenario(kill_after_job),
    "stop-past-session": Scenario(stop_past_session, must_fence=True),
    "broker-restart": Scenario(broker_restart, must_fence=True),
    "rolling-restart": Scenario(rolling_restart),
    "ledger-leader-kill": Scenario(ledger_leader_kill, world="cluster"),
    "three-regions-two-fail": Scenario(two_regions_fail, world="regions3"),
    "network-cut": Scenario(network_cut, must_fence=True, world="netns",
                            others_untouched=True),
}


def world_of(kafka_nodes: int, regions: int, netns: bool) -> str:
    if netns:
        return "netns"
    if kafka_nodes >= 3:
        return "cluster"
    return "regions3" if regions >= 3 else ""


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


# -- broken variants: the suite must catch them ------------------------------------------------

BROKEN = {
    # The fenced execution ignores fences: the watchdog's "leadership lost" is only logged, so
    # a frozen-then-resumed region runs its job on beside the new owner's.
    "no-fence": (
        "from neli_orchestrate.airflow.operators import fenced as _fenced",
        "_fenced._FencedExecution._on_fence",
        "\n\n# BROKEN ON PURPOSE (python -m integration.chaos --broken no-fence)\n"
        "from neli_orchestrate.airflow.operators import fenced as _fenced  # noqa: E402\n\n"
        "_fenced._FencedExecution._on_fence = (\n"
        "    lambda self, reason: self.task.log.warning('fence ignored: %s', reason)\n"
        ")\n",
    ),
}


def broken_dags(variant: str, into: Path) -> Path:
    """A copy of the repository's dags/ whose example DAG file applies ``variant`` on import."""
    module, attribute, patch = BROKEN[variant]
    namespace: dict[str, Any] = {}
    exec(module, namespace)  # noqa: S102 - our own constant: check the patched name exists
    owner, _, name = attribute.rpartition(".")
    if not hasattr(eval(owner, namespace), name):  # noqa: S307 - our own constant
        raise SystemExit(f"cannot apply broken variant {variant!r}: {attribute} is gone")
    target = into / f"dags-{variant}"
    shutil.copytree(REPO / "dags", target, ignore=shutil.ignore_patterns("__pycache__"))
    dag = target / "nycflights_daily.py"
    dag.write_text(dag.read_text() + patch)
    return target


# -- the run -------------------------------------------------------------------------------------


def run_trial(world: World, scenario: str, n: int, date: str, out: Path,
              timeout: float) -> dict[str, Any]:
    from integration.regions.timeline import draw_timeline

    spec = SCENARIOS[scenario]
    began = time.time()
    runs = world.trigger([date])
    trial = Trial(world, date, runs, began)
    error = None
    fault = None
    try:
        fault = spec.inject(trial)
        world.wait(runs, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - a failed trial is a result, not a crash
        error = f"{type(exc).__name__}: {exc}"
        logger.exception("trial %s-%s", scenario, n)
    report, history = world.assess([date], runs)
    report.started_at = began
    world.observer.unwatch(date)  # type: ignore[union-attr]  # later trials poll their own
    for undo in trial.after:
        try:
            undo()
        except Exception as exc:  # noqa: BLE001 - reported with the trial
            error = (error or "") + f" undo failed: {exc}"
    outcome = report.dates[0]
    fenced_ok = None
    # every Spark-task try that FAILED with a fencing reason, in any region (a fence fails the
    # try, not the run: a later try of the fenced region may end skipped or superseded)
    fences = world.fences(runs)
    if fault is not None and spec.others_untouched:
        touched = {r: why for r, why in outcome.failed_in.items() if r != fault.region}
        touched.update({r: "fenced" for r, d, _ in fences if d == date and r != fault.region})
        for region, why in touched.items():
            report.problems.append(f"{date}: {region} was not cut off but its task "
                                   f"FAILED ({why})")
            error = (error or "") + f" {region} touched by the cut"
    if fault is not None and spec.must_fence:
        fenced_ok = any(r == fault.region and d == date for r, d, _ in fences)
        if not fenced_ok:
            report.problems.append(
                f"{date}: no try of {fault.region}'s task FAILED with a fencing reason (last "
                f"state {world.task_states(runs)[date].get(fault.region)})"
            )
    # The history of the trial, and the checker's verdict from it alone (integration/chaos/
    # history.py): a second opinion beside the report's rules, kept with the trial.
    events = _history(world, history, date, outcome)
    violations = check_history(events)
    for violation in violations:
        report.problems.append(f"history: {violation}")
    result = {
        "scenario": scenario,
        "trial": n,
        "date": date,
        "fault_injected": fault is not None,
        "error": error,
        "duplicates": report.duplicates,
        "lost": report.lost,
        "fenced_as_expected": fenced_ok,
        "takeover_seconds": outcome.takeover_seconds,
        "running_seconds": outcome.running_seconds,
        "running_in": outcome.running_in,
        "launch_seconds": outcome.launch_seconds,
        "ran_in": outcome.ran_in,
        "token": outcome.token,
        "sink": world.settings.sink,
        "spark_master": world.settings.spark_master or "local[*]",
        "table_versions": outcome.table_versions,
        "seconds": round(time.time() - began, 1),
        "report": report.to_json(),
        "history_violations": violations,
    }
    name = f"{scenario}-{n:03d}"
    write_history(events, out / f"{name}.history.jsonl")
    (out / f"{name}.json").write_text(json.dumps(result, indent=2, default=str))
    draw_timeline(report, world.observer, history, list(world.settings.regions),  # type: ignore[arg-type]
                  out / f"{name}.png", title=f"{scenario} #{n}", fences=fences)
    return result


def _history(world: World, ledger: Sequence[Any], date: str,
             outcome: Any) -> list[dict[str, Any]]:
    """The trial's events: the role's ledger, the Spark executions seen, the table's commits."""
    from integration.regions.evidence import paused_seconds
    from integration.regions.world import ROLE

    observer = world.observer
    assert observer is not None
    table = str(world.table) if world.settings.sink == "delta" else "output"
    commits = [(table, date, version, token) for version, token in outcome.table_versions]
    role = ROLE.format(date=date)
    return record_history(
        ledger=[r for r in ledger if r.role == role],
        executions=[s for s in observer.executions if s.date == date],
        role_of={date: role}, run_key_of=run_key_of,
        paused=lambda region, start, end: paused_seconds(observer.faults, region, start, end),
        commits=commits, faults=[f for f in observer.faults if f.date == date])


def load_results(out: Path) -> list[dict[str, Any]]:
    """Every trial report in ``out`` (from this run and earlier ones), oldest first."""
    found = []
    for path in sorted(out.glob("*-[0-9][0-9][0-9].json")):
        found.append(json.loads(path.read_text()))
    return sorted(found, key=lambda r: (r["scenario"], r["trial"]))


def next_trial_number(out: Path, scenario: str) -> int:
    taken = [int(p.stem.rsplit("-", 1)[1]) for p in out.glob(f"{scenario}-[0-9][0-9][0-9].json")]
    return max(taken, default=0) + 1


def trials_held(out: Path, scenario: str, spark_master: str | None) -> int:
    """How many trials of ``scenario`` on ``spark_master`` (None: ``local[*]``) ``out`` holds."""
    master = spark_master or "local[*]"
    return sum(1 for r in load_results(out) if r.get("scenario") == scenario
               and (r.get("spark_master") or "local[*]") == master)


def next_date(out: Path, date: dt.date) -> dt.date:
    """``date``, or the day after the last date any trial in ``out`` used: every trial of every
    run gets a run key of its own, so no trial can see an earlier trial's records."""
    used = [dt.date.fromisoformat(r["date"]) for r in load_results(out)]
    return max(date, max(used, default=date - dt.timedelta(days=1)) + dt.timedelta(days=1))


def _deadline(until: str | None) -> float | None:
    """``HH:MM`` (UTC, today) as an epoch: no new trial starts after it."""
    if until is None:
        return None
    now = dt.datetime.now(dt.UTC)
    hour, minute = (int(x) for x in until.split(":"))
    return now.replace(hour=hour, minute=minute, second=0, microsecond=0).timestamp()


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def _label(result: dict[str, Any]) -> str:
    """The table row of a trial: its scenario, marked when its Spark jobs ran on a cluster."""
    master = result.get("spark_master") or "local[*]"
    return result["scenario"] + ("" if master.startswith("local[") else " (standalone)")


def summarize(results: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for scenario in dict.fromkeys(_label(r) for r in results):
        rows = [r for r in results if _label(r) == scenario]
        takeovers = [s for r in rows for s in r["takeover_seconds"]]
        # older result files have no running_seconds: they count as not measured
        running = [s for r in rows for s in r.get("running_seconds", [])]
        fenced = [r["fenced_as_expected"] for r in rows if r["fenced_as_expected"] is not None]
        table[scenario] = {
            "trials": len(rows),
            "faults_injected": sum(r["fault_injected"] for r in rows),
            "window_missed": sum(
                1 for r in rows for f in r["report"]["faults"]
                if "window missed" in f.get("detail", "")
            ),
            "duplicates": sum(r["duplicates"] for r in rows),
            "lost": sum(r["lost"] for r in rows),
            "fenced": f"{sum(fenced)}/{len(fenced)}" if fenced else "-",
            "errors": sum(1 for r in rows if r["error"]),
            "takeover_p50_s": percentile(takeovers, 50),
            "takeover_p99_s": percentile(takeovers, 99),
            "running_p50_s": percentile(running, 50),
            "running_p99_s": percentile(running, 99),
            "running_measured": len(running),
            "trial_p50_s": round(statistics.median(r["seconds"] for r in rows), 1),
            # trials written before the history checker have no verdict: not counted as 0
            "history_violations": (
                sum(len(r["history_violations"]) for r in rows if "history_violations" in r)
                if any("history_violations" in r for r in rows) else None),
        }
    return table


def markdown(table: dict[str, dict[str, Any]], header: str) -> str:
    cols = ["trials", "faults_injected", "window_missed", "duplicates", "lost", "fenced",
            "errors",
            "takeover_p50_s", "takeover_p99_s", "running_p50_s", "running_p99_s",
            "trial_p50_s", "history_violations"]
    lines = [header, "", "| scenario | " + " | ".join(cols) + " |",
             "|---|" + "---|" * len(cols)]
    for scenario, row in table.items():
        cells = ["-" if row[c] is None else str(row[c]) for c in cols]
        lines.append(f"| {scenario} | " + " | ".join(cells) + " |")
    totals = {c: sum(row[c] for row in table.values())
              for c in ("trials", "faults_injected", "window_missed", "duplicates", "lost",
                        "errors")}
    lines.append("| **all** | " + " | ".join(
        f"**{totals[c]}**" if c in totals else "" for c in cols) + " |")
    return "\n".join(lines) + "\n"


def _title(broken: str | None) -> str:
    return f"chaos results ({'broken: ' + broken if broken else 'correct'} build)"


def write_summary(results: Sequence[dict[str, Any]], out: Path,
                  broken: str | None) -> dict[str, dict[str, Any]]:
    table = summarize(results)
    (out / "summary.json").write_text(json.dumps({"results": table}, indent=2))
    (out / "summary.md").write_text(markdown(table, f"### {_title(broken)}"))
    return table


DAGSTER_SCENARIO = "dagster-kill-mid-step"


def main_dagster(args: argparse.Namespace) -> int:
    """The Dagster scenario (integration/chaos/dagster.py): its own world, a broker only."""
    from integration.chaos.dagster import DagsterWorld, run_dagster_trial

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="neli-chaos-dagster-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log_to_file(workdir / "chaos.log")
    out = args.out / "latest"
    out.mkdir(parents=True, exist_ok=True)
    print(f"chaos: workdir {workdir}, results {out}", flush=True)
    until = _deadline(args.until)
    date = dt.date.fromisoformat(args.first_date)
    results = []
    with DagsterWorld(workdir, args.bootstrap) as world:
        for _ in range(args.trials):
            if until is not None and time.time() >= until:
                break
            n = next_trial_number(out, DAGSTER_SCENARIO)
            date = next_date(out, date)
            result = run_dagster_trial(world, n, date.isoformat(), out, args.timeout)
            results.append(result)
            error = f" ERROR {result['error']}" if result["error"] else ""
            print(f"chaos: {DAGSTER_SCENARIO} #{n} {date}: duplicates={result['duplicates']} "
                  f"lost={result['lost']} takeover={result['takeover_seconds']} "
                  f"ran_in={result['ran_in']} ({result['seconds']} s){error}", flush=True)
            date += dt.timedelta(days=1)
            write_summary(load_results(out), out, None)
    bad = [r for r in results if r["duplicates"] or r["lost"] or r["error"]]
    print(f"chaos: {len(results)} trials, {len(bad)} failed checks", flush=True)
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m integration.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", action="append",
                        choices=[*SCENARIOS, DAGSTER_SCENARIO, "all"],
                        help="scenario to run (repeatable; default all)")
    parser.add_argument("--trials", type=int, default=1, help="trials per scenario")
    parser.add_argument("--fill", type=int, default=None, metavar="N",
                        help="top up: skip a scenario once the results directory holds N "
                        "trials of it on this Spark master (with a large --trials)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    parser.add_argument("--broken", choices=sorted(BROKEN), default=None,
                        help="run a deliberately broken variant (the suite must fail)")
    parser.add_argument("--first-date", default=str(FIRST_DATE),
                        help="date of the first trial (one date per trial, then the next)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per trial")
    parser.add_argument("--until", default=None, metavar="HH:MM",
                        help="start no trial after this UTC time (with a large --trials)")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--kafka-nodes", type=int, default=1,
                        help="1: one broker; 3: a KRaft cluster with RF 3 / min ISR 2")
    parser.add_argument("--bootstrap", default=None,
                        help="use this Kafka cluster instead of a local broker "
                        "(not with broker-restart)")
    parser.add_argument("--regions", type=int, default=None,
                        help="number of regions (default 2; three-regions-two-fail: 3)")
    parser.add_argument("--netns", action="store_true",
                        help="each region in its own network namespace (root; network-cut)")
    parser.add_argument("--dagster", action="store_true",
                        help="the Dagster scenario (two Dagster instances, kill -9 mid-step)")
    parser.add_argument("--spark-master", type=spark_master_arg, default=None,
                        metavar="local-cluster|spark://HOST:PORT",
                        help="run the Spark jobs on a standalone cluster (PySpark client mode: "
                        "executors on the worker): 'local-cluster' starts one here "
                        "(LocalSparkCluster); default: local[*] inside each task")
    parser.add_argument("--sink", choices=SINKS, default="delta",
                        help="the job's sink: a Delta table (default; the check reads its "
                        "history) or the directory guard")
    args = parser.parse_args(argv)
    # SIGTERM (a background run has SIGINT ignored) stops the world cleanly: regions, broker,
    # network namespaces
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.dagster or DAGSTER_SCENARIO in (args.scenario or []):
        return main_dagster(args)
    regions = args.regions or (
        3 if any(SCENARIOS[s].world == "regions3" for s in args.scenario or []) else 2
    )
    if regions > len(REGION_NAMES):
        parser.error(f"--regions: at most {len(REGION_NAMES)}")
    kind = world_of(args.kafka_nodes, regions, args.netns)
    scenarios = [s for s in (args.scenario or ["all"]) if s != "all"] or [
        s for s in SCENARIOS if SCENARIOS[s].world == kind
    ]
    for s in scenarios:
        if SCENARIOS[s].world != kind:
            need = {"cluster": "--kafka-nodes 3", "regions3": "--regions 3",
                    "netns": "--netns", "": "two regions, one broker"}[SCENARIOS[s].world]
            parser.error(f"scenario {s} needs {need}; run it in an invocation of its own")
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    if args.bootstrap and "broker-restart" in scenarios:
        parser.error("broker-restart restarts the suite's own broker: drop --bootstrap")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="neli-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log_to_file(workdir / "chaos.log")
    out = args.out / (f"broken-{args.broken}" if args.broken else "latest")
    out.mkdir(parents=True, exist_ok=True)
    dags = broken_dags(args.broken, workdir) if args.broken else REPO / "dags"
    print(f"chaos: workdir {workdir}, results {out}", flush=True)
    results: list[dict[str, Any]] = []
    table: dict[str, dict[str, Any]] = {}
    date = dt.date.fromisoformat(args.first_date)
    if args.kafka_nodes >= 3 and "broker-restart" in scenarios:
        parser.error("broker-restart runs on the single broker: drop --kafka-nodes")
    settings = Settings(workdir=workdir, dags=dags, bootstrap_servers=args.bootstrap,
                        kafka_nodes=args.kafka_nodes, regions=REGION_NAMES[:regions],
                        netns=args.netns, region_env=CHAOS_REGION_ENV,
                        sink=args.sink, spark_master=args.spark_master)
    until = _deadline(args.until)
    with World.start(settings,
                     lambda text: print(f"chaos: {text}", flush=True)) as world:
        # round robin (every scenario once, then again), so a run cut short by --until still
        # covers every scenario; each trial on a date (run key) of its own
        for _ in range(args.trials):
            for scenario in scenarios:
                if until is not None and time.time() >= until:
                    break
                if args.fill is not None and trials_held(
                        out, scenario, settings.spark_master) >= args.fill:
                    continue
                n = next_trial_number(out, scenario)
                date = next_date(out, date)
                result = run_trial(world, scenario, n, date.isoformat(), out, args.timeout)
                results.append(result)
                error = f" ERROR {result['error']}" if result["error"] else ""
                print(
                    f"chaos: {scenario} #{n} {date}: duplicates={result['duplicates']} "
                    f"lost={result['lost']} fenced={result['fenced_as_expected']} "
                    f"takeover={result['takeover_seconds']} "
                    f"running={result['running_seconds']} in {result['running_in']} "
                    f"ran_in={result['ran_in']} "
                    f"({result['seconds']} s){error}",
                    flush=True,
                )
                date += dt.timedelta(days=1)
                # after every trial, so an interrupted run keeps what it measured; the summary
                # covers every trial in the results directory (runs add up)
                table = write_summary(load_results(out), out, args.broken)
    print(markdown(table, f"### {_title(args.broken)}"))
    bad = [r for r in results
           if r["duplicates"] or r["lost"] or r["fenced_as_expected"] is False or r["error"]]
    print(f"chaos: {len(results)} trials, {len(bad)} failed checks", flush=True)
    if args.workdir is None:
        remove_workdir(workdir)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
