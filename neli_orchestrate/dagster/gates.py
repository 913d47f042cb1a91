"""Gates: skip downstream steps in the deployments that do not run a singleton run.

- :func:`leader_gate_op` builds an op with an optional ``Nothing`` output. It claims the run
  for this deployment (``CLAIMED``, with a handoff deadline) and emits the output, or emits
  nothing when the run was completed elsewhere, so Dagster skips everything downstream and the
  run still succeeds. The singleton op downstream enters ``neli.singleton(...)`` with the same
  role and runs under the gate's claim.
- :func:`singleton_asset` is the asset form: an asset with ``output_required=False`` whose body
  runs inside ``neli.singleton(...)``; downstream assets are skipped where it did not run.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from typing import Any

import dagster as dg

from neli_orchestrate.dagster.resource import NeliResource, _describe, _record_skip, _where
from neli_orchestrate.dagster.run import NeliRun, default_run_key
from neli_orchestrate.errors import ConfigError
from neli_orchestrate.observe import skipped_by_task
from neli_orchestrate.sinks.io_managers import OutputRefused, claim_for_outputs

GATE_OUTPUT = "claimed"

_COPIED_ATTRIBUTES = ("__module__", "__name__", "__qualname__", "__doc__")


def leader_gate_op(
    role: str,
    *,
    name: str | None = None,
    run_key: str | Callable[[Any], str] | None = None,
    resource_key: str = "neli",
    out_name: str = GATE_OUTPUT,
    description: str | None = None,
    tags: dict[str, str] | None = None,
) -> dg.OpDefinition:
    """Build an op that lets the steps downstream of it run only where ``role`` is claimed.

    Wire it to the singleton op through a ``Nothing`` input::

        gate = leader_gate_op("daily_flights")

        @op(ins={"claimed": In(Nothing)})
        def daily_flights(context, neli: NeliResource):
            with neli.singleton(context, role="daily_flights") as run: ...

        @job(partitions_def=daily)
        def flights():
            daily_flights(claimed=gate())

    ``run_key`` is a string, a callable ``run_key(context) -> str``, or None for the
    partition key. While another deployment holds a live claim or is running the run key, the
    gate waits (``NeliResource.wait_timeout``); it never skips a run nobody has completed.

    .. note:: The gate alone records nothing as done: the op downstream must enter
       ``neli.singleton(...)`` with the same role, or the claim expires after the handoff
       timeout and another deployment runs it again.
    """
    if not role:
        raise ConfigError("leader_gate_op() needs the role it gates, e.g. 'daily_flights'")
    op_name = name or f"{_safe_name(role)}_gate"

    @dg.op(
        name=op_name,
        description=description
        or f"NELI gate of role {role!r}: continues only in the deployment that claims the run.",
        out={out_name: dg.Out(dg.Nothing, is_required=False)},
        required_resource_keys={resource_key},
        tags=tags,
    )
    # No annotations: this module's postponed (string) annotations would not satisfy Dagster's
    # check of the context parameter.
    def _gate(context):  # type: ignore[no-untyped-def]
        neli: NeliResource = getattr(context.resources, resource_key)
        key = run_key(context) if callable(run_key) else (run_key or default_run_key(context))
        began = time.monotonic()
        reservation = neli.reserve(context, role, key)
        if reservation.should_run:
            context.log.info(
                f"neli gate: deployment {neli.deployment!r} claimed {role!r} / {key!r} with "
                f"token {reservation.token}; downstream runs here"
            )
            yield dg.Output(
                None,
                output_name=out_name,
                metadata={
                    "token": reservation.token,
                    "deployment": neli.deployment,
                    "role": role,
                    "run_key": key,
                    "neli_outcome": str(reservation.outcome),
                    "claimed_at": dg.MetadataValue.timestamp(time.time()),
                    "time_to_lead": dg.MetadataValue.float(round(time.monotonic() - began, 3)),
                },
            )
            return
        context.log.info(
            f"neli gate: skipping downstream of {role!r} / {key!r} in deployment "
            f"{neli.deployment!r}: {reservation.outcome} — {_describe(reservation.record)}"
            + (f" ({_where(reservation.record)})" if skipped_by_task(reservation.record) else "")
        )

    return _gate


def singleton_asset(
    fn: Callable[..., Any] | None = None,
    *,
    role: str | Callable[[Any], str] | None = None,
    run_key: str | Callable[[Any], str] | None = None,
    resource_key: str = "neli",
    materialize_by_proxy: bool = True,
    **asset_kwargs: Any,
) -> Any:
    """Decorate ``fn(context, run, ...)`` into an asset materialized in one deployment only.

    Where the run key was already done (here or in another deployment) the function does not
    run: the asset partition is *materialized by proxy* (an ``AssetMaterialization`` whose
    metadata names the deployment that computed it, its token and when, with
    ``neli_by_proxy=True``; no IO manager call), so this deployment's catalog, freshness checks
    and automation conditions see the data, and the downstream assets of the run execute here
    too. Downstream assets that *load* the value through an IO manager need one whose storage
    every deployment reads (the value is where the runner wrote it); ``deps=`` plus reading
    the published data needs nothing. ``materialize_by_proxy=False`` restores the other
    behaviour: an ``AssetObservation`` of where it ran, nothing materialized, downstream
    assets skipped (``output_required=False``)::

        @singleton_asset(partitions_def=daily)
        def daily_flights(context: AssetExecutionContext, run: NeliRun, spark: SparkResource):
            with run.cancel_spark_on_fence(spark.session):
                return compute(spark.session, context.partition_key, run.token)

    ``run`` is the :class:`NeliRun` (token, Spark conf, checks). The return value becomes the
    asset's output with ``run.metadata`` merged into its metadata; return an ``Output`` or
    ``MaterializeResult`` for full control. The other parameters (upstream assets, resources)
    work as in ``@asset``; ``asset_kwargs`` go to ``@asset``. ``role`` defaults to the asset
    key, ``run_key`` to the partition key; each may be a string or a callable of the context,
    e.g. ``role=lambda context: f"daily_flights/{context.partition_key}"`` so that dates run
    in parallel (one role, hence one consumer group, per date).
    """
    if "output_required" in asset_kwargs:
        raise ConfigError("singleton_asset() sets output_required=False itself; drop the argument")

    def decorate(func: Callable[..., Any]) -> dg.AssetsDefinition:
        signature = inspect.signature(func)
        params = list(signature.parameters.values())
        if len(params) < 2 or params[0].name != "context" or params[1].name != "run":
            raise ConfigError(
                f"@singleton_asset function {func.__name__!r} must start with the parameters "
                "(context, run, ...)"
            )
        rest = params[2:]
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in rest):
            raise ConfigError(
                f"@singleton_asset function {func.__name__!r} cannot take *args or **kwargs: "
                "name its upstream assets and resources"
            )
        user_takes_resource = any(p.name == resource_key for p in rest)
        # Dagster compares the context annotation itself, so a string annotation (from
        # `from __future__ import annotations`) would be refused; unannotated means the asset
        # context anyway.
        wrapper_params = [params[0].replace(annotation=inspect.Parameter.empty), *rest]
        if not user_takes_resource:
            wrapper_params.append(
                inspect.Parameter(
                    resource_key, inspect.Parameter.KEYWORD_ONLY, annotation=NeliResource
                )
            )

        def compute(context, **kwargs):  # type: ignore[no-untyped-def]
            # The block runs in its own generator so that an IO manager that refuses the
            # output can end it at once (claim_for_outputs' ``end``), before the step fails:
            # the ledger then records FAILED (or nothing, when fenced) and leadership is
            # released now, not whenever Dagster's abandoned generator is collected.
            itself: list[Any] = []
            body = _body(context, kwargs, itself)
            itself.append(body)
            yield from body

        def _body(context, kwargs, itself):  # type: ignore[no-untyped-def]
            neli: NeliResource = (
                kwargs[resource_key] if user_takes_resource else kwargs.pop(resource_key)
            )
            name = role(context) if callable(role) else role
            key = run_key(context) if callable(run_key) else run_key
            refused: list[OutputRefused] = []
            try:
                with neli.singleton(context, role=name, run_key=key) as run:
                    if not run.should_run:
                        if run.skipped_by_task:
                            # The work skipped itself where it ran: nothing to materialize; an
                            # observation says so and the downstream assets are skipped, as
                            # there.
                            _record_skip(context, run, materialize=False)
                        elif materialize_by_proxy:
                            # Catalog sees the data here too; downstream steps of this run
                            # execute.
                            yield run.materialize_by_proxy()
                        else:
                            _record_skip(context, run, materialize=False)
                        return
                    result = func(context, run, **kwargs)
                    # Work that ignored a fence must not reach the IO manager; and the output
                    # is emitted inside the block, so the IO manager stores it while this
                    # deployment still holds the role, before COMPLETED is recorded.
                    run.check()
                    # The token-checked IO managers (NeliDeltaIOManager, NeliIcebergIOManager)
                    # find the claim here.
                    with claim_for_outputs(context, run, end=lambda: itself[0].close()) as claim:
                        try:
                            yield _with_run_metadata(result, run)
                        except GeneratorExit:
                            if claim.refused is None:
                                raise
                            # The IO manager refused the output and fails the step. End the
                            # block with its reason: FAILED (or nothing, when fenced), never
                            # COMPLETED.
                            refused.append(OutputRefused(claim.refused))
                            raise refused[-1] from None
            except BaseException:
                if refused:
                    return  # the step fails with the IO manager's message
                raise

        # Name, module and docs from the user's function (Dagster resolves string annotations
        # against __module__); the signature minus ``run``, plus the resource if needed.
        functools.update_wrapper(compute, func, assigned=_COPIED_ATTRIBUTES, updated=())
        del compute.__wrapped__  # type: ignore[attr-defined]
        compute.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=wrapper_params, return_annotation=inspect.Signature.empty
        )
        asset_kwargs.setdefault("name", func.__name__)
        return dg.asset(output_required=False, **asset_kwargs)(compute)

    if fn is not None:
        return decorate(fn)
    return decorate


def _with_run_metadata(result: Any, run: NeliRun) -> Any:
    if isinstance(result, dg.Output):
        return result.with_metadata({**run.metadata, **(result.metadata or {})})
    if isinstance(result, dg.MaterializeResult):
        return dg.MaterializeResult(
            asset_key=result.asset_key,
            metadata={**run.metadata, **(result.metadata or {})},
            check_results=result.check_results,
            data_version=result.data_version,
            tags=result.tags,
            value=result.value,
        )
    return dg.Output(result, metadata=run.metadata)


def _safe_name(role: str) -> str:
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in role)
