"""Every outcome of a singleton block as Dagster sees it, with scripted members (no Kafka).

The real Singleton runs over MockNeli members and the in-memory ledger (which fences writers as
Kafka transactions do), so each path is deterministic: run, skip with a trace, fence during the
work (Spark jobs cancelled, step failed for good), wait and give up, attempt limit reached.
The same paths against the real broker and real PySpark are in the two-deployment and fencing
tests.
"""

import json
import logging
import threading
import time
from collections import defaultdict
from typing import Any

import dagster as dg
import jsonschema
import pytest

from neli_orchestrate.core.config import NeliConfig
from neli_orchestrate.core.mock import MockNeli
from neli_orchestrate.dagster import NeliResource, NeliRun, singleton_asset
from neli_orchestrate.errors import ConfigError
from neli_orchestrate.ledger.record import RunState
from neli_orchestrate.lineage.facet import schema_file
from neli_orchestrate.singleton.singleton import Singleton
from neli_orchestrate.testing.memory_ledger import MemoryLedger

pytestmark = [pytest.mark.dagster]

DAYS = dg.DailyPartitionsDefinition(start_date="2013-01-01", end_date="2014-01-01")
DAY = "2013-01-05"


class Member(MockNeli):
    """A member the scripted group makes leader at once, unless the group is held."""

    def __init__(self, world: "World", group: str, config: NeliConfig, barrier: Any) -> None:
        super().__init__(config, barrier, member_id=f"m{len(world.members)}")
        self.world = world
        self.group = group
        self._idle = threading.Event()

    def pulse(self, timeout: float = 0.0) -> bool:
        leading = super().pulse(timeout)
        if leading and timeout:
            self._idle.wait(timeout)  # a real pulse blocks in poll; do not spin
        return leading

    def close(self) -> None:
        super().close()
        self._idle.set()


class World:
    """One scripted Kafka: the ledger, the members created so far, groups nobody may lead."""

    def __init__(self) -> None:
        self.ledger = MemoryLedger()
        self.members: list[Member] = []
        self.held_groups: set[str] = set()
        self.by_group: dict[str, list[Member]] = defaultdict(list)
        #: Groups another deployment's member is in (what describe_consumer_groups would say).
        self.busy_groups: set[str] = set()

    def membership(self, group: str) -> int:
        return 1 if group in self.busy_groups else 0

    def __call__(self, config: NeliConfig, barrier: Any = None) -> Member:
        group = config.resolved.group_id
        member = Member(self, group, config, barrier)
        self.members.append(member)
        self.by_group[group].append(member)
        if group not in self.held_groups:
            member.acquire()
        return member


WORLD = World()


class ScriptedNeliResource(NeliResource):
    """NeliResource whose Singleton talks to the scripted world instead of Kafka."""

    def get_singleton(self) -> Singleton:
        return Singleton(
            self.singleton_config(),
            ledger=WORLD.ledger,
            neli_factory=WORLD,
            membership=WORLD.membership,
        )


INSTANCE: dg.DagsterInstance


@pytest.fixture(autouse=True)
def fresh_world() -> Any:
    global WORLD, INSTANCE
    WORLD = World()
    with dg.DagsterInstance.ephemeral() as instance:
        INSTANCE = instance
        yield WORLD


def neli(**overrides: Any) -> ScriptedNeliResource:
    fields: dict[str, Any] = {
        "bootstrap_servers": "unused:9092",
        "deployment": "east",
        "namespace": "acme",
        "acquire_timeout": 0.2,
        "wait_timeout": 0.6,
        "wait_interval": 0.1,
    }
    fields.update(overrides)
    return ScriptedNeliResource(**fields)


class FakeSparkContext:
    """Records what the job-group canceller does to a SparkContext."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.cancelled = threading.Event()

    def setJobGroup(self, group: str, description: str, interrupt: bool) -> None:  # noqa: N802
        self.calls.append(("setJobGroup", group))

    def addJobTag(self, tag: str) -> None:  # noqa: N802
        self.calls.append(("addJobTag", tag))

    def removeJobTag(self, tag: str) -> None:  # noqa: N802
        self.calls.append(("removeJobTag", tag))

    def setLocalProperty(self, key: str, value: Any) -> None:  # noqa: N802
        pass

    def cancelJobGroup(self, group: str) -> None:  # noqa: N802
        self.calls.append(("cancelJobGroup", group))
        self.cancelled.set()

    def cancelJobsWithTag(self, tag: str) -> None:  # noqa: N802
        self.calls.append(("cancelJobsWithTag", tag))


def _events(result: dg.ExecuteInProcessResult, kind: str) -> list[Any]:
    return [e for e in result.all_events if e.event_type_value == kind]


def _materialize(asset: Any, resource: NeliResource, **extra: Any) -> dg.ExecuteInProcessResult:
    @dg.asset(partitions_def=DAYS, deps=[asset])
    def downstream() -> None:
        pass

    return dg.materialize(
        [asset, downstream],
        partition_key=DAY,
        resources={"neli": resource, **extra},
        raise_on_error=False,
        instance=INSTANCE,
    )


def _log_messages(result: dg.ExecuteInProcessResult, level: int) -> list[str]:
    """What the step logged through ``context.log`` at ``level``: the run's event log."""
    return [
        entry.user_message
        for entry in INSTANCE.all_logs(result.run_id)
        if not entry.is_dagster_event and entry.level == level
    ]


def test_run_executes_once_then_every_deployment_skips_with_a_trace() -> None:
    ran: list[tuple[str, int]] = []

    @singleton_asset(partitions_def=DAYS)
    def daily(context: dg.AssetExecutionContext, run: NeliRun) -> int:
        ran.append((run.deployment, run.token))
        return 1

    first = _materialize(daily, neli(deployment="east"))
    assert first.success
    [(deployment, token)] = ran
    assert deployment == "east"
    [materialization] = [
        e.step_materialization_data.materialization
        for e in _events(first, "ASSET_MATERIALIZATION")
        if e.step_key == "daily"
    ]
    assert {k: v.value for k, v in materialization.metadata.items()}.items() >= {
        "token": token,
        "deployment": "east",
        "role": "daily",
        "run_key": DAY,
        "neli_outcome": "RUN",
    }.items()
    assert isinstance(materialization.metadata["started_at"], dg.TimestampMetadataValue)
    assert isinstance(materialization.metadata["time_to_lead"], dg.FloatMetadataValue)
    # OpenLineage's `neli` run facet, as the Airflow provider's events carry it
    schema = json.loads(schema_file().read_text())
    ran_facet = materialization.metadata["neli"].value
    jsonschema.validate(ran_facet, schema)
    assert {k: ran_facet[k] for k in ("role", "run_key", "token", "deployment", "recorded_by",
                                      "proxy")} == {
        "role": "daily", "run_key": DAY, "token": token, "deployment": "east",
        "recorded_by": "east", "proxy": False}

    for region in ("west", "east"):
        again = _materialize(daily, neli(deployment=region))
        assert again.success
        # materialized by proxy: the catalog here sees the partition, downstream runs here
        proxy = _materialization_of(again, "daily")
        assert proxy.partition == DAY
        assert _values(proxy.metadata).items() >= {
            "neli_by_proxy": True,
            "neli_outcome": "SKIP_DONE",
            "deployment": "east",
            "token": token,
            "role": "daily",
            "run_key": DAY,
            "recorded_by": region,
        }.items()
        proxy_facet = proxy.metadata["neli"].value
        jsonschema.validate(proxy_facet, schema)
        assert {k: proxy_facet[k] for k in ("role", "run_key", "token", "deployment")} == {
            k: ran_facet[k] for k in ("role", "run_key", "token", "deployment")}
        assert (proxy_facet["recorded_by"], proxy_facet["proxy"], proxy_facet["state"]) == (
            region, region != "east", "COMPLETED")
        done_at = proxy.metadata["completed_at"]
        assert isinstance(done_at, dg.TimestampMetadataValue)
        assert abs(done_at.value - time.time()) < 60
        assert _materialization_of(again, "downstream").partition == DAY
        assert _events(again, "STEP_SKIPPED") == []
        assert _events(again, "ASSET_OBSERVATION") == []
    assert len(ran) == 1
    assert WORLD.ledger.history("daily", DAY) == [RunState.RUNNING, RunState.COMPLETED]


def _values(metadata: Any) -> dict[str, Any]:
    return {k: v.value for k, v in metadata.items()}


def _materialization_of(result: dg.ExecuteInProcessResult, step: str) -> Any:
    [materialization] = [
        e.step_materialization_data.materialization
        for e in _events(result, "ASSET_MATERIALIZATION")
        if e.step_key == step
    ]
    return materialization


def test_the_materialization_by_proxy_links_to_the_partition_where_it_ran() -> None:
    @singleton_asset(partitions_def=DAYS, key_prefix=["flights"])
    def daily(context: dg.AssetExecutionContext, run: NeliRun) -> int:
        return 1

    assert _materialize(daily, neli(deployment="east")).success
    urls = {"east": "http://dagster.east.example:3000/", "west": "http://dagster.west.example"}
    again = _materialize(daily, neli(deployment="west", region_urls=urls))
    link = _materialization_of(again, "flights__daily").metadata["ran_in_url"]
    assert isinstance(link, dg.UrlMetadataValue)
    # east's catalog: this partition's materializations, each linking to its run
    assert link.value == (
        f"http://dagster.east.example:3000/assets/flights/daily?view=events&partition={DAY}")
    # a deployment whose UI is not listed: no link
    unknown = _materialize(daily, neli(deployment="west", region_urls={"west": urls["west"]}))
    assert "ran_in_url" not in _materialization_of(unknown, "flights__daily").metadata


def test_materialize_by_proxy_off_observes_and_skips_downstream() -> None:
    @singleton_asset(partitions_def=DAYS, materialize_by_proxy=False)
    def daily(context: dg.AssetExecutionContext, run: NeliRun) -> int:
        return 1

    assert _materialize(daily, neli(deployment="east")).success
    again = _materialize(daily, neli(deployment="west"))
    assert again.success
    assert _events(again, "ASSET_MATERIALIZATION") == []
    assert [e.step_key for e in _events(again, "STEP_SKIPPED")] == ["downstream"]
    [observation] = [
        e.asset_observation_data.asset_observation for e in _events(again, "ASSET_OBSERVATION")
    ]
    assert _values(observation.metadata).items() >= {"deployment": "east", "recorded_by": "west",
                                                     "neli_by_proxy": True}.items()


def test_a_plain_singleton_block_that_returns_records_the_materialization_by_proxy() -> None:
    @dg.asset(partitions_def=DAYS, output_required=False)
    def daily(context: dg.AssetExecutionContext, neli: NeliResource):  # type: ignore[no-untyped-def]
        with neli.singleton(context) as run:
            if not run.should_run:
                return
            yield dg.Output(1, metadata=run.metadata)

    assert _materialize(daily, neli(deployment="east")).success
    again = _materialize(daily, neli(deployment="west"))
    assert again.success
    proxy = _materialization_of(again, "daily")
    assert _values(proxy.metadata).items() >= {"deployment": "east", "neli_by_proxy": True}.items()
    # no output: the rest of this Dagster run is skipped (materialize_by_proxy() would run it)
    assert [e.step_key for e in _events(again, "STEP_SKIPPED")] == ["downstream"]


def test_a_run_skipped_by_its_task_is_observed_not_materialized_by_proxy() -> None:
    from neli_orchestrate.errors import WorkSkipped

    @dg.asset(partitions_def=DAYS, output_required=False)
    def daily(context: dg.AssetExecutionContext, neli: NeliResource):  # type: ignore[no-untyped-def]
        with neli.singleton(context) as run:
            if not run.should_run:
                assert run.skipped_by_task
                with pytest.raises(ConfigError, match="skipped by the task in deployment 'east'"):
                    run.materialize_by_proxy()
                return
            raise WorkSkipped("no flights today")
        return  # the skip ends the block: no output
        yield  # a generator: the output is optional

    first = _materialize(daily, neli(deployment="east"))
    assert first.success and _events(first, "ASSET_MATERIALIZATION") == []
    again = _materialize(daily, neli(deployment="west"))
    assert again.success
    assert _events(again, "ASSET_MATERIALIZATION") == []  # nothing by proxy: nothing was made
    [observation] = [
        e.asset_observation_data.asset_observation for e in _events(again, "ASSET_OBSERVATION")
    ]
    assert _values(observation.metadata).items() >= {
        "deployment": "east", "recorded_by": "west", "neli_by_proxy": True,
        "neli_skipped_by_task": True, "reason": "skipped by the task: no flights today"}.items()
    assert [e.step_key for e in _events(again, "STEP_SKIPPED")] == ["downstream"]
    assert any("skipped by the task in east" in m for m in _log_messages(again, logging.INFO))


LAST_DAY = "2013-12-31"  # eager() considers the latest time partition only


@pytest.mark.parametrize("by_proxy", [True, False])
def test_eager_downstream_is_requested_where_the_partition_was_materialized_by_proxy(
    by_proxy: bool,
) -> None:
    @singleton_asset(partitions_def=DAYS, name="daily", materialize_by_proxy=by_proxy)
    def daily(context: dg.AssetExecutionContext, run: NeliRun) -> int:
        return 1

    @dg.asset(
        partitions_def=DAYS, deps=[daily], automation_condition=dg.AutomationCondition.eager()
    )
    def daily_summary() -> None:
        pass

    def materialize_in(region: str, instance: dg.DagsterInstance) -> None:
        result = dg.materialize(
            [daily], partition_key=LAST_DAY, instance=instance,
            resources={"neli": neli(deployment=region)},
        )
        assert result.success

    defs = dg.Definitions(assets=[daily, daily_summary], resources={"neli": neli()})
    with dg.DagsterInstance.ephemeral() as east, dg.DagsterInstance.ephemeral() as west:
        instances = {"east": east, "west": west}
        # The first evaluation only sets the cursor (eager() waits for an update after it).
        cursors = {
            name: dg.evaluate_automation_conditions(defs=defs, instance=instance).cursor
            for name, instance in instances.items()
        }
        materialize_in("east", east)  # runs the work
        materialize_in("west", west)  # completed elsewhere
        requested = {
            name: dg.evaluate_automation_conditions(
                defs=defs, instance=instance, cursor=cursors[name]
            ).get_requested_partitions(daily_summary.key)
            for name, instance in instances.items()
        }
    assert requested["east"] == {LAST_DAY}
    # West's catalog sees the partition only through the materialization by proxy.
    assert requested["west"] == ({LAST_DAY} if by_proxy else set())


def test_fence_during_the_work_cancels_spark_jobs_and_fails_the_step_without_retry() -> None:
    spark = FakeSparkContext()
    attempts: list[int] = []

    @singleton_asset(partitions_def=DAYS)
    def daily(context: dg.AssetExecutionContext, run: NeliRun) -> int:
        attempts.append(run.token)
        with run.cancel_spark_on_fence(spark):
            WORLD.members[-1].fence()  # the member loses its heartbeat mid-work
            assert spark.cancelled.wait(10), "the fence callback never cancelled the jobs"
            raise RuntimeError("Job 0 cancelled part of cancelled job group")  # as Spark does
        return 1

    result = _materialize(daily, neli(), **{})
    assert not result.success
    [failure] = _events(result, "STEP_FAILURE")
    data = failure.step_failure_data
    assert data.error.cls_name == "Failure"
    [token] = attempts
    metadata = dict(data.user_failure_data.metadata)
    started_at = metadata.pop("started_at")
    assert isinstance(started_at, dg.TimestampMetadataValue)
    assert abs(started_at.value - time.time()) < 60
    assert metadata.pop("neli_outcome").value == "RUN"
    assert 0 <= metadata.pop("time_to_lead").value < 60
    # the failure names the run as the OpenLineage `neli` facet does (FAIL events carry it too)
    facet = metadata.pop("neli").value
    assert (facet["token"], facet["deployment"], facet["proxy"]) == (token, "east", False)
    assert {k: v.value for k, v in metadata.items()} == {
        "token": token,
        "deployment": "east",
        "role": "daily",
        "run_key": DAY,
    }
    # The fence is in the run's event log (Dagster's logger), not only in Python logging.
    [fence_log] = [m for m in _log_messages(result, logging.ERROR) if "fenced" in m]
    assert f"token {token}" in fence_log and "heartbeat" in fence_log
    group = f"neli/daily/{DAY}/{token}"
    assert ("setJobGroup", group) in spark.calls and ("cancelJobGroup", group) in spark.calls
    assert ("cancelJobsWithTag", group) in spark.calls
    assert _events(result, "STEP_UP_FOR_RETRY") == []
    # Nothing was recorded after the fence: the next leader takes the run over.
    assert WORLD.ledger.history("daily", DAY) == [RunState.RUNNING]


def test_fence_is_reported_even_when_the_work_finishes_anyway() -> None:
    @singleton_asset(partitions_def=DAYS, retry_policy=dg.RetryPolicy(max_retries=2))
    def daily(context: dg.AssetExecutionContext, run: NeliRun) -> int:
        WORLD.members[-1].fence()
        deadline = time.monotonic() + 10
        while not run.fenced and time.monotonic() < deadline:
            time.sleep(0.01)
        return 1  # plain Python work that never looked: leaving the block must not complete

    result = _materialize(daily, neli())
    # A fence fails the try, not the run: the retry policy applies (max_retries=2), and each
    # retry decides again and runs under a new claim (this world fences every try).
    assert len(_events(result, "STEP_UP_FOR_RETRY")) == 2
    assert len(_events(result, "STEP_FAILURE")) == 1  # the last try, retries used up
    assert _events(result, "ASSET_MATERIALIZATION") == []
    assert WORLD.ledger.history("daily", DAY) == [RunState.RUNNING] * 3


def test_step_waits_visibly_then_requests_retries_then_fails_never_skips() -> None:
    WORLD.held_groups.add("acme.daily")
    ran: list[int] = []

    @singleton_asset(partitions_def=DAYS)
    def daily(context: dg.AssetExecutionContext, run: NeliRun) -> int:
        ran.append(1)
        return 1

    started = time.monotonic()
    result = _materialize(daily, neli(wait_timeout=0.3, wait_retries=2))
    # Three step attempts, each waiting wait_timeout; retries show as UP_FOR_RETRY in the UI.
    assert time.monotonic() - started >= 3 * 0.3
    assert len(_events(result, "STEP_UP_FOR_RETRY")) == 2
    [failure] = _events(result, "STEP_FAILURE")
    description = failure.step_failure_data.user_failure_data.description
    assert "still held by another deployment" in description
    assert "never skipped" in description
    assert ran == [] and _events(result, "STEP_SKIPPED") == []
    # Every attempt to claim is in the run's event log, not a silent sleep.
    waits = [m for m in _log_messages(result, logging.INFO) if "neli: waiting for" in m]
    assert len(waits) >= 3, waits
    retries = [m for m in _log_messages(result, logging.WARNING) if "requesting step retry" in m]
    assert [m.split("requesting step retry ")[1][:3] for m in retries] == ["1/2", "2/2"]
    assert len(WORLD.members) >= 3, "each attempt tried again"
    assert all(m.closed for m in WORLD.members), "every attempt left the group"


def test_step_runs_once_the_holder_lets_go_during_the_wait() -> None:
    WORLD.held_groups.add("acme.daily")
    ran: list[int] = []

    @singleton_asset(partitions_def=DAYS)
    def daily(context: dg.AssetExecutionContext, run: NeliRun) -> int:
        ran.append(int(run.token))
        return 1

    release = threading.Timer(0.4, WORLD.held_groups.clear)
    release.start()
    try:
        result = _materialize(daily, neli(wait_timeout=30.0, wait_retries=0))
    finally:
        release.cancel()
    assert result.success
    assert len(ran) == 1 and _events(result, "STEP_UP_FOR_RETRY") == []
    assert WORLD.ledger.history("daily", DAY) == [RunState.RUNNING, RunState.COMPLETED]


def test_run_key_past_its_attempt_limit_fails_the_step_for_good() -> None:
    @singleton_asset(partitions_def=DAYS)
    def daily(context: dg.AssetExecutionContext, run: NeliRun) -> int:
        raise ValueError("bad input for the day")

    first = _materialize(daily, neli(max_attempts=1))
    [failure] = _events(first, "STEP_FAILURE")
    assert "bad input for the day" in failure.step_failure_data.error.cause.message
    assert WORLD.ledger.history("daily", DAY) == [RunState.RUNNING, RunState.FAILED]

    second = _materialize(daily, neli(max_attempts=1))
    [failure] = _events(second, "STEP_FAILURE")
    data = failure.step_failure_data
    assert data.error.cls_name == "Failure"
    assert "terminally failed" in data.user_failure_data.description
    assert "bad input for the day" in data.user_failure_data.description
    assert WORLD.ledger.history("daily", DAY) == [RunState.RUNNING, RunState.FAILED]


def test_a_role_per_partition_keeps_dates_apart_in_the_ledger() -> None:
    @singleton_asset(
        partitions_def=DAYS, role=lambda context: f"daily/{context.partition_key}"
    )
    def daily(context: dg.AssetExecutionContext, run: NeliRun) -> str:
        return run.role

    assert _materialize(daily, neli()).success
    assert WORLD.ledger.history(f"daily/{DAY}", DAY) == [RunState.RUNNING, RunState.COMPLETED]
    assert WORLD.ledger.history("daily", DAY) == []
    assert {m.group for m in WORLD.members} == {f"acme.daily/{DAY}"}


def test_spark_work_does_not_start_once_the_run_is_fenced() -> None:
    # Observed on a loaded machine: the fence came while the SparkSession was starting; the
    # job-group cancel then found no jobs, and the Spark job ran anyway.
    spark = FakeSparkContext()
    started: list[int] = []

    @singleton_asset(partitions_def=DAYS)
    def daily(context: dg.AssetExecutionContext, run: NeliRun) -> int:
        WORLD.members[-1].fence()
        deadline = time.monotonic() + 10
        while not run.fenced and time.monotonic() < deadline:
            time.sleep(0.01)
        with run.cancel_spark_on_fence(spark):
            started.append(1)
        return 1

    result = _materialize(daily, neli())
    [failure] = _events(result, "STEP_FAILURE")
    assert failure.step_failure_data.error.cls_name == "Failure"
    assert "fenced" in failure.step_failure_data.user_failure_data.description
    assert started == [], "Spark work started after the fence"
    assert _events(result, "STEP_UP_FOR_RETRY") == []
    assert WORLD.ledger.history("daily", DAY) == [RunState.RUNNING]


def test_reset_run_key_is_computed_again_in_the_one_deployment_that_runs_it() -> None:
    ran: list[tuple[str, int]] = []

    @singleton_asset(partitions_def=DAYS)
    def daily(context: dg.AssetExecutionContext, run: NeliRun) -> int:
        ran.append((run.deployment, int(run.token)))
        return 1

    assert _materialize(daily, neli(deployment="east")).success
    assert _materialize(daily, neli(deployment="west")).success  # skips: done in east
    with pytest.raises(ConfigError, match="reason"):
        neli(deployment="west").reset("daily", DAY, reason=" ")
    record = neli(deployment="west").reset("daily", DAY, reason="late data, ticket DATA-1")
    assert record.state is RunState.RESET and record.reason == "late data, ticket DATA-1"

    again = _materialize(daily, neli(deployment="west"))
    assert again.success
    [(first, first_token), (second, second_token)] = ran
    assert (first, second) == ("east", "west")
    assert second_token > record.token > first_token
    [materialization] = [
        e.step_materialization_data.materialization
        for e in _events(again, "ASSET_MATERIALIZATION")
        if e.step_key == "daily"
    ]
    assert materialization.metadata["neli_outcome"].value == "RUN"
    assert _materialize(daily, neli(deployment="east")).success  # done again: skips
    assert len(ran) == 2
    assert WORLD.ledger.history("daily", DAY) == [
        RunState.RUNNING, RunState.COMPLETED, RunState.RESET, RunState.RUNNING, RunState.COMPLETED,
    ]


def test_step_does_not_join_a_busy_role_group_while_it_waits() -> None:
    # The busy-group rule (Singleton): while another deployment's member leads or waits for
    # the role, the step waits without joining, so the leader sees no join/leave churn. The
    # group stays busy for the step's first three looks, then empties.
    looks: list[int] = []

    def membership(group: str) -> int:
        looks.append(len(WORLD.members))  # members this process created so far
        return 1 if len(looks) <= 3 else 0

    WORLD.membership = membership  # type: ignore[method-assign]
    ran: list[int] = []

    @singleton_asset(partitions_def=DAYS)
    def daily(context: dg.AssetExecutionContext, run: NeliRun) -> int:
        ran.append(int(run.token))
        return 1

    result = _materialize(daily, neli(wait_timeout=30.0, wait_retries=0))
    assert result.success and len(ran) == 1
    assert looks[:4] == [0, 0, 0, 0], "the step joined the group while it was busy"
    waits = [m for m in _log_messages(result, logging.INFO) if "neli: waiting for" in m]
    assert len(waits) == 3 and all("busy" in m for m in waits), waits


def test_fence_while_claiming_logs_it_and_fails_the_try_before_any_work() -> None:
    # The member loses the role right after its RUNNING record is written, before the work.
    ledger_begin = WORLD.ledger.begin

    def begin(role: str) -> Any:
        writer = ledger_begin(role)
        write = writer.write

        def write_then_lose_the_role(record: Any) -> None:
            write(record)
            if record.state is RunState.RUNNING:
                member = WORLD.members[-1]
                member.fence()
                deadline = time.monotonic() + 10
                while member.is_leader and time.monotonic() < deadline:
                    time.sleep(0.01)

        writer.write = write_then_lose_the_role
        return writer

    WORLD.ledger.begin = begin  # type: ignore[method-assign]
    ran: list[int] = []

    @singleton_asset(partitions_def=DAYS)
    def daily(context: dg.AssetExecutionContext, run: NeliRun) -> int:
        ran.append(1)
        return 1

    result = _materialize(daily, neli())
    [failure] = _events(result, "STEP_FAILURE")
    data = failure.step_failure_data
    assert data.error.cls_name == "Failure"
    assert "before any work ran" in data.user_failure_data.description
    assert data.user_failure_data.metadata["role"].value == "daily"
    assert ran == []
    assert [m for m in _log_messages(result, logging.ERROR) if "while claiming" in m]
    assert WORLD.ledger.history("daily", DAY) == [RunState.RUNNING]
