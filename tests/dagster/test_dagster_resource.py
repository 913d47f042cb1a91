"""NeliResource, the gate op and singleton_asset without a broker: defaults, errors, wiring.

What a step does before it talks to Kafka — deriving the role and run key, refusing what it
cannot derive, validating configuration — and the shape of the generated definitions.
"""

from typing import Any

import dagster as dg
import pydantic
import pytest

from neli_orchestrate.core.config import NeliConfig
from neli_orchestrate.dagster import NeliResource, NeliRun, leader_gate_op, singleton_asset
from neli_orchestrate.dagster.gates import GATE_OUTPUT
from neli_orchestrate.dagster.run import default_role, default_run_key
from neli_orchestrate.errors import ConfigError

pytestmark = [pytest.mark.dagster]

DAYS = dg.DailyPartitionsDefinition(start_date="2013-01-01", end_date="2014-01-01")


def _resource(**overrides: Any) -> NeliResource:
    fields: dict[str, Any] = {"bootstrap_servers": "127.0.0.1:1", "deployment": "east",
                              "namespace": "acme"}
    fields.update(overrides)
    return NeliResource(**fields)


def _step_error(result: dg.ExecuteInProcessResult) -> str:
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    error = failure.step_failure_data.error
    messages = []
    while error is not None:
        messages.append(f"{error.cls_name}: {error.message}")
        error = error.cause
    return "\n".join(messages)


def test_role_is_the_asset_key_and_run_key_the_partition_key() -> None:
    seen: dict[str, str] = {}

    @dg.asset(key_prefix=["flights"], partitions_def=DAYS)
    def daily(context: dg.AssetExecutionContext) -> None:
        seen["role"] = default_role(context)
        seen["run_key"] = default_run_key(context)

    dg.materialize([daily], partition_key="2013-02-03")
    assert seen == {"role": "flights/daily", "run_key": "2013-02-03"}


def test_role_of_an_op_is_its_node_path_so_aliases_stay_apart() -> None:
    roles: list[str] = []

    @dg.op
    def export(context: dg.OpExecutionContext) -> None:
        roles.append(default_role(context))

    @dg.graph
    def billing() -> None:
        export()

    @dg.job
    def nightly() -> None:
        billing()
        export.alias("export_eu")()

    assert nightly.execute_in_process().success
    assert sorted(roles) == ["billing.export", "export_eu"]


def test_unpartitioned_step_without_run_key_fails_with_what_to_pass() -> None:
    @dg.op
    def export(context: dg.OpExecutionContext, neli: NeliResource) -> None:
        with neli.singleton(context):
            pass

    @dg.job
    def nightly() -> None:
        export()

    result = nightly.execute_in_process(
        resources={"neli": _resource()}, raise_on_error=False
    )
    assert not result.success
    error = _step_error(result)
    assert "ConfigError" in error
    assert "run_key=" in error and "run ids differ between deployments" in error


def test_scheduled_run_without_run_key_is_pointed_at_the_schedule_tick() -> None:
    @dg.op
    def export(context: dg.OpExecutionContext, neli: NeliResource) -> None:
        with neli.singleton(context):
            pass

    @dg.job
    def nightly() -> None:
        export()

    result = nightly.execute_in_process(
        resources={"neli": _resource()},
        tags={"dagster/scheduled_execution_time": "2026-01-01T00:00:00+00:00"},
        raise_on_error=False,
    )
    assert "dagster/scheduled_execution_time" in _step_error(result)


def test_run_over_a_partition_range_needs_one_run_key_per_run() -> None:
    @dg.asset(partitions_def=DAYS, backfill_policy=dg.BackfillPolicy.single_run())
    def daily(context: dg.AssetExecutionContext, neli: NeliResource) -> None:
        with neli.singleton(context):
            pass

    result = dg.materialize(
        [daily],
        resources={"neli": _resource()},
        tags={
            "dagster/asset_partition_range_start": "2013-01-01",
            "dagster/asset_partition_range_end": "2013-01-03",
        },
        raise_on_error=False,
    )
    error = _step_error(result)
    assert "2013-01-01..2013-01-03" in error and "run_key=" in error


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"deployment": ""}, "deployment"),
        ({"deployment": " "}, "deployment"),
        ({"namespace": ""}, "namespace"),
        ({"namespace": "has space"}, "namespace"),
        ({"wait_interval": -1.0}, "wait_interval"),
        ({"wait_interval": 0.0}, "wait_interval"),
        ({"wait_timeout": -1.0}, "wait_timeout"),
        ({"wait_retries": -1}, "wait_retries"),
        ({"handoff_timeout": -5.0}, "handoff_timeout"),
        ({"acquire_timeout": 0.0}, "acquire_timeout"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"profile": "turbo"}, "profile"),
        ({"group_protocol": "eager"}, "group_protocol"),
        ({"kafka_config": {"group.id": "mine"}}, "group.id"),
        # Cross-field guard rails of the core: the heartbeat must fit in the session.
        ({"session_timeout": 3.0, "heartbeat_timeout": 3.0}, "heartbeat_timeout"),
    ],
)
def test_invalid_configuration_is_refused_when_the_resource_is_defined(
    overrides: dict[str, Any], field: str
) -> None:
    # Constructing the resource (in Definitions, at import) is the error, as for other
    # Dagster resources; no step has to run first.
    with pytest.raises(pydantic.ValidationError, match=field.replace(".", r"\.")):
        _resource(**overrides)


def test_unknown_profile_error_lists_the_profiles() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"'default', 'fast'"):
        _resource(profile="turbo")


def test_empty_deployment_from_the_environment_fails_resource_setup_before_any_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An EnvVar is resolved at run time: its value is validated then, before any step runs.
    monkeypatch.setenv("TEST_NELI_DEPLOYMENT", " ")
    ran: list[str] = []

    @dg.op
    def export(context: dg.OpExecutionContext, neli: NeliResource) -> None:
        ran.append("export")

    @dg.job
    def nightly() -> None:
        export()

    resource = _resource(deployment=dg.EnvVar("TEST_NELI_DEPLOYMENT"))
    result = nightly.execute_in_process(resources={"neli": resource}, raise_on_error=False)
    assert not result.success and ran == []


def test_group_protocol_reaches_the_roles_consumer_groups() -> None:
    assert _resource(group_protocol="classic").singleton_config().neli.group_protocol == "classic"
    consumer = _resource(group_protocol="consumer").singleton_config()
    assert consumer.role_neli("daily").resolved.group_protocol == "consumer"
    # Unset: the package's default, not a value of the resource's own.
    default = _resource().singleton_config().neli
    assert default.group_protocol == NeliConfig(bootstrap_servers="x:1").group_protocol


def test_configuration_reaches_the_singleton_with_secrets_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TEST_KAFKA_PASSWORD", "s3cret")
    captured: dict[str, Any] = {}

    @dg.op
    def export(context: dg.OpExecutionContext, neli: NeliResource) -> None:
        captured["config"] = neli.singleton_config()

    @dg.job
    def nightly() -> None:
        export()

    resource = NeliResource(
        bootstrap_servers="kafka:9092",
        deployment="eu-1",
        namespace="acme-analytics",
        kafka_config={
            "security.protocol": "SASL_SSL",
            "sasl.password": dg.EnvVar("TEST_KAFKA_PASSWORD"),
        },
        handoff_timeout=120.0,
        acquire_timeout=20.0,
        session_timeout=6.0,
        max_attempts=3,
    )
    assert nightly.execute_in_process(resources={"neli": resource}).success
    config = captured["config"]
    assert config.deployment == "eu-1"
    assert config.ledger_config().topic == "acme-analytics.ledger"
    assert (config.handoff_timeout, config.acquire_timeout, config.max_attempts) == (120.0, 20.0, 3)
    assert config.role_neli("export").resolved.group_id == "acme-analytics.export"
    assert config.neli.resolved.session_timeout == 6.0
    assert config.neli.kafka_config["sasl.password"] == "s3cret"
    assert "s3cret" not in repr(config.neli)


def test_gate_op_has_one_optional_nothing_output_and_needs_the_resource() -> None:
    gate = leader_gate_op("daily_flights")
    assert gate.name == "daily_flights_gate"
    out = gate.outs[GATE_OUTPUT]
    assert out.dagster_type.is_nothing and not out.is_required
    assert gate.required_resource_keys == {"neli"}
    assert leader_gate_op("billing/export", resource_key="neli_eu").name == "billing_export_gate"


def test_singleton_asset_keeps_inputs_and_resources_and_never_requires_its_output() -> None:
    class Storage(dg.ConfigurableResource):
        root: str

    @dg.asset(partitions_def=DAYS)
    def raw() -> int:
        return 1

    @singleton_asset(partitions_def=DAYS, group_name="flights")
    def daily(context: dg.AssetExecutionContext, run: NeliRun, raw: int, storage: Storage) -> int:
        """Daily flights."""
        return raw

    [spec] = list(daily.specs)
    assert spec.key == dg.AssetKey("daily") and spec.group_name == "flights"
    assert spec.description == "Daily flights."
    assert set(daily.keys_by_input_name) == {"raw"}
    assert daily.required_resource_keys >= {"neli", "storage"}
    [output] = daily.op.output_defs
    assert not output.is_required


def test_singleton_asset_refuses_functions_it_cannot_wrap() -> None:
    with pytest.raises(ConfigError, match=r"\(context, run, \.\.\.\)"):

        @singleton_asset
        def missing_run(context: dg.AssetExecutionContext) -> None: ...

    with pytest.raises(ConfigError, match=r"\*args"):

        @singleton_asset
        def variadic(context: dg.AssetExecutionContext, run: NeliRun, **kwargs: Any) -> None: ...

    with pytest.raises(ConfigError, match="output_required"):
        singleton_asset(output_required=True)
