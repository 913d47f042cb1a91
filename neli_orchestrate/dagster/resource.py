"""``NeliResource``: exactly-once singleton ops and assets across Dagster deployments.

Usage::

    @asset(partitions_def=daily, output_required=False)
    def daily_flights(context: AssetExecutionContext, neli: NeliResource):
        with neli.singleton(context) as run:          # role = asset key, run key = partition
            if not run.should_run:
                return                                # done in another deployment: logged
            value = compute(run.token)
            run.check()                               # fenced meanwhile: no output
            yield Output(value, metadata=run.metadata)

Dagster sets a resource up once per run in every process that executes steps (every step with
the multiprocess executor), so the resource holds only configuration and a cheap
:class:`~neli_orchestrate.singleton.Singleton`; the NELI member joins the role's group when a
``singleton`` block starts and leaves when it ends, so the next deployment is not held up.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr

from neli_orchestrate.core import NeliConfig
from neli_orchestrate.dagster.run import NeliRun, default_role, default_run_key
from neli_orchestrate.decision import Outcome
from neli_orchestrate.errors import ConfigError, FencedError, StaleTokenError
from neli_orchestrate.ledger import LedgerRecord
from neli_orchestrate.singleton import Reservation, Singleton, SingletonConfig

logger = logging.getLogger(__name__)


def _describe(record: LedgerRecord | None) -> str:
    if record is None:
        return "no ledger record"
    at = datetime.fromtimestamp(record.at, UTC).isoformat(timespec="seconds")
    text = f"{record.state} by deployment {record.deployment!r} with token {record.token} at {at}"
    if record.reason:
        text += f" ({record.reason})"
    return text


class NeliResource(dg.ConfigurableResource):
    """Run an op or asset in exactly one of several Dagster deployments, led through Kafka.

    Every deployment configures the resource with the same Kafka cluster, ``namespace`` and
    ``ledger_topic`` and its own ``deployment`` id. Secrets belong in ``kafka_config`` through
    ``EnvVar``, e.g. ``kafka_config={"sasl.password": EnvVar("KAFKA_PASSWORD")}``.

    .. note:: The resource guarantees one *execution* per run key across deployments; the
       output itself is exactly-once only if its sink is idempotent or token-checked (see
       ``neli_orchestrate.spark.write_parquet_fenced``).
    """

    bootstrap_servers: str = Field(
        description="Kafka bootstrap servers shared by every deployment, e.g. 'kafka:9092'."
    )
    deployment: str = Field(
        description="Id of this Dagster deployment (region), e.g. 'us-east-1'; unique per "
        "deployment, recorded in the run ledger."
    )
    namespace: str = Field(
        description="Namespace every Kafka name derives from (role groups '<namespace>.<role>', "
        "leader topic '<namespace>.neli', ledger '<namespace>.ledger'). Required; the same in "
        "every deployment that shares runs, whatever front door it uses.",
    )
    ledger_topic: str | None = Field(
        default=None,
        description="Compacted run-ledger topic (None: '<namespace>.ledger'); the same in "
        "every deployment.",
    )
    kafka_config: dict[str, str] = Field(
        default_factory=dict,
        description="Extra librdkafka settings (security.protocol, sasl.*, ssl.*); pass "
        "secrets as EnvVar. Settings the protocol depends on are refused.",
    )
    handoff_timeout: float = Field(
        default=300.0,
        description="Seconds another deployment's CLAIMED record is respected before this "
        "deployment may take the run over.",
    )
    acquire_timeout: float = Field(
        default=60.0,
        description="Seconds one attempt waits to become leader of the role.",
    )
    profile: str = Field(
        default="default",
        description="NELI timing profile: 'default' (conservative, clusters across regions) or "
        "'fast' (loopback or one data centre; needs a broker allowing short sessions).",
    )
    session_timeout: float | None = Field(
        default=None,
        description="Kafka group session timeout in seconds (None: from the profile); a paused "
        "or cut-off deployment loses the role after about this long.",
    )
    heartbeat_timeout: float | None = Field(
        default=None,
        description="NELI heartbeat timeout in seconds (None: a third of the session timeout).",
    )
    max_attempts: int | None = Field(
        default=None,
        description="Attempts per run key before it is terminally FAILED (None: no limit).",
    )
    wait_timeout: float = Field(
        default=3600.0,
        description="Seconds a step keeps retrying while another deployment holds a live "
        "claim or runs the same run key, before it fails (retriable).",
    )
    wait_interval: float = Field(
        default=5.0,
        description="Seconds between attempts while another deployment holds the run.",
    )

    _singleton: Singleton | None = PrivateAttr(default=None)
    _owner_pid: int | None = PrivateAttr(default=None)
    _clock: Callable[[], float] = PrivateAttr(default=time.monotonic)
    _sleep: Callable[[float], None] = PrivateAttr(default=time.sleep)

    # -- configuration ---------------------------------------------------------------------

    def _check_fields(self) -> None:
        if not self.deployment or not self.deployment.strip():
            raise ConfigError("NeliResource.deployment must name this deployment, e.g. 'eu-1'")
        if self.wait_timeout < 0:
            raise ConfigError(
                f"NeliResource.wait_timeout must be >= 0 seconds, got {self.wait_timeout}"
            )
        if self.wait_interval <= 0:
            raise ConfigError(
                f"NeliResource.wait_interval must be > 0 seconds, got {self.wait_interval}"
            )

    def singleton_config(self) -> SingletonConfig:
        """Return the singleton configuration; ConfigError names any invalid field."""
        self._check_fields()
        neli_kwargs: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "kafka_config": dict(self.kafka_config),
            "profile": self.profile,
        }
        if self.session_timeout is not None:
            neli_kwargs["session_timeout"] = self.session_timeout
        if self.heartbeat_timeout is not None:
            neli_kwargs["heartbeat_timeout"] = self.heartbeat_timeout
        return SingletonConfig(
            neli=NeliConfig(**neli_kwargs),
            deployment=self.deployment,
            namespace=self.namespace,
            ledger_topic=self.ledger_topic,
            handoff_timeout=self.handoff_timeout,
            acquire_timeout=self.acquire_timeout,
            max_attempts=self.max_attempts,
        )

    def get_singleton(self) -> Singleton:
        """Return this process's :class:`Singleton` (created on first use; no Kafka yet)."""
        # Kafka clients do not survive fork(); a forked copy of the resource starts afresh.
        if self._singleton is None or self._owner_pid != os.getpid():
            self._singleton = Singleton(self.singleton_config())
            self._owner_pid = os.getpid()
        return self._singleton

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # Validate the configuration up front (a clear resource-init error); joining a NELI
        # group here would happen once per process per run, so members are per block instead.
        self.get_singleton()

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        singleton, self._singleton = self._singleton, None
        if singleton is not None and self._owner_pid == os.getpid():
            singleton.close()

    # -- read-only helpers ----------------------------------------------------------------

    def status(self, role: str, run_key: str) -> LedgerRecord | None:
        """Return the latest ledger record of ``role``/``run_key`` (None if never claimed)."""
        return self.get_singleton().status(role, run_key)

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
            self._wait_or_give_up(deadline, role, run_key, reservation.reason, context.log)

    # -- the singleton block --------------------------------------------------------------

    @contextmanager
    def singleton(
        self, context: Any, role: str | None = None, run_key: str | None = None
    ) -> Iterator[NeliRun]:
        """Run the block's work in exactly one deployment for this role and run key.

        ``role`` defaults to the asset key (``a/b``) or the op's name, ``run_key`` to the
        partition key (required explicitly for unpartitioned steps). Inside the block check
        ``run.should_run``: False means the run was completed elsewhere (logged with where and
        when). Leaving the block records COMPLETED, an exception records FAILED. If this
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
                run = self._open(stack, singleton, role, run_key, log)
                if run.should_run:
                    log.info(
                        f"neli: deployment {self.deployment!r} runs {role!r} / {run_key!r} "
                        f"with token {run.token} ({run.outcome}: {run.reason})"
                    )
                else:
                    log.info(
                        f"neli: skipping {role!r} / {run_key!r} in deployment "
                        f"{self.deployment!r}: {run.outcome}, {_describe(run.record)}"
                    )
                    _observe_skip(context, run)
                yield run
        except (FencedError, StaleTokenError) as exc:
            # Superseded: a newer token owns the run (the ledger or a token-checked sink said
            # so). Retrying here could only fail again, so the step fails for good.
            if run is None:
                raise
            raise run.fence_failure(exc) from exc
        except Exception as exc:
            # The cancelled Spark job (or anything the fence broke) surfaces as its own error;
            # what the step must report is the fence behind it.
            if run is not None and run.fenced:
                raise run.fence_failure(exc) from exc
            raise

    def _open(
        self, stack: ExitStack, singleton: Singleton, role: str, run_key: str, log: Any
    ) -> NeliRun:
        """Claim the run (waiting while another deployment holds it) and return its handle."""
        deadline = self._clock() + self.wait_timeout
        while True:
            attempt = ExitStack()
            claim = attempt.enter_context(singleton.claim(role=role, run_key=run_key))
            if claim.outcome is Outcome.GIVE_UP:
                attempt.close()
                raise _give_up_failure(self.deployment, role, run_key, claim.record)
            if claim.outcome is not Outcome.WAIT:
                stack.push(attempt.pop_all())
                should_run = claim.should_run
                return NeliRun(
                    role=role,
                    run_key=run_key,
                    deployment=self.deployment,
                    outcome=claim.outcome,
                    should_run=should_run,
                    token=claim.token if should_run else None,
                    record=claim.record,
                    handle=claim,
                )
            attempt.close()  # leave the group at once: the holder may need it to finish
            self._wait_or_give_up(deadline, role, run_key, claim.reason, log)

    def _wait_or_give_up(
        self,
        deadline: float,
        role: str,
        run_key: str,
        why: str,
        log: Any,
    ) -> None:
        remaining = deadline - self._clock()
        if remaining <= 0:
            raise dg.Failure(
                description=(
                    f"neli: {role!r} / {run_key!r} is still held by another deployment after "
                    f"wait_timeout={self.wait_timeout}s ({why}); a run nobody has completed is "
                    "never skipped — retry the step later"
                ),
                metadata={
                    "deployment": self.deployment,
                    "role": role,
                    "run_key": run_key,
                },
                allow_retries=True,
            )
        pause = min(self.wait_interval, remaining)
        log.info(
            f"neli: waiting for {role!r} / {run_key!r}: {why}; trying again in {pause:.1f}s"
        )
        self._sleep(pause)


def _give_up_failure(
    deployment: str, role: str, run_key: str, record: LedgerRecord | None
) -> dg.Failure:
    return dg.Failure(
        description=(
            f"neli: {role!r} / {run_key!r} has terminally failed ({_describe(record)}): the "
            "attempt limit is reached, so no deployment runs it again. Fix the cause, then "
            "clear the run key in the ledger or raise max_attempts."
        ),
        metadata={"deployment": deployment, "role": role, "run_key": run_key},
        allow_retries=False,
    )


def _observe_skip(context: Any, run: NeliRun) -> None:
    """Leave a visible trace in this deployment's asset catalog of where the run happened."""
    op_context = getattr(context, "op_execution_context", context)
    if not op_context.has_assets_def:
        return
    keys = list(op_context.assets_def.keys_by_output_name.values())
    if len(keys) != 1:
        return
    record = run.record
    metadata: dict[str, Any] = {"neli_outcome": str(run.outcome), "run_key": run.run_key}
    if record is not None:
        metadata.update(
            {
                "done_by_deployment": record.deployment,
                "done_token": record.token,
                "done_at": str(record.at),
            }
        )
    partition = op_context.partition_key if op_context.has_partition_key else None
    op_context.log_event(
        dg.AssetObservation(asset_key=keys[0], partition=partition, metadata=metadata)
    )
