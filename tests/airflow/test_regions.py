"""Two real Airflow deployments on one Kafka: exactly once per date, and a fence fails the task.

Each region is a separate Airflow 3.3 deployment (own AIRFLOW_HOME, SQLite database, api-server
port, execution API URL, worker and trigger log-server ports) running api-server, scheduler
(LocalExecutor, so every task runs under the real task supervisor) and triggerer; see
integration/regions/regions.py. Both run the same DAG files.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psutil
import pytest

from integration.regions.regions import (
    SPARK_LOCAL_CONNECTION,
    AirflowRegions,
    RegionConfig,
    ledger_history,
    neli_connection,
)
from neli_orchestrate.airflow.hooks.neli import NeliHook
from neli_orchestrate.ledger.record import RunState
from neli_orchestrate.spark import TokenCommitGuard

pytestmark = [pytest.mark.airflow, pytest.mark.kafka, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
A, B = "us-east-1", "eu-west-1"
DATES = ["2013-01-01", "2013-01-02", "2013-01-03"]
DAG_ID = "nycflights_daily"
ROLE = "nycflights_daily/{date}"  # one role per date (see dags/nycflights_daily.py)
SECRET = f"never-log-me-{uuid.uuid4().hex}"


class StatsdReceiver:
    """A StatsD server on loopback UDP: what the regions' Airflow ``Stats`` sent, line by line."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65535)
            except TimeoutError:
                continue
            with self._lock:
                self.lines.extend(data.decode(errors="replace").splitlines())

    def count(self, name: str) -> int:
        """Sum of the counter ``name`` (e.g. ``us-east-1.neli.claim``) received so far."""
        with self._lock:
            lines = list(self.lines)
        return sum(int(line.split(":", 1)[1].split("|", 1)[0]) for line in lines
                   if line.split(":", 1)[0] == name and line.endswith("|c"))

    def timings(self, name: str) -> list[float]:
        with self._lock:
            lines = list(self.lines)
        return [float(line.split(":", 1)[1].split("|", 1)[0]) for line in lines
                if line.split(":", 1)[0] == name and line.endswith("|ms")]

    def statsd_env(self, prefix: str) -> dict[str, str]:
        """The ``[metrics]`` settings that send a region's Stats here under ``prefix``."""
        return {
            "AIRFLOW__METRICS__STATSD_ON": "True",
            "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
            "AIRFLOW__METRICS__STATSD_PORT": str(self.port),
            "AIRFLOW__METRICS__STATSD_PREFIX": prefix,
        }

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


class World:
    """The two regions and what they share: Kafka namespace, output root, fence marker dir."""

    def __init__(self, regions: AirflowRegions, bootstrap: str, namespace: str, root: Path):
        self.regions = regions
        self.bootstrap = bootstrap
        self.namespace = namespace
        self.output = root / "output"
        self.started = root / "started"
        self.statsd = StatsdReceiver()

    def connection(self, deployment: str) -> dict[str, Any]:
        return neli_connection(
            self.bootstrap,
            deployment,
            namespace=self.namespace,
            # Room for a 2-core machine shared with other work (load averages of 30-50 seen):
            # a 12 s session, 4 s heartbeat lease. A shorter lease fenced healthy jobs there.
            session_timeout=12,
            heartbeat_timeout=4,
            # KIP-848: members joining a role's group do not disturb its leader (the
            # recommended setting on Kafka 4.x; the in-process tests cover "classic").
            group_protocol="consumer",
            # Runs of the role execute one after another; claims must outlive the queue.
            handoff_timeout=900,
            # A secret the deployments must never log (harmless on a PLAINTEXT listener).
            kafka_config={"ssl.key.password": SECRET},
        )

    def hook(self, deployment: str) -> NeliHook:
        from airflow.sdk import Connection

        conn = self.connection(deployment)
        return NeliHook(
            deployment,
            connection=Connection(
                conn_id=deployment,
                conn_type="neli",
                host=conn["host"],
                extra=json.dumps(conn["extra"]),
            ),
        )


def policy_settings(root: Path) -> dict[str, str]:
    """Environment that registers the provider's cluster policy through airflow_local_settings.

    An installed wheel registers it through its ``airflow.policy`` entry point; the tests run
    from a checkout on PYTHONPATH, whose installed metadata may predate the entry point.
    Registering it twice is harmless (the policy is idempotent).
    """
    settings = root / "local_settings"
    settings.mkdir(exist_ok=True)
    (settings / "airflow_local_settings.py").write_text(
        "from neli_orchestrate.airflow.policy import dag_policy  # noqa: F401\n"
    )
    path = os.pathsep.join(p for p in (str(settings), str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path}


@pytest.fixture(scope="module")
def world(warm_broker: str, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("regions")
    namespace = f"regions{uuid.uuid4().hex[:8]}"
    holder = World(None, warm_broker, namespace, root)  # type: ignore[arg-type]
    configs = [
        RegionConfig(
            name,
            connections={
                "neli_default": holder.connection(name),
                "spark_default": SPARK_LOCAL_CONNECTION,
            },
            variables={
                "nycflights_output": str(holder.output),
                "fence_started": str(holder.started / name),
            },
            env={**policy_settings(root), **holder.statsd.statsd_env(name)},
        )
        for name in (A, B)
    ]
    dags = [
        REPO / "dags" / "nycflights_daily.py",
        REPO / "dags" / "stock_downstream.py",
        REPO / "dags" / "nycflights_published.py",
        REPO / "dags" / "jobs",
        REPO / "dags" / ".airflowignore",
        HERE / "dags" / "neli_fence_test.py",
        HERE / "jobs",
    ]
    try:
        with AirflowRegions.start(root, dags, configs, region_urls=True) as regions:
            holder.regions = regions
            yield holder
    finally:
        holder.statsd.close()


@pytest.mark.timeout(900)  # two deployments start (fixture) and run three Spark jobs
def test_each_date_runs_exactly_once_across_two_regions(world: World) -> None:
    regions = list(world.regions)
    # Both regions contend for each date at once, one date after the other. (All dates at once
    # also works since the alias-links middleware, test_assets_by_proxy's race test, but three
    # local Spark jobs at once on a 2-core runner once failed a job's first try: kept serial.)
    runs: dict[str, dict[str, str]] = {r.name: {} for r in regions}
    for date in DATES:
        for region in regions:
            runs[region.name][date] = region.trigger(DAG_ID, date)
        for region in regions:
            states = region.wait_for_runs(DAG_ID, [runs[region.name][date]], timeout=600)
            assert set(states.values()) == {"success"}, (region.name, date, states)

    ran_in: dict[str, str] = {}
    for date in DATES:
        outcomes = {r.name: r.task_instances(DAG_ID, runs[r.name][date]) for r in regions}
        for name, tis in outcomes.items():
            gate = (tis["claim_run"]["state"], tis["claim_run"]["try_number"])
            assert gate == ("success", 1), (name, date, gate)
        spark = {n: tis["daily_performance"]["state"] for n, tis in outcomes.items()}
        runners = [n for n, state in spark.items() if state == "success"]
        assert len(runners) == 1, (date, spark)
        runner = runners[0]
        ran_in[date] = runner
        (other,) = [n for n in outcomes if n != runner]
        if outcomes[runner]["daily_performance"]["try_number"] != 1:
            first = world.regions[runner].task_log(
                DAG_ID, runs[runner][date], "daily_performance", try_number=1)
            raise AssertionError(f"{runner} {date}: the job's first try failed:\n{first[-4000:]}")
        spark_log = world.regions[runner].task_log(DAG_ID, runs[runner][date], "daily_performance")
        assert "Running under fencing token" in spark_log, spark_log[-3000:]
        assert outcomes[runner]["report"]["state"] == "success"
        assert outcomes[runner]["clean_scratch"]["state"] == "success"
        # Only the singleton is skipped where it ran elsewhere: the job. The report
        # (none_failed) and this deployment's own scratch clean-up (all_done) run everywhere.
        assert outcomes[other]["daily_performance"]["state"] == "skipped"
        assert outcomes[other]["clean_scratch"]["state"] == "success"
        assert outcomes[other]["report"]["state"] == "success"
        gate_log = world.regions[other].task_log(DAG_ID, runs[other][date], "claim_run")
        assert f"already completed by deployment '{runner}' at " in gate_log
        assert "Asset event(s) by proxy for ['nycflights_daily_performance']" in gate_log
        # "Ran in region" on the skipped task: through the runner's /neli/ran to its run
        links = world.regions[other].api(
            "GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{runs[other][date]}/taskInstances/"
            "daily_performance/links")["extra_links"]
        ran_in_link = links.get("Ran in region") or ""
        assert ran_in_link.startswith(f"{world.regions[runner].api_url}/neli/ran?"), links
        assert _redirect(ran_in_link) == (
            f"/dags/{DAG_ID}/runs/{quote(runs[runner][date], safe='')}/tasks/daily_performance")

    # The ledger's whole history: one RUNNING and one COMPLETED per run key, by the runner.
    history = ledger_history(world.bootstrap, f"{world.namespace}.ledger")
    by_key: dict[str, list[Any]] = defaultdict(list)
    roles = {ROLE.format(date=date) for date in DATES}
    for record in history:
        if record.role in roles:
            by_key[record.run_key].append(record)
    assert len(by_key) == len(DATES)
    for date in DATES:
        key = f"{DAG_ID}/{date}T00:00:00+00:00"
        states = Counter(r.state for r in by_key[key])
        assert states[RunState.RUNNING] == 1 and states[RunState.COMPLETED] == 1, by_key[key]
        completed = by_key[key][-1]
        assert (completed.state, completed.deployment) == (RunState.COMPLETED, ran_in[date])
        assert {r.role for r in by_key[key]} == {ROLE.format(date=date)}

        # The published output: committed once, by the runner, under the ledger's token.
        marker = TokenCommitGuard(world.output, partition_column="date").committed(date)
        assert marker is not None, date
        assert (marker.deployment, marker.token, marker.run_key) == (
            ran_in[date],
            completed.token,
            date,
        )
        assert marker.metadata["ledger_run_key"] == key
        assert list(marker.path.glob("*.parquet")), marker.path

    _check_assets_seen_in_every_region(world, ran_in)

    # Waiting regions waited in the triggerer at least once (deferrable gates).
    deferred = [
        (region.name, date)
        for region in regions
        for date in DATES
        if "Pausing task as DEFERRED"
        in region.task_log(DAG_ID, runs[region.name][date], "claim_run")
    ]
    assert deferred

    for region in regions:
        assert SECRET not in region.all_logs(), f"{region.name} logged the Kafka secret"


def _redirect(url: str) -> str:
    """Where ``url`` redirects to (its Location), without following it."""
    import urllib.error
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    try:
        urllib.request.build_opener(NoRedirect).open(url, timeout=60)
    except urllib.error.HTTPError as exc:
        assert exc.code == 303, (url, exc.code)
        return str(exc.headers["location"])
    raise AssertionError(f"{url} did not redirect")


PUBLISHED = "nycflights_published"  # dags/nycflights_published.py: scheduled on the asset


def _check_assets_seen_in_every_region(world: World, ran_in: dict[str, str]) -> None:
    """Every region has an event of the daily asset per date (by proxy where it did not run
    it), naming the runner; the asset-scheduled DAG runs in every region; its singleton
    ``export`` runs once per run key across the regions."""
    regions = list(world.regions)
    for region in regions:
        events = region.api("GET", "/api/v2/assets/events?limit=100")["asset_events"]
        daily = [e for e in events if e.get("name") == "nycflights_daily_performance"]
        by_key = {e["extra"]["neli"]["run_key"]: e for e in daily}
        assert len(daily) == len(DATES) == len(by_key), (region.name, daily)
        for date in DATES:
            event = by_key[f"{DAG_ID}/{date}T00:00:00+00:00"]
            neli = event["extra"]["neli"]
            assert neli["deployment"] == ran_in[date], (region.name, date, event)
            proxy = ran_in[date] != region.name
            assert neli["proxy"] is proxy, (region.name, date, event)
            assert event["source_task_id"] == ("claim_run" if proxy else "daily_performance")

    # The consumer: asset-triggered runs in every region, each to success. A region's
    # scheduler may batch several dates into one run (and Airflow 3.3 may leave an event that
    # lands while it creates a run for the next event to pick up), so the runs per region vary;
    # what must hold is that every derived run key exports once across the regions. Wait until
    # both regions have runs, all finished, and the exports match the ledger.
    history: list[Any] = []
    deadline = time.monotonic() + 300
    while True:
        published = {
            region.name: [
                r for r in region.api("GET", f"/api/v2/dags/{PUBLISHED}/dagRuns?limit=100")[
                    "dag_runs"]
            ]
            for region in regions
        }
        finished = all(
            runs and all(r["state"] in ("success", "failed") for r in runs)
            for runs in published.values()
        )
        if finished:
            history = ledger_history(world.bootstrap, f"{world.namespace}.ledger")
            completed = Counter(
                r.run_key for r in history if r.role == PUBLISHED and r.state == RunState.COMPLETED
            )
            exported = Counter(
                region.task_instances(PUBLISHED, r["dag_run_id"])["export"]["state"]
                for region in regions
                for r in published[region.name]
            )
            if exported["success"] == sum(completed.values()) > 0:
                break
        assert time.monotonic() < deadline, published
        time.sleep(2)
    for region in regions:
        for run in published[region.name]:
            assert run["state"] == "success", (region.name, run)
            assert run["run_type"] == "asset_triggered", run
            tis = region.task_instances(PUBLISHED, run["dag_run_id"])
            assert tis["where_it_ran"]["state"] == "success", (region.name, run, tis)
            assert tis["export"]["state"] in ("success", "skipped"), (region.name, run, tis)
            assert _triggering_run_keys(region, run["dag_run_id"]), run
    # export: once per derived run key across both regions (ledger: one COMPLETED each)
    assert set(completed.values()) == {1}, completed
    assert all(k.startswith(f"{PUBLISHED}/after/nycflights_daily/") for k in completed), completed


def _triggering_run_keys(region: Any, run_id: str) -> set[str]:
    """The upstream run keys of the asset events a DAG run of the consumer was triggered by."""
    events = region.api(
        "GET", f"/api/v2/dags/{PUBLISHED}/dagRuns/{run_id}/upstreamAssetEvents"
    )["asset_events"]
    return {e["extra"]["neli"]["run_key"] for e in events if "neli" in (e.get("extra") or {})}


STOCK_DAG = "stock_downstream"  # dags/stock_downstream.py: the issue's DAG, verbatim


def test_issue_dag_in_one_region_leaves_the_ledger_completed(world: World) -> None:
    region = world.regions[A]
    run_id = region.trigger(STOCK_DAG, "2013-03-01")
    assert region.wait_for_runs(STOCK_DAG, [run_id], timeout=300) == {run_id: "success"}
    tis = region.task_instances(STOCK_DAG, run_id)
    assert (tis["gate"]["state"], tis["job"]["state"]) == ("success", "success")
    with world.hook(A).get_singleton() as mine:
        latest = mine.status("stock_downstream", "stock/2013-03-01")
    assert (latest.state, latest.deployment) == (RunState.COMPLETED, A)
    log = region.task_log(STOCK_DAG, run_id, "job")
    assert f"stock job ran with fencing token {latest.token}" in log, log[-3000:]


@pytest.mark.timeout(900)
def test_stock_bash_behind_the_gate_runs_each_date_once_across_two_regions(world: World) -> None:
    dates = ["2013-04-01", "2013-04-02"]
    regions = list(world.regions)
    runs = {r.name: {d: r.trigger(STOCK_DAG, d) for d in dates} for r in regions}
    for region in regions:
        states = region.wait_for_runs(STOCK_DAG, runs[region.name].values(), timeout=600)
        assert set(states.values()) == {"success"}, (region.name, states)
    history = ledger_history(world.bootstrap, f"{world.namespace}.ledger")
    for date in dates:
        jobs = {
            r.name: r.task_instances(STOCK_DAG, runs[r.name][date])["job"]["state"]
            for r in regions
        }
        assert sorted(jobs.values()) == ["skipped", "success"], (date, jobs)
        (runner,) = [name for name, state in jobs.items() if state == "success"]
        records = [r for r in history if r.run_key == f"stock/{date}"]
        states = Counter(r.state for r in records)
        assert states[RunState.RUNNING] == 1 and states[RunState.COMPLETED] == 1, records
        assert records[-1].deployment == runner
    # Every claim the ledger holds went out through Airflow's Stats (StatsD here), from the
    # region that wrote it; regions count claims of all roles, so compare over the whole ledger.
    claims: Counter[str] = Counter()
    for records_of_key in _claims_by_run_key(history).values():
        for deployment in records_of_key:
            claims[deployment] += 1
    deadline = time.monotonic() + 30
    while any(world.statsd.count(f"{r.name}.neli.claim") < claims[r.name] for r in regions):
        assert time.monotonic() < deadline, (claims, world.statsd.lines[-50:])
        time.sleep(0.1)
    for region in regions:
        assert world.statsd.count(f"{region.name}.neli.claim") == claims[region.name]
    assert world.statsd.timings(f"{claims.most_common(1)[0][0]}.neli.time_to_lead")


def _claims_by_run_key(history: list[Any]) -> dict[str, list[str]]:
    """Per run key, the deployment of each claim (each new token) in the ledger."""
    seen: dict[str, dict[int, str]] = defaultdict(dict)
    for record in history:
        seen[record.run_key].setdefault(record.token, record.deployment)
    return {key: list(tokens.values()) for key, tokens in seen.items()}


def _spark_processes(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "slow_job.py" in cmdline and marker in cmdline:
            found.append(proc)
    return found


def test_fenced_spark_task_fails_at_once_and_leaves_no_jvm(world: World) -> None:
    region = world.regions[A]
    started = world.started / A
    run_id = region.trigger("neli_fence_test", "2013-02-01")

    # Wait for the job's Spark tasks to run (the job announces it with <token>.started).
    deadline = time.monotonic() + 300
    while not list(started.glob("*.started")):
        assert time.monotonic() < deadline, region.task_instances("neli_fence_test", run_id)
        time.sleep(0.5)
    (announce,) = started.glob("*.started")
    info = json.loads(announce.read_text())
    driver = psutil.Process(info["driver_pid"])
    jvm = driver.parent()
    assert jvm.name() == "java", jvm.cmdline()
    task_process = jvm.parent()  # spark-submit was started by the task process
    spark_tree = [jvm, *jvm.children(recursive=True)]
    assert _spark_processes(str(started))

    # Freeze the task process (a stalled worker: GC pause, frozen VM) past the session
    # timeout. Its Spark job keeps running; another deployment takes the run over meanwhile.
    run_key = info["run_key"]
    task_process.send_signal(signal.SIGSTOP)
    try:
        with world.hook(B).get_singleton() as other:
            deadline = time.monotonic() + 120
            while True:
                assert time.monotonic() < deadline, "eu-west-1 never took the run over"
                reservation = other.reserve("fence_test", run_key)
                if reservation.should_run:
                    break
                time.sleep(1)
    finally:
        task_process.send_signal(signal.SIGCONT)
    assert reservation.token > info["token"]

    # Woken up, the task finds it lost leadership: it kills the job and the try fails. A fence
    # fails the try, not the run: Airflow retries it (retries=2), and the retry decides again.
    ti = region.wait_for_task(
        "neli_fence_test", run_id, "slow_job", ["failed", "success", "up_for_retry"], 120
    )
    assert ti["state"] == "up_for_retry" or ti["try_number"] >= 2, ti
    log = region.task_log("neli_fence_test", run_id, "slow_job", try_number=1)
    assert "Fenced" in log, log[-3000:]
    gone = psutil.wait_procs(spark_tree, timeout=30)[1]
    assert not gone, [p.pid for p in gone]
    assert not _spark_processes(str(started))

    # The fenced member could not write FAILED: the ledger shows the newer claim.
    with world.hook(A).get_singleton() as mine:
        latest = mine.status("fence_test", run_key)
    assert (latest.state, latest.deployment, latest.token) == (
        RunState.CLAIMED,
        B,
        reservation.token,
    )


@pytest.mark.parametrize("region_name", [A, B])
def test_each_region_is_a_separate_deployment(world: World, region_name: str) -> None:
    region = world.regions[region_name]
    others = [r for r in world.regions if r.name != region_name]
    env = region.environ()
    for other in others:
        other_env = other.environ()
        for key in (
            "AIRFLOW_HOME",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
            "AIRFLOW__API__PORT",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT",
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT",
        ):
            assert env[key] != other_env[key], key
    health = region.api("GET", "/api/v2/monitor/health")
    assert health["scheduler"]["status"] == health["triggerer"]["status"] == "healthy"
    assert os.path.exists(region.database)
