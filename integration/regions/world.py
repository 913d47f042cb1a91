"""A local Kafka broker and several real Airflow regions running the nycflights example.

Usage::

    with World.start(Settings(workdir=Path("neli-demo"))) as world:
        runs = world.trigger(["2013-01-01"])          # in every region at once
        world.wait(runs)
        report = world.assess(["2013-01-01"])

The demo (:mod:`integration.regions`) and the chaos suite (``integration/chaos``) both drive
this: one broker (:class:`~neli_orchestrate.testing.LocalKafka`), N regions
(:mod:`integration.regions.regions`), connections created in each region's database, one
:class:`~integration.regions.evidence.Observer` watching leadership and Spark jobs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from integration.regions.evidence import (
    Fault,
    Observer,
    Report,
    Span,
    TableState,
    application_starts,
    assess,
    kill_tree,
)
from integration.regions.regions import (
    SPARK_LOCAL_CONNECTION,
    AirflowRegion,
    AirflowRegions,
    HarnessError,
    RegionConfig,
    ledger_history,
    neli_connection,
)

logger = logging.getLogger(__name__)

DAG_ID = "nycflights_daily"
SPARK_TASK = "daily_performance"
GATE_TASK = "claim_run"
#: The Spark task's outlet (dags/nycflights_daily.py): an event in every region for every date
ASSET = "nycflights_daily_performance"
ROLE = "nycflights_daily/{date}"  # one role per date, as in dags/nycflights_daily.py


def run_key_of(date: str) -> str:
    """The gate's default run key of ``date`` (the DAG's id and logical date)."""
    return f"{DAG_ID}/{date}T00:00:00+00:00"


def default_dags() -> Path:
    """The repository's ``dags/`` folder (the demo runs from a clone)."""
    return Path(__file__).resolve().parents[2] / "dags"


@dataclass
class Settings:
    """Where and how the world runs; the defaults are the demo's."""

    workdir: Path
    regions: Sequence[str] = ("us-east-1", "eu-west-1")
    dags: Path = field(default_factory=default_dags)
    extra_dags: Sequence[Path] = ()
    #: NELI timings of every region's connection (a loaded 2-core machine needs room).
    session_timeout: float = 6.0
    handoff_timeout: float = 900.0
    extra: Mapping[str, Any] = field(default_factory=dict)
    bootstrap_servers: str | None = None  # an existing broker; default: start a LocalKafka
    #: 1: one local broker; 3 or more: a LocalKafkaCluster (RF 3, min ISR 2)
    kafka_nodes: int = 1
    kafka_properties: Mapping[str, str] = field(default_factory=dict)
    start_timeout: float = 300.0
    #: extra environment of every region's processes (e.g. Airflow scheduler settings)
    region_env: Mapping[str, str] = field(default_factory=dict)
    #: each region in a network namespace of its own (root; integration.regions.netns)
    netns: bool = False
    #: the example job's sink: "delta" (a Delta table, token in each commit) or "directory"
    sink: str = "delta"
    #: where the Spark jobs run: None (local[*] inside each task), "local-cluster" (start a
    #: LocalSparkCluster: one standalone master and worker on loopback) or a ``spark://`` URL;
    #: PySpark runs in client mode there (the driver in the task, executors on the worker)
    spark_master: str | None = None


SINKS = ("delta", "directory")
LOCAL_CLUSTER = "local-cluster"

#: Seconds of SIGTERM grace each region's processes get when the world ends.
END_GRACE = 5.0


def spark_master_arg(value: str) -> str:
    """Check a ``--spark-master`` value: ``local-cluster``, ``local[...]`` or ``spark://H:P``."""
    if value == LOCAL_CLUSTER or value.startswith("local"):
        return value
    if re.fullmatch(r"spark://[^\s/:]+:\d+", value):
        return value
    raise ValueError(
        f"--spark-master must be 'local-cluster' (start a standalone cluster here), 'local[*]' "
        f"or a standalone master URL spark://HOST:PORT, not {value!r}"
    )


class World:
    """The running broker and regions; see the module docstring."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.workdir = Path(settings.workdir).resolve()
        self.namespace = f"demo{uuid.uuid4().hex[:8]}"
        self.output = self.workdir / "output"
        self.kafka: Any = None
        self.bootstrap = settings.bootstrap_servers or ""
        self.regions: AirflowRegions | None = None
        self.observer: Observer | None = None
        self.namespaces: dict[str, Any] = {}  # region -> netns.Netns (Settings.netns)
        if settings.sink not in SINKS:
            raise ValueError(f"sink must be one of {SINKS}, not {settings.sink!r}")
        #: the Delta table's path (sink "delta"); the directory sink publishes under output
        self.table = self.output / "nycflights_daily_delta"
        self.spark_cluster: Any = None  # a LocalSparkCluster (spark_master="local-cluster")
        self.spark_master = "local[*]"

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    def start(
        cls, settings: Settings, progress: Callable[[str], None] = lambda _: None
    ) -> World:
        world = cls(settings)
        try:
            world._start(progress)
        except BaseException:
            world.stop()
            raise
        return world

    def _start(self, progress: Callable[[str], None]) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not self.bootstrap and self.settings.kafka_nodes >= 3:
            from neli_orchestrate.testing.local_kafka import LocalKafkaCluster

            progress(f"starting a {self.settings.kafka_nodes}-node Kafka cluster (KRaft, RF 3)")
            self.kafka = LocalKafkaCluster(
                self.settings.kafka_nodes, workdir=self.workdir / "kafka",
                properties=self.settings.kafka_properties,
            ).start(timeout=self.settings.start_timeout)
            self.bootstrap = self.kafka.bootstrap_servers
        elif not self.bootstrap and self.settings.netns:
            from integration.regions import netns

            progress("creating a network namespace per region (veth to the host)")
            netns.add_broker_address()
            for i, name in enumerate(self.settings.regions, start=1):
                self.namespaces[name] = netns.Netns(f"{self.namespace}-{i}", i).create()
            progress(f"starting Kafka (KRaft, one node on {netns.BROKER_ADDRESS})")
            self.kafka = netns.host_kafka(
                workdir=self.workdir / "kafka", properties=self.settings.kafka_properties
            ).start(timeout=self.settings.start_timeout)
            self.bootstrap = self.kafka.bootstrap_servers
        elif not self.bootstrap:
            from neli_orchestrate.testing.local_kafka import LocalKafka

            progress("starting Kafka (KRaft, one node on loopback)")
            self.kafka = LocalKafka(
                workdir=self.workdir / "kafka", properties=self.settings.kafka_properties
            ).start(timeout=self.settings.start_timeout)
            self.bootstrap = self.kafka.bootstrap_servers
        progress("warming up the broker's group and transaction coordinators")
        self._warm_up()
        if self.settings.sink == "delta":
            from neli_orchestrate.testing.table_jars import ensure_table_format_jars

            progress("the Delta jars (fetched with Maven once into the cache)")
            ensure_table_format_jars()
        master = self.settings.spark_master
        if master == LOCAL_CLUSTER:
            from neli_orchestrate.testing.spark_cluster import LocalSparkCluster

            progress("starting a Spark standalone cluster (one master, one worker, loopback)")
            self.spark_cluster = LocalSparkCluster(
                workdir=self.workdir / "spark-cluster", cores=2, memory="1g"
            ).start(timeout=self.settings.start_timeout)
            master = self.spark_cluster.master_url
        if master:
            self.spark_master = spark_master_arg(master)
        progress(
            f"starting {len(self.settings.regions)} Airflow regions "
            "(api-server, scheduler with LocalExecutor, triggerer)"
        )
        sources = [p for p in Path(self.settings.dags).iterdir() if p.name != "__pycache__"]
        env = {**self._policy_env(), **self.settings.region_env}
        if self.spark_cluster is not None:
            # the drivers (in the tasks) bind and advertise loopback, like the cluster
            env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        configs = [
            RegionConfig(
                name,
                connections={
                    "neli_default": self.connection(name),
                    "spark_default": (
                        SPARK_LOCAL_CONNECTION if self.spark_master == "local[*]"
                        else {"conn_type": "spark", "host": self.spark_master}
                    ),
                },
                variables={
                    "nycflights_output": str(
                        self.table if self.settings.sink == "delta" else self.output
                    ),
                    "nycflights_sink": self.settings.sink,
                },
                env=env,
                **(
                    {"netns": self.namespaces[name].name,
                     "address": self.namespaces[name].address}
                    if name in self.namespaces else {}
                ),
            )
            for name in self.settings.regions
        ]
        self.regions = AirflowRegions.start(
            self.workdir / "airflow",
            [*sources, *self.settings.extra_dags],
            configs,
            timeout=self.settings.start_timeout,
            region_urls=True,  # a skipped run links to the region that ran it
        )
        groups: dict[str, str] = {}
        self.observer = Observer(list(self.regions), self.bootstrap, groups)

    def _policy_env(self) -> dict[str, str]:
        """Register the provider's cluster policy (which runs the stock operator after a gate
        fenced) through ``airflow_local_settings`` when the installed distribution's metadata
        lacks its ``airflow.policy`` entry point (an editable install older than the entry
        point, the package on PYTHONPATH); an install from this checkout has it."""
        from importlib.metadata import entry_points

        if any(ep.value == "neli_orchestrate.airflow.policy"
               for ep in entry_points(group="airflow.policy")):
            return {}
        settings = self.workdir / "local_settings"
        settings.mkdir(parents=True, exist_ok=True)
        (settings / "airflow_local_settings.py").write_text(
            "from neli_orchestrate.airflow.policy import dag_policy  # noqa: F401\n"
        )
        package_root = str(Path(__file__).resolve().parents[2])
        path = [str(settings), package_root, os.environ.get("PYTHONPATH", "")]
        return {"PYTHONPATH": os.pathsep.join(p for p in path if p)}

    def connection(self, deployment: str) -> dict[str, Any]:
        """The ``neli_default`` connection of a region (same namespace everywhere)."""
        return neli_connection(
            self.bootstrap,
            deployment,
            namespace=self.namespace,
            session_timeout=self.settings.session_timeout,
            # KIP-848: members joining a role's group do not disturb its leader.
            group_protocol="consumer",
            handoff_timeout=self.settings.handoff_timeout,
            **self.settings.extra,
        )

    def hook(self, deployment: str) -> Any:
        from airflow.sdk import Connection

        from neli_orchestrate.airflow.hooks.neli import NeliHook

        conn = self.connection(deployment)
        return NeliHook(
            deployment,
            connection=Connection(
                conn_id=deployment, conn_type="neli", host=conn["host"],
                extra=json.dumps(conn["extra"]),
            ),
        )

    def _warm_up(self) -> None:
        # The first group commit and init_transactions() on a fresh broker wait seconds for
        # their coordinators; production brokers are long warm.
        with self.hook("warmup").get_singleton() as singleton:
            deadline = time.monotonic() + 120
            while True:
                reservation = singleton.reserve("warmup", "warmup")
                if reservation.should_run:
                    break
                if time.monotonic() > deadline:
                    raise HarnessError(f"the broker never granted a first claim: {reservation}")
                time.sleep(0.2)
            singleton.execute("warmup", "warmup", reservation.token, lambda run: None)

    def stop(self) -> None:
        if self.observer is not None and self.observer.is_alive():
            self.observer.stop()
        if self.regions is not None:
            # The world ends: nothing is measured any more, so a short SIGTERM grace (a
            # rolling restart's own stop keeps the operator's 20 s, restart_region)
            self.regions.stop(timeout=END_GRACE)
        if self.spark_cluster is not None:
            self.spark_cluster.stop()
            self.spark_cluster = None
        if self.kafka is not None:
            self.kafka.stop()
            self.kafka = None
        for namespace in self.namespaces.values():
            namespace.delete()
        self.namespaces.clear()

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- runs ------------------------------------------------------------------------------

    def region(self, name: str) -> AirflowRegion:
        assert self.regions is not None
        return self.regions[name]

    def watch(self, dates: Sequence[str]) -> Observer:
        """Start (or extend) observing the roles of ``dates``."""
        assert self.observer is not None
        hook = self.hook(self.settings.regions[0])
        for date in dates:
            self.observer.groups[date] = hook.role_group(ROLE.format(date=date))
        if not self.observer.is_alive():
            self.observer.start()
        return self.observer

    def trigger(self, dates: Sequence[str]) -> dict[str, dict[str, str]]:
        """Trigger ``dates`` in every region; return region -> date -> run id."""
        self.watch(dates)
        assert self.regions is not None
        return {r.name: {d: r.trigger(DAG_ID, d) for d in dates} for r in self.regions}

    def wait(self, runs: Mapping[str, Mapping[str, str]], timeout: float = 600.0) -> None:
        for name, by_date in runs.items():
            self.region(name).wait_for_runs(DAG_ID, by_date.values(), timeout=timeout)

    def task_states(
        self, runs: Mapping[str, Mapping[str, str]]
    ) -> dict[str, dict[str, tuple[str, str]]]:
        """date -> region -> (Spark task state, reason from its log when FAILED)."""
        states: dict[str, dict[str, tuple[str, str]]] = {}
        for name, by_date in runs.items():
            region = self.region(name)
            for date, run_id in by_date.items():
                ti = region.task_instances(DAG_ID, run_id).get(SPARK_TASK) or {}
                state = ti.get("state") or "none"
                reason = ""
                if state == "failed":
                    reason = failure_reason(
                        region.task_log(DAG_ID, run_id, SPARK_TASK, ti.get("try_number") or 1)
                    )
                states.setdefault(date, {})[name] = (state, reason)
        return states

    def application_starts(self, runs: Mapping[str, Mapping[str, str]],
                           date: str) -> list[tuple[str, int, float]]:
        """(region, token, start epoch) of every Spark application of ``date`` that started in
        any try of the Spark task, from the line the job logs once its SparkContext exists."""
        found = []
        for name, by_date in runs.items():
            if date not in by_date:
                continue
            region = self.region(name)
            ti = region.task_instances(DAG_ID, by_date[date]).get(SPARK_TASK) or {}
            for attempt in range(1, int(ti.get("try_number") or 1) + 1):
                log = region.task_log(DAG_ID, by_date[date], SPARK_TASK, attempt)
                found += [(name, token, at) for token, at in application_starts(log)]
        return found

    def fences(self, runs: Mapping[str, Mapping[str, str]]) -> list[tuple[str, str, float]]:
        """(region, date, epoch) of every Spark-task try that failed with a fencing reason."""
        from datetime import datetime

        found = []
        for name, by_date in runs.items():
            region = self.region(name)
            for date, run_id in by_date.items():
                ti = region.task_instances(DAG_ID, run_id).get(SPARK_TASK) or {}
                for attempt in range(1, int(ti.get("try_number") or 1) + 1):
                    log = region.task_log(DAG_ID, run_id, SPARK_TASK, attempt)
                    if not is_fence(failure_reason(log)):
                        continue
                    path = region.log_path(DAG_ID, run_id, SPARK_TASK, attempt)
                    at = path.stat().st_mtime
                    if attempt == ti.get("try_number") and ti.get("end_date"):
                        at = datetime.fromisoformat(ti["end_date"]).timestamp()
                    found.append((name, date, at))
        return found

    def asset_events(self, dates: Sequence[str]) -> dict[str, dict[str, dict[str, Any] | None]]:
        """date -> region -> the ``extra["neli"]`` of that region's asset event of the daily
        asset for the date's run key (None when the region has none), read from each region's
        REST API (``GET /api/v2/assets/events``), as its UI's asset page shows them."""
        keys = {run_key_of(date): date for date in dates}
        found: dict[str, dict[str, dict[str, Any] | None]] = {
            date: {r.name: None for r in self.regions or []} for date in dates}
        for region in self.regions or []:
            events = region.api("GET", "/api/v2/assets/events?limit=1000")["asset_events"]
            for event in events:
                neli = (event.get("extra") or {}).get("neli")
                if event.get("name") != ASSET or not isinstance(neli, dict):
                    continue
                date = keys.get(str(neli.get("run_key")))
                if date is not None:
                    found[date][region.name] = neli
        return found

    @property
    def ledger_topic(self) -> str:
        from neli_orchestrate.core.namespace import derive

        return derive(self.namespace).ledger_topic

    def history(self) -> list[Any]:
        return ledger_history(self.bootstrap, self.ledger_topic)

    def sink_token(self, date: str) -> int | None:
        """The token of the date's published output (directory sink: the commit marker)."""
        from neli_orchestrate.spark import TokenCommitGuard

        marker = TokenCommitGuard(self.output, partition_column="date").committed(date)
        return marker.token if marker else None

    def sink_committed(self, date: str) -> tuple[str, int] | None:
        """(deployment, token) of the date's output once a job committed it, else None: cheap
        enough to poll (the Delta table's log is read with delta-rs, no Spark)."""
        if self.settings.sink == "directory":
            from neli_orchestrate.spark import TokenCommitGuard

            marker = TokenCommitGuard(self.output, partition_column="date").committed(date)
            return (str(marker.deployment), marker.token) if marker else None
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            history = DeltaTable(str(self.table)).history()
        except TableNotFoundError:
            return None
        for commit in history:  # newest first
            try:
                meta = json.loads(commit.get("userMetadata") or "{}")
            except ValueError:
                continue
            if isinstance(meta, dict) and meta.get("neli.run_key") == date:
                return str(meta.get("neli.deployment")), int(meta["neli.token"])
        return None

    def table_state(self, date: str) -> TableState:
        """The date's commits in the Delta table's own history and the rows the table holds for
        it now, read with delta-rs: no JVM in the demo's process (its log lines would land
        between the demo's tables)."""
        import datetime

        import pyarrow.compute as pc  # type: ignore[import-untyped]
        from deltalake import DeltaTable

        if not (self.table / "_delta_log").is_dir():
            return TableState(commits=[])
        table = DeltaTable(str(self.table))
        commits: list[tuple[int, int | None]] = []
        written: Any = None
        for commit in sorted(table.history(), key=lambda c: int(c["version"])):
            try:
                meta = json.loads(commit.get("userMetadata") or "{}")
            except ValueError:
                continue
            if not isinstance(meta, dict) or meta.get("neli.run_key") != date:
                continue
            token = meta.get("neli.token")
            commits.append((int(commit["version"]), None if token is None else int(token)))
            written = (commit.get("operationMetrics") or {}).get("numOutputRows")
        if not commits:
            return TableState(commits=[])
        day = datetime.date.fromisoformat(date)
        rows = table.to_pyarrow_dataset().to_table(
            columns=["carrier", "origin"], filter=pc.field("date") == day)
        return TableState(
            commits=commits,
            rows=rows.num_rows,
            distinct_rows=rows.group_by(["carrier", "origin"]).aggregate([]).num_rows,
            written_rows=int(written) if written is not None else None,
        )

    def assess(
        self, dates: Sequence[str], runs: Mapping[str, Mapping[str, str]] | None = None
    ) -> tuple[Report, list[Any]]:
        assert self.observer is not None
        history = self.history()
        report = assess(
            self.observer,
            history,
            dates,
            run_key_of,
            task_states=self.task_states(runs) if runs else None,
            sink_token=self.sink_token if self.settings.sink == "directory" else None,
            table_state=self.table_state if self.settings.sink == "delta" else None,
            app_starts=(lambda date: self.application_starts(runs, date)) if runs else None,
        )
        return report, history

    # -- faults ----------------------------------------------------------------------------

    def kill_region(self, name: str) -> list[int]:
        """kill -9 every process of region ``name`` (a lost region); see :meth:`start_region`."""
        pids = self.region(name).kill()
        logger.info("killed region %s (%d processes)", name, len(pids))
        return pids

    def start_region(self, name: str) -> None:
        """Start region ``name`` again on its home and database; return once healthy."""
        region = self.region(name)
        region.launch()
        region.wait_healthy(self.settings.start_timeout)

    def restart_region(self, name: str) -> None:
        """Stop region ``name`` as an operator would (SIGTERM, then what is left with SIGKILL)
        and start it again."""
        self.region(name).stop()
        self.start_region(name)

    def mid_job(self, dates: Sequence[str], *, after: float = 3.0) -> Span | None:
        """A Spark execution of ``dates`` whose PySpark driver has run ``after`` seconds, if any
        (the JVM alone is still booting: that is not yet mid-job). On the suite's standalone
        cluster, also the application of its date must have been registered with the master
        for ``after`` seconds: executors on the worker, the job under way there."""
        import psutil

        assert self.observer is not None
        now = time.time()
        on_cluster = self._cluster_apps() if self.spark_cluster is not None else None
        for span in self.observer.running_jvms():
            if span.date not in dates or span.pid is None:
                continue
            if on_cluster is not None and not any(
                name == f"nycflights_daily {span.date}" and now - started >= after
                for name, started in on_cluster
            ):
                continue
            try:
                drivers = [
                    p for p in psutil.Process(span.pid).children()
                    if p.name().startswith("python")
                ]
            except psutil.Error:
                continue
            if any(now - d.create_time() >= after for d in drivers):
                return span
        return None

    def _cluster_apps(self) -> list[tuple[str, float]]:
        """(name, start epoch) of the applications running on the suite's standalone cluster."""
        try:
            state = self.spark_cluster.state()
        except OSError as exc:
            logger.warning("could not read the Spark master's status: %s", exc)
            return []
        return [(str(app.get("name")), float(app.get("starttime", 0)) / 1000.0)
                for app in state.get("activeapps", []) if app.get("state") == "RUNNING"]

    def wait_mid_job(
        self, dates: Sequence[str], *, after: float = 3.0, timeout: float = 300.0
    ) -> Span:
        """Wait until some date's Spark job is mid-job (see :meth:`mid_job`); return it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            span = self.mid_job(dates, after=after)
            if span is not None:
                return span
            time.sleep(0.2)
        raise HarnessError(
            f"no Spark job of {list(dates)} ran for {after:g} s within {timeout:g} s"
        )

    def kill_task(self, span: Span, kind: str = "kill") -> Fault:
        """kill -9 the Airflow task process that runs ``span``'s Spark job, and everything under
        it (spark-submit, JVM, Python driver): what losing the worker does to the job."""
        import psutil

        assert self.observer is not None and span.pid is not None
        task_pid = psutil.Process(span.pid).ppid()  # spark-submit's JVM runs under the task
        at = time.time()
        pids = kill_tree(task_pid, 9)
        logger.info("killed task process %s of %s (%s) and %s", task_pid, span.region,
                    span.date, pids[1:])
        return self.observer.fault(
            Fault(kind, span.region, span.date, at, pids, detail=f"task pid {task_pid}")
        )


def log_to_file(path: Path) -> None:
    """Send every log record (ours, librdkafka's, Airflow's) to ``path``; the console shows
    only the demo's own progress."""
    import airflow.sdk  # noqa: F401 - Airflow configures logging on import: let it, then replace

    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def remove_workdir(workdir: Path) -> None:
    """Delete ``workdir`` after detaching the log file inside it (:func:`log_to_file`), so a
    late record (py4j's gateway closing at exit) has nowhere to fail to reopen it."""
    import shutil

    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).is_relative_to(
                workdir.resolve()):
            root.removeHandler(handler)
            handler.close()
    shutil.rmtree(workdir, ignore_errors=True)


def task_pids(region: AirflowRegion, run_id: str, task_id: str) -> list[int]:
    """Pids of the Airflow task process(es) running ``task_id`` of ``run_id`` in ``region``
    (the process whose title is ``airflow worker -- <task instance id>``), without their
    children."""
    import psutil

    ti = region.task_instances(DAG_ID, run_id).get(task_id) or {}
    ti_id = ti.get("id")
    if not ti_id:
        return []
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        title = " ".join(proc.info["cmdline"] or [])
        # not the LocalExecutor worker supervising it ("airflow worker -- LocalExecutor: <id>"):
        # killing the supervisor too would leave the try "running" until the scheduler's task
        # heartbeat timeout, instead of failing it at once as a lost task process does
        if ti_id in title and "LocalExecutor" not in title:
            found.append(proc.pid)
    return found


_REASON = re.compile(r"(Fenced[^\n]*|[^\n]*superseded[^\n]*|[^\n]*isn't defined[^\n]*)")


def failure_reason(log: str) -> str:
    """The fencing (or other) reason a failed task logged: its last matching line, else its
    last ERROR line."""
    matches = _REASON.findall(log)
    if matches:
        return matches[-1].strip()[:300]
    errors = [line for line in log.splitlines() if line.startswith("error")]
    return errors[-1][:300] if errors else ""


def is_fence(reason: str) -> bool:
    """Whether a failure reason says the task was fenced or superseded."""
    text = reason.lower()
    return "fenced" in text or "superseded" in text
