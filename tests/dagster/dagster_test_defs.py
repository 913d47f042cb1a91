"""Definitions the Dagster tests run in separate processes, one Dagster instance per deployment.

Everything a deployment differs in comes from the environment (as in production, where each
deployment has its own env): ``NELI_BOOTSTRAP_SERVERS``, ``NELI_DEPLOYMENT``,
``NELI_NAMESPACE``, and ``NELI_TEST_DIR`` (where the work leaves its evidence).

Evidence, appended with O_APPEND so concurrent writers never interleave a line:
- ``work.log``: one line ``<role> <run key> <deployment> <token> <pid>`` per execution of work;
- ``fenced_spark-<deployment>.json``: written by the fencing asset once its Spark job runs;
- ``flaky-failed``: created by the first execution of ``flaky_daily`` (which then fails);
- ``io/``: the asset values (the IO manager's storage, shared by the deployments).
"""

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import PrivateAttr

from neli_orchestrate.dagster import NeliResource, NeliRun, leader_gate_op, singleton_asset
from neli_orchestrate.errors import WorkSkipped

DAYS = dg.DailyPartitionsDefinition(start_date="2013-01-01", end_date="2014-01-01")

GATED_ROLE = "gated_daily"
# Simulated work: long enough that the losing deployment's member joins the role's group (and
# the group rebalances) while the winner works, which must not disturb the winner.
# (the chaos suite lengthens it, to kill a step mid-work: integration/chaos/dagster.py)
WORK_SECONDS = float(os.environ.get("NELI_TEST_WORK_SECONDS", "2.0"))
STEP_BARRIER_TIMEOUT = 120.0
# The fencing asset's Spark tasks run until released or cancelled; the limit only bounds a
# leak (above the fencing test's step timeouts, so it never stands in for a cancel).
SPARK_TASK_LIMIT_SECONDS = 900.0


def evidence_dir() -> Path:
    return Path(os.environ["NELI_TEST_DIR"])


def record_work(run: NeliRun) -> None:
    """Append the proof that the work of ``run`` executed here, now."""
    line = f"{run.role} {run.run_key} {run.deployment} {run.token} {os.getpid()}\n"
    fd = os.open(evidence_dir() / "work.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def partition_key_when_peers_arrive(context: Any) -> str:
    """Run key callable: the partition key, once every peer deployment's step got this far.

    Both deployments then contend for the role at the same instant, so either may win; with
    ``NELI_TEST_PEERS`` unset it returns at once.
    """
    key = context.partition_key
    peers = [p for p in os.environ.get("NELI_TEST_PEERS", "").split(",") if p]
    if peers:
        folder = evidence_dir() / "step-barrier" / context.job_name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{key}.{os.environ['NELI_DEPLOYMENT']}").touch()
        deadline = time.monotonic() + STEP_BARRIER_TIMEOUT
        while not all((folder / f"{key}.{peer}").exists() for peer in peers):
            if time.monotonic() > deadline:
                raise TimeoutError(f"peers {peers} did not reach {key} in {context.job_name}")
            time.sleep(0.01)
    return key


def neli_resource() -> NeliResource:
    return NeliResource(
        bootstrap_servers=dg.EnvVar("NELI_BOOTSTRAP_SERVERS"),
        deployment=dg.EnvVar("NELI_DEPLOYMENT"),
        namespace=dg.EnvVar("NELI_NAMESPACE"),
        handoff_timeout=float(os.environ.get("NELI_TEST_HANDOFF_TIMEOUT", "30")),
        acquire_timeout=60.0,
        # Loopback timings, with a session long enough that a CPU-starved step is not fenced by
        # accident: 6 s was not, on two cores shared by several test runs (load average ~40).
        # No test here waits for a session to expire except the fencing test, which sets its own.
        profile="fast",
        session_timeout=float(os.environ.get("NELI_TEST_SESSION_TIMEOUT", "15")),
        wait_timeout=120.0,
        wait_interval=0.3,
    )


# -- the asset pattern ----------------------------------------------------------------------


@singleton_asset(partitions_def=DAYS, run_key=partition_key_when_peers_arrive)
def daily_counted(context: dg.AssetExecutionContext, run: NeliRun) -> int:
    record_work(run)
    time.sleep(WORK_SECONDS)
    return int(run.token)


@dg.asset(partitions_def=DAYS)
def daily_counted_report(context: dg.AssetExecutionContext, daily_counted: int) -> str:
    return f"{context.partition_key} computed with token {daily_counted}"


# -- the op pattern: gate -> singleton op -> report ----------------------------------------

daily_gate = leader_gate_op(GATED_ROLE, run_key=partition_key_when_peers_arrive)


@dg.op(ins={"claimed": dg.In(dg.Nothing)}, out=dg.Out(int, is_required=False))
def gated_work(context: dg.OpExecutionContext, neli: NeliResource):  # type: ignore[no-untyped-def]
    with neli.singleton(context, role=GATED_ROLE) as run:
        if not run.should_run:
            return
        record_work(run)
        time.sleep(WORK_SECONDS)
        run.check()
        yield dg.Output(int(run.token), metadata=run.metadata)


@dg.op
def gated_report(context: dg.OpExecutionContext, token: int) -> str:
    return f"{context.partition_key} computed with token {token}"


@dg.job(partitions_def=DAYS)
def gated_job() -> None:
    gated_report(gated_work(claimed=daily_gate()))


# -- fencing: Spark work that runs until it is cancelled ------------------------------------


class TestSpark(dg.ConfigurableResource):
    """A small local SparkSession per step process, started before the step claims its run.

    Starting the JVM is the heaviest thing a step does; on a loaded two-core machine doing it
    while holding the role starved the NELI member into fencing itself before any work ran.
    """

    _session: Any = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self.session()

    def session(self) -> Any:
        if self._session is None:
            from pyspark.sql import SparkSession

            from neli_orchestrate.spark.conf import local_spark_conf

            builder = SparkSession.builder.master("local[2]").appName("neli dagster fencing")
            conf = {**local_spark_conf(), "spark.pyspark.python": sys.executable}
            for key, value in conf.items():
                builder = builder.config(key, value)
            self._session = builder.getOrCreate()
        return self._session

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._session is not None:
            self._session.stop()
            self._session = None


def _task_until_released(folder: str, deployment: str, limit: float):  # type: ignore[no-untyped-def]
    """Return a Spark task that says it started, then runs until released, the limit, or killed.

    Evidence and release files are per deployment (``task-<deployment>-<i>.started``,
    ``release-<deployment>``), so the test can let one deployment's job finish while the
    other's is still held. A closure, so Spark's cloudpickle ships it by value: the Python
    workers cannot import this test module.
    """

    def task(index: int) -> int:
        import os
        import time
        from pathlib import Path

        start = time.monotonic()
        Path(folder, f"task-{deployment}-{index}.started").write_text(str(os.getpid()))
        release = Path(folder, f"release-{deployment}")
        while not release.exists() and time.monotonic() - start < limit:
            time.sleep(0.05)
        Path(folder, f"task-{deployment}-{index}.finished").write_text(str(os.getpid()))
        return index

    return task


@singleton_asset(partitions_def=DAYS)
def fenced_spark(context: dg.AssetExecutionContext, run: NeliRun, spark: TestSpark) -> int:
    session = spark.session()
    task = _task_until_released(str(evidence_dir()), run.deployment, SPARK_TASK_LIMIT_SECONDS)
    with run.cancel_spark_on_fence(session):
        (evidence_dir() / f"fenced_spark-{run.deployment}.json").write_text(
            json.dumps({"pid": os.getpid(), "token": run.token, "run_key": run.run_key})
        )
        rdd = session.sparkContext.parallelize(range(2), 2)
        done = rdd.map(task).collect()
    record_work(run)
    return len(done)


# -- a step that fails once, then succeeds on Dagster's retry -----------------------------

FLAKY_RETRY_DELAY = 2.0


@singleton_asset(
    partitions_def=DAYS,
    run_key=partition_key_when_peers_arrive,
    retry_policy=dg.RetryPolicy(max_retries=1, delay=FLAKY_RETRY_DELAY),
)
def flaky_daily(context: dg.AssetExecutionContext, run: NeliRun) -> int:
    """Fails its first execution in any deployment (after working a while), then succeeds."""
    record_work(run)
    time.sleep(WORK_SECONDS)
    try:
        fd = os.open(evidence_dir() / "flaky-failed", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return int(run.token)
    os.close(fd)
    raise RuntimeError(f"flaky_daily fails its first execution (token {run.token})")


@dg.asset(partitions_def=DAYS)
def flaky_daily_report(context: dg.AssetExecutionContext, flaky_daily: int) -> str:
    return f"{context.partition_key} computed with token {flaky_daily}"


# -- a step whose work skips itself: COMPLETED "skipped by the task", nothing to materialize --


@singleton_asset(partitions_def=DAYS)
def skipping_daily(context: dg.AssetExecutionContext, run: NeliRun) -> int:
    record_work(run)
    raise WorkSkipped(f"no flights on {context.partition_key}: nothing to do")


@dg.asset(partitions_def=DAYS)
def skipping_daily_report(context: dg.AssetExecutionContext, skipping_daily: int) -> str:
    return f"{context.partition_key} computed with token {skipping_daily}"


# -- definitions and reconstructable job getters -------------------------------------------

defs = dg.Definitions(
    assets=[daily_counted, daily_counted_report, fenced_spark, flaky_daily, flaky_daily_report,
            skipping_daily, skipping_daily_report],
    jobs=[
        gated_job,
        dg.define_asset_job(
            "counted_job", selection=[daily_counted, daily_counted_report], partitions_def=DAYS
        ),
        dg.define_asset_job("fenced_spark_job", selection=[fenced_spark], partitions_def=DAYS),
        dg.define_asset_job(
            "flaky_job", selection=[flaky_daily, flaky_daily_report], partitions_def=DAYS
        ),
        dg.define_asset_job(
            "skipping_job", selection=[skipping_daily, skipping_daily_report], partitions_def=DAYS
        ),
    ],
    resources={
        "neli": neli_resource(),
        "spark": TestSpark(),
        # Storage every deployment reads: where a partition is materialized by proxy, its
        # downstream assets load the value the running deployment stored (docs/guide/dagster.md).
        "io_manager": dg.FilesystemIOManager(
            base_dir=str(Path(os.environ.get("NELI_TEST_DIR", tempfile.gettempdir())) / "io")
        ),
    },
)


def get_counted_job() -> dg.JobDefinition:
    return defs.resolve_job_def("counted_job")


def get_gated_job() -> dg.JobDefinition:
    return defs.resolve_job_def("gated_job")


def get_fenced_spark_job() -> dg.JobDefinition:
    return defs.resolve_job_def("fenced_spark_job")


def get_flaky_job() -> dg.JobDefinition:
    return defs.resolve_job_def("flaky_job")


def get_skipping_job() -> dg.JobDefinition:
    return defs.resolve_job_def("skipping_job")


JOB_GETTERS = {
    "skipping_job": get_skipping_job,
    "flaky_job": get_flaky_job,
    "counted_job": get_counted_job,
    "gated_job": get_gated_job,
    "fenced_spark_job": get_fenced_spark_job,
}
