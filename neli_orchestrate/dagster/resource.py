"""``NeliResource``: exactly-once singleton ops and assets across Dagster deployments.

Usage::

    @asset(partitions_def=daily, output_required=False)
    def daily_flights(context: AssetExecutionContext, neli: NeliResource):
        with neli.singleton(context) as run:          # role = asset key, run key = partition
            if not run.should_run:                    # done in another deployment:
                yield run.materialize_by_proxy()      # materialized by proxy, downstream runs
                return
            value = compute(run.token)
            run.check()                               # fenced meanwhile: no output
            yield Output(value, metadata=run.metadata)

Dagster sets a resource up once per run in every process that executes steps (every step with
the multiprocess executor), so the resource holds only configuration and a cheap
:class:`~neli_orchestrate.Singleton`; the NELI member joins the role's group when a
``singleton`` block starts and leaves when it ends, so the next deployment is not held up.
"""

from __future__ import annotations

import logging
import os
import shlex
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import Field, PrivateAttr, model_validator

from neli_orchestrate import Outcome, settings
from neli_orchestrate.dagster.run import NeliRun, default_role, default_run_key
from neli_orchestrate.errors import FencedError, StaleTokenError
from neli_orchestrate.metrics import MetricEvent
from neli_orchestrate.observe import Overview, collect_overview
from neli_orchestrate.singleton.config import SingletonConfig
from neli_orchestrate.singleton.run import Reservation
from neli_orchestrate.singleton.singleton import Singleton

if TYPE_CHECKING:
    from neli_orchestrate.observe import LedgerRecord

logger = logging.getLogger(__name__)


def to_dagster_log(event: MetricEvent) -> None:
    """Singleton metrics inside Dagster: one line each in the step's event log.

    Dagster has no metrics API of its own; its event log is where a Dagster operator looks
    (and what log shippers collect). The step's outcome and ``time_to_lead`` are also output
    metadata (:attr:`NeliRun.metadata`), so the asset catalog can plot them.
    """
    value = f" {event.value:.3f}s" if event.is_timing else ""
    tags = " ".join(f"{key}={value}" for key, value in event.tags.items())
    where = "" if event.run_key is None else f" run_key={event.run_key}"
    dg.get_dagster_logger("neli").info(f"neli metric {event.name.value}{value} {tags}{where}")


def _describe(record: LedgerRecord | None) -> str:
    """One log line about a ledger record (or its absence): :meth:`LedgerRecord.describe`."""
    return "no ledger record" if record is None else record.describe()


def _where(record: LedgerRecord | None) -> str:
    """``"skipped by the task in us-east-1"``, ``"completed in ..."``: how the run key stands."""
    from neli_orchestrate.observe import outcome_phrase

    return "no ledger record" if record is None else outcome_phrase(record)


class NeliResource(dg.ConfigurableResource):
    """Run an op or asset in exactly one of several Dagster deployments, led through Kafka.

    Every deployment configures the resource with the same Kafka cluster, ``namespace`` and
    ``ledger_topic`` and its own ``deployment`` id. Secrets belong in ``kafka_config`` through
    ``EnvVar``, e.g. ``kafka_config={"sasl.password": EnvVar("KAFKA_PASSWORD")}``.

    .. note:: The resource guarantees one *execution* per run key across deployments; the
       output itself is exactly-once only if its sink is idempotent or token-checked (see
       ``neli_orchestrate.spark.write_parquet_fenced``).
    """

    # The settings every front door shares: declared once in neli_orchestrate.settings (default,
    # bounds, description); Dagster needs the fields on the class, so each is a copy of that
    # declaration (tests/test_settings.py fails if one drifts).
    bootstrap_servers: str = settings.field("bootstrap_servers")
    deployment: str = settings.field("deployment")
    namespace: str = settings.field("namespace")
    ledger_topic: str | None = settings.field("ledger_topic")
    kafka_config: dict[str, str] = settings.field("kafka_config")
    group_protocol: str | None = settings.field("group_protocol")
    handoff_timeout: float = settings.field("handoff_timeout")
    acquire_timeout: float = settings.field("acquire_timeout")
    profile: str = settings.field("profile")
    session_timeout: float | None = settings.field("session_timeout")
    heartbeat_timeout: float | None = settings.field("heartbeat_timeout")
    max_attempts: int | None = settings.field("max_attempts")
    liveness_timeout: float = settings.field("liveness_timeout")
    region_urls: dict[str, str] = settings.field("region_urls")
    # Dagster's own: how a step waits while another deployment holds the run.
    wait_timeout: float = Field(
        default=300.0,
        ge=0,
        description="Seconds one step attempt keeps asking, with a log line per attempt, while "
        "another deployment holds a live claim or runs the same run key; then the step asks "
        "Dagster for a retry (RetryRequested).",
    )
    wait_interval: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between attempts while another deployment holds the run; also "
        "the pause before a requested step retry.",
    )
    wait_retries: int = Field(
        default=11,
        ge=0,
        description="Step retries requested while the run stays held elsewhere; past them the "
        "step fails (about (wait_retries + 1) * wait_timeout in all). A run nobody has "
        "completed is never skipped.",
    )

    _singleton: Singleton | None = PrivateAttr(default=None)
    _owner_pid: int | None = PrivateAttr(default=None)
    _clock: Callable[[], float] = PrivateAttr(default=time.monotonic)
    _sleep: Callable[[float], None] = PrivateAttr(default=time.sleep)

    # -- configuration ---------------------------------------------------------------------

    @model_validator(mode="after")
    def _consistent(self) -> NeliResource:
        # Each setting's own checks (profile, group protocol, protected Kafka settings) and the
        # core's cross-field guard rails (heartbeat vs session timeout, ...), at definition.
        # EnvVar fields hold the variable's name until run time, which these checks never read.
        self.neli_settings().check()
        return self

    def neli_settings(self) -> settings.NeliSettings:
        """The resource's shared settings (:class:`neli_orchestrate.settings.NeliSettings`)."""
        shared = {name: getattr(self, name) for name in settings.NeliSettings.model_fields
                  if name in type(self).model_fields}
        return settings.NeliSettings(**shared)

    def singleton_config(self) -> SingletonConfig:
        """Return the singleton configuration; ConfigError names any invalid field."""
        config: SingletonConfig = self.neli_settings().singleton_config()
        return config

    def get_singleton(self) -> Singleton:
        """Return this process's :class:`Singleton` (created on first use; no Kafka yet)."""
        # Kafka clients do not survive fork(); a forked copy of the resource starts afresh.
        if self._singleton is None or self._owner_pid != os.getpid():
            # Claims, skips, takeovers, fences and time-to-lead go to the run's event log.
            self._singleton = Singleton(self.singleton_config(), metrics=to_dagster_log)
            self._owner_pid = os.getpid()
        return self._singleton

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        singleton, self._singleton = self._singleton, None
        if singleton is not None and self._owner_pid == os.getpid():
            singleton.close()

    # -- read-only helpers ----------------------------------------------------------------

    def status(self, role: str, run_key: str) -> LedgerRecord | None:
        """Return the latest ledger record of ``role``/``run_key`` (None if never claimed)."""
        return self.get_singleton().status(role, run_key)

    def overview(self, roles: Sequence[str] = (), run_key: str | None = None) -> Overview:
        """Who leads each role (every role of the namespace if empty), its members and the
        latest ledger entries: the read model the CLI and the Airflow page show."""
        return collect_overview(self.neli_settings(), self.deployment, roles, run_key)

    def reset(self, role: str, run_key: str, reason: str) -> LedgerRecord:
        """Reset a finished run key so that its next run computes it again (audited).

        The same as ``neli-orchestrate ledger reset ROLE RUN_KEY --reason ...``: leads the role,
        writes a ``RESET`` record with ``reason`` and a larger token, and returns it. Then
        re-materialize the partition in the one deployment that should run it; deployments
        that launch it later skip it once it is ``COMPLETED`` again. ``ConfigError`` if the run
        key is in progress or has nothing to reset, or ``reason`` is empty.
        """
        return self.get_singleton().reset(role, run_key, reason)

    def reserve(self, context: Any, role: str, run_key: str) -> Reservation:
        """Claim ``role``/``run_key`` for this deployment (split form, used by the gate op).

        Waits while another deployment holds a live claim or runs the run key (up to
        ``wait_timeout``); returns a reservation whose outcome is RUN (token set) or a skip.
        """
        singleton = self.get_singleton()
        deadline = self._clock() + self.wait_timeout
        while True:
            reservation = singleton.reserve(role, run_key)
            if reservation.outcome is Outcome.GIVE_UP:
                raise _give_up_failure(self.deployment, role, run_key, reservation.record)
            if reservation.outcome is not Outcome.WAIT:
                return reservation
            self._wait_or_give_up(deadline, role, run_key, reservation.reason, context)

    # -- the singleton block --------------------------------------------------------------

    @contextmanager
    def singleton(
        self, context: Any, role: str | None = None, run_key: str | None = None
    ) -> Iterator[NeliRun]:
        """Run the block's work in exactly one deployment for this role and run key.

        ``role`` defaults to the asset key (``a/b``) or the op's name, ``run_key`` to the
        partition key (required explicitly for unpartitioned steps). Inside the block check
        ``run.should_run``: False means the run was completed elsewhere (logged with where and
        when); yield or return ``run.materialize_by_proxy()`` then, or the block records the
        materialization by proxy itself as it ends (downstream steps are then skipped). Leaving
        the block records COMPLETED, an exception records FAILED. If this
        deployment is fenced meanwhile, the registered Spark jobs are cancelled and the step
        fails with ``dagster.Failure(allow_retries=False)`` carrying token, deployment, role
        and run key as metadata.
        """
        role = role or default_role(context)
        run_key = run_key or default_run_key(context)
        log = context.log
        singleton = self.get_singleton()
        run: NeliRun | None = None
        try:
            with ExitStack() as stack:
                run = self._open(stack, singleton, role, run_key, context)
                if run.should_run:
                    run.check()  # fenced between the claim and here: start no work
                    log.info(
                        f"neli: deployment {self.deployment!r} runs {role!r} / {run_key!r} "
                        f"with token {run.token} ({run.outcome}: {run.reason})"
                    )
                else:
                    log.info(
                        f"neli: skipping {role!r} / {run_key!r} in deployment "
                        f"{self.deployment!r}: {run.outcome}, {_describe(run.record)}"
                        + (f" ({_where(run.record)}: nothing is materialized by proxy)"
                           if run.skipped_by_task else "")
                    )
                yield run
                if not run.should_run and not run.skip_recorded:
                    # The block returned without run.materialize_by_proxy(): record it anyway
                    # (an observation where the work skipped itself: it produced nothing).
                    _record_skip(context, run, materialize=not run.skipped_by_task)
        except (FencedError, StaleTokenError) as exc:
            # Superseded: a newer token owns the run (the ledger or a token-checked sink said
            # so). Retrying here could only fail again, so the step fails for good.
            if run is None:
                # Fenced while claiming, before any work: nothing ran here, so a retry (if the
                # step has a retry policy) may decide again: skip, wait, or take over.
                raise _fenced_before_work(context, self.deployment, role, run_key, exc) from exc
            raise run.fence_failure(exc) from exc
        except Exception as exc:
            # The cancelled Spark job (or anything the fence broke) surfaces as its own error;
            # what the step must report is the fence behind it.
            if run is not None and run.fenced:
                raise run.fence_failure(exc) from exc
            raise

    def _open(
        self, stack: ExitStack, singleton: Singleton, role: str, run_key: str, context: Any
    ) -> NeliRun:
        """Claim the run (waiting while another deployment holds it) and return its handle."""
        began = self._clock()
        deadline = began + self.wait_timeout
        while True:
            attempt = ExitStack()
            claim = attempt.enter_context(singleton.claim(role=role, run_key=run_key))
            if claim.outcome is Outcome.GIVE_UP:
                attempt.close()
                raise _give_up_failure(self.deployment, role, run_key, claim.record)
            if claim.outcome is not Outcome.WAIT:
                stack.push(attempt.pop_all())
                return NeliRun(claim, log=context.log, time_to_lead=self._clock() - began,
                               run_url=self._ran_url(context, claim))
            attempt.close()  # leave the group at once: the holder may need it to finish
            self._wait_or_give_up(deadline, role, run_key, claim.reason, context)

    def _ran_url(self, context: Any, claim: Any) -> str | None:
        """Where the deployment that completed the run shows it: its asset catalog's events of
        this asset partition (which link to its run), when ``region_urls`` knows its UI."""
        from urllib.parse import quote, urlencode

        record = claim.record
        if claim.should_run or record is None:
            return None
        base = self.neli_settings().region_urls.get(record.deployment)
        op_context = getattr(context, "op_execution_context", context)
        if not base or not getattr(op_context, "has_assets_def", False):
            return None
        keys = list(op_context.assets_def.keys_by_output_name.values())
        if len(keys) != 1:
            return None
        query = {"view": "events"}
        if op_context.has_partition_key:
            query["partition"] = op_context.partition_key
        path = "/".join(quote(part, safe="") for part in keys[0].path)
        return f"{base}/assets/{path}?{urlencode(query)}"

    def _wait_or_give_up(
        self,
        deadline: float,
        role: str,
        run_key: str,
        why: str,
        context: Any,
    ) -> None:
        """Pause before asking again, logged in the run; past ``deadline`` request a step retry.

        The wait is visible where the user looks: a log line per attempt while the step waits,
        then the step goes UP_FOR_RETRY in the UI (``RetryRequested``) instead of holding a
        worker for an hour; after ``wait_retries`` retries the step fails, naming the holder.
        """
        remaining = deadline - self._clock()
        if remaining <= 0:
            held = dg.Failure(
                description=(
                    f"neli: {role!r} / {run_key!r} is still held by another deployment after "
                    f"{self.wait_retries + 1} step attempts of wait_timeout={self.wait_timeout}s "
                    f"({why}); a run nobody has completed is never skipped: re-execute the step "
                    "later"
                ),
                metadata={"deployment": self.deployment, "role": role, "run_key": run_key},
                allow_retries=True,
            )
            attempt = _retry_number(context)
            if attempt < self.wait_retries:
                context.log.warning(
                    f"neli: {role!r} / {run_key!r} still held by another deployment after "
                    f"{self.wait_timeout:g}s ({why}); requesting step retry "
                    f"{attempt + 1}/{self.wait_retries} in {self.wait_interval:g}s"
                )
            raise dg.RetryRequested(
                max_retries=self.wait_retries, seconds_to_wait=self.wait_interval
            ) from held
        pause = min(self.wait_interval, remaining)
        context.log.info(
            f"neli: waiting for {role!r} / {run_key!r}: {why}; asking again in {pause:.1f}s "
            f"({remaining:.0f}s left in this attempt)"
        )
        self._sleep(pause)


def _fenced_before_work(
    context: Any, deployment: str, role: str, run_key: str, exc: Exception
) -> dg.Failure:
    message = (
        f"neli: fenced: deployment {deployment!r} lost role {role!r} while claiming run key "
        f"{run_key!r}, before any work ran: {exc}"
    )
    context.log.error(message)
    metadata: dict[str, Any] = {"deployment": deployment, "role": role, "run_key": run_key}
    if getattr(exc, "token", None) is not None:
        metadata["token"] = exc.token  # type: ignore[attr-defined]
    return dg.Failure(
        description=f"{message}. Nothing ran here; a retry decides again from the ledger.",
        metadata=metadata,
        allow_retries=True,
    )


def _retry_number(context: Any) -> int:
    op_context = getattr(context, "op_execution_context", context)
    return int(getattr(op_context, "retry_number", 0) or 0)


def _give_up_failure(
    deployment: str, role: str, run_key: str, record: LedgerRecord | None
) -> dg.Failure:
    return dg.Failure(
        description=(
            f"neli: {role!r} / {run_key!r} has terminally failed ({_describe(record)}): the "
            "attempt limit is reached, so no deployment runs it again. Fix the cause, then "
            f"reset the run key (neli-orchestrate ledger reset {shlex.quote(role)} "
            f"{shlex.quote(run_key)} --reason '...') "
            "or raise max_attempts."
        ),
        metadata={"deployment": deployment, "role": role, "run_key": run_key},
        allow_retries=False,
    )


def _record_skip(context: Any, run: NeliRun, *, materialize: bool = True) -> None:
    """Record in this deployment's catalog that the asset partition was computed elsewhere.

    ``materialize``: an ``AssetMaterialization`` by proxy (:attr:`NeliRun.proxy_metadata`), so
    freshness checks and automation conditions here see the data; else an ``AssetObservation``.
    Steps that are not a single asset record nothing.
    """
    run.skip_recorded = True
    op_context = getattr(context, "op_execution_context", context)
    if not op_context.has_assets_def:
        return
    keys = list(op_context.assets_def.keys_by_output_name.values())
    if len(keys) != 1:
        return
    partition = op_context.partition_key if op_context.has_partition_key else None
    event_type = dg.AssetMaterialization if materialize else dg.AssetObservation
    op_context.log_event(
        event_type(asset_key=keys[0], partition=partition, metadata=run.proxy_metadata)
    )
