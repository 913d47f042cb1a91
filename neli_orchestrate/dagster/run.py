"""The handle a Dagster op or asset gets inside ``with neli.singleton(context) as run:``.

It carries the decision (run here, or skip because another deployment completed the run key),
the fencing token, and the Dagster-facing pieces: Output metadata, Spark conf, a Spark job
canceller wired to the fence callback, and the conversion of a fence into ``dagster.Failure``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import dagster as dg

from neli_orchestrate.errors import ConfigError
from neli_orchestrate.lineage.facet import neli_facet
from neli_orchestrate.spark.conf import SparkJobCanceller, cancel_on_fence

if TYPE_CHECKING:
    from neli_orchestrate import Outcome
    from neli_orchestrate.claim import Claim
    from neli_orchestrate.observe import LedgerRecord
    from neli_orchestrate.singleton.run import Run

logger = logging.getLogger(__name__)

FenceCallback = Callable[[str], Any]

# Tag the Dagster docs suggest for runs of scheduled jobs; the same tick in every deployment.
SCHEDULED_EXECUTION_TIME_TAG = "dagster/scheduled_execution_time"


#: What a NeliRun reads from the singleton's Run it wraps.
_FROM_RUN = frozenset({"role", "run_key", "deployment", "outcome", "token", "record", "reason"})


class NeliRun:
    """One singleton run of a role and run key, as seen by the op or asset doing the work.

    Use :attr:`should_run` to decide whether to work; pass :attr:`metadata` to your ``Output``
    or ``MaterializeResult``; wrap in-process Spark actions in :meth:`cancel_spark_on_fence`.

    .. note:: A fence cannot stop arbitrary Python code: Spark jobs registered through
       :meth:`cancel_spark_on_fence` are cancelled by the watchdog thread, everything else must
       call :meth:`check` between units of work (or register its own :meth:`on_fence`).
    """

    #: The role: the asset key (``a/b``) or the op, unless given.
    role: str
    #: The run key: the partition key, unless given.
    run_key: str
    #: This deployment's id.
    deployment: str
    #: What the decision table decided (RUN, TAKE_OVER, RETRY, SKIP_DONE, ...).
    outcome: Outcome
    #: The fencing token when :attr:`should_run`, else None.
    token: int | None
    #: The latest ledger record the decision saw (for a skip: who completed the run).
    record: LedgerRecord | None
    #: Why the decision table decided as it did.
    reason: str

    def __init__(
        self,
        run: Run,
        *,
        log: Any | None = None,
        time_to_lead: float | None = None,
        run_url: str | None = None,
    ) -> None:
        self._run = run
        #: Where the run completed elsewhere shows in that deployment's UI (its asset
        #: partition's events), when the resource's ``region_urls`` knows it; else None.
        self.run_url = None if run.should_run else run_url
        # Dagster's logger of the step (context.log): a fence must show in the run's event log.
        self._log = log
        #: Wall-clock time this deployment started the run (None where it does not run).
        self.started_at: float | None = time.time() if run.should_run else None
        #: Seconds from the step's first claim attempt to holding the claim (waits included).
        self.time_to_lead = time_to_lead if run.should_run else None
        self._fenced = threading.Event()
        self._fence_reason: str | None = None
        #: True once the skip of a run completed elsewhere was recorded in the catalog (by
        #: :meth:`materialize_by_proxy`, or by the ``neli.singleton`` block as it ends).
        self.skip_recorded = False
        if run.should_run:
            # Registered first, so the run knows it was fenced before user callbacks run and
            # before the cancelled work's exception reaches the step.
            run.on_fence(self._note_fence)

    def __getattr__(self, name: str) -> Any:
        # The singleton's answer, as the step sees it (the attributes annotated above).
        if name in _FROM_RUN:
            return getattr(self._run, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def claim(self) -> Claim | None:
        """The claim this deployment holds (None unless :attr:`should_run`)."""
        return self._run.claim

    @property
    def should_run(self) -> bool:
        """True when this deployment holds the claim and must do the work now."""
        return self._run.should_run

    @property
    def skipped_by_task(self) -> bool:
        """True where the run is not to run here because its work skipped itself wherever it
        ran (``WorkSkipped``: ``COMPLETED``, "skipped by the task"). It produced nothing, so
        nothing is materialized by proxy for it: :meth:`materialize_by_proxy` refuses, and
        ``singleton_asset`` and the ``singleton`` block record an observation instead."""
        from neli_orchestrate.observe import skipped_by_task

        return not self.should_run and skipped_by_task(self.record)

    @property
    def fenced(self) -> bool:
        """True once the watchdog reported that this member lost the role."""
        return self._fenced.is_set() or self._run.fenced

    @property
    def fence_reason(self) -> str | None:
        """Why the run was fenced (from the watchdog), or None."""
        return self._fence_reason

    @property
    def metadata(self) -> dict[str, Any]:
        """Metadata for the step's Output / MaterializeResult: token, deployment, role, run key;
        where the run executes here also ``neli_outcome`` (RUN, TAKE_OVER, RETRY),
        ``started_at`` (a timestamp) and ``time_to_lead`` (seconds, waits included)."""
        metadata: dict[str, Any] = {
            "token": self.token,
            "deployment": self.deployment,
            "role": self.role,
            "run_key": self.run_key,
        }
        if self.started_at is not None:
            metadata["neli_outcome"] = str(self.outcome)
            metadata["started_at"] = dg.MetadataValue.timestamp(self.started_at)
        if self.time_to_lead is not None:
            metadata["time_to_lead"] = dg.MetadataValue.float(round(self.time_to_lead, 3))
        if self.token is not None:
            # OpenLineage's `neli` run facet (neli_orchestrate/lineage/facet.py), as Airflow's
            metadata["neli"] = dg.MetadataValue.json(
                neli_facet(self, recorded_by=self.deployment))  # type: ignore[arg-type]
        return metadata

    @property
    def proxy_metadata(self) -> dict[str, Any]:
        """Metadata of the materialization by proxy where the run completed elsewhere.

        ``deployment`` and ``token`` are the ones that computed the data (as in the runner's
        own materialization), ``completed_at`` when; ``recorded_by`` is this deployment and
        ``neli_by_proxy`` is True; ``ran_in_url`` (a link) opens the partition's events in the
        deployment that ran it, when the resource's ``region_urls`` knows its UI.
        """
        metadata: dict[str, Any] = {
            "neli_by_proxy": True,
            "neli_outcome": str(self.outcome),
            "role": self.role,
            "run_key": self.run_key,
            "recorded_by": self.deployment,
        }
        record = self.record
        if record is not None:
            metadata["deployment"] = record.deployment
            metadata["token"] = record.token
            metadata["completed_at"] = dg.MetadataValue.timestamp(record.at)
            # the `neli` facet of the record read here: proxy, with its ledger offset
            metadata["neli"] = dg.MetadataValue.json(
                neli_facet(record, recorded_by=self.deployment))
        if self.skipped_by_task and record is not None:
            metadata["neli_skipped_by_task"] = True
            metadata["reason"] = record.reason
        if self.run_url:
            metadata["ran_in_url"] = dg.MetadataValue.url(self.run_url)
        return metadata

    def materialize_by_proxy(self) -> dg.MaterializeResult:
        """Return the result that records the asset partition here as materialized elsewhere.

        Return (or yield) it where :attr:`should_run` is False::

            with neli.singleton(context) as run:
                if not run.should_run:
                    return run.materialize_by_proxy()

        Its materialization names where the run executed (:attr:`proxy_metadata`); no IO
        manager is called (the value lives where the run wrote it), and the downstream steps
        of this Dagster run execute. Without it the block records the materialization by itself
        and the downstream steps are skipped.
        """
        if self.should_run:
            raise ConfigError(
                f"materialize_by_proxy() is for a run completed elsewhere; run key "
                f"{self.run_key!r} of role {self.role!r} executes here (outcome {self.outcome})"
            )
        if self.skipped_by_task:
            record = self.record
            raise ConfigError(
                f"run key {self.run_key!r} of role {self.role!r} was skipped by the task in "
                f"deployment {getattr(record, 'deployment', '?')!r}: it produced nothing, so "
                "there is nothing to materialize by proxy. Check run.skipped_by_task first and "
                "return without output (the singleton block then records an observation)"
            )
        self.skip_recorded = True
        return dg.MaterializeResult(metadata=self.proxy_metadata)

    def check(self) -> None:
        """Raise ``FencedError`` if this member no longer leads the role or was superseded.

        Inside ``neli.singleton(...)`` the error becomes a ``dagster.Failure`` without retry.
        """
        if self.should_run:
            self._run.check()

    def on_fence(self, callback: FenceCallback) -> None:
        """Call ``callback(reason)`` from the watchdog thread when the run is fenced.

        Callbacks must be quick and must not raise; they run before the step fails.
        """
        if not self.should_run:
            raise ConfigError(
                f"on_fence() needs a run that executes here; run key {self.run_key!r} of role "
                f"{self.role!r} has outcome {self.outcome} (check run.should_run first)"
            )
        self._run.on_fence(callback)

    def spark_conf(self) -> dict[str, str]:
        """Return the ``spark.neli.*`` conf that hands the token to a spark-submit job."""
        claim = self.claim
        if claim is None:
            raise ConfigError(
                f"run key {self.run_key!r} of role {self.role!r} has no token here "
                f"(outcome {self.outcome}); only a run that executes gets one"
            )
        return claim.spark_conf()

    def cancel_spark_on_fence(self, spark: Any) -> SparkJobCanceller:
        """Tag this thread's Spark jobs so a fence cancels them; use as a context manager.

        Raises ``FencedError`` (the step fails for good) if the run is fenced already.

        ``spark`` is a SparkSession or SparkContext. The job group is
        ``neli/<role>/<run key>/<token>``::

            with run.cancel_spark_on_fence(spark):
                df.write.parquet(...)
        """
        if self.token is None:
            raise ConfigError(
                f"cancel_spark_on_fence() needs a run that executes here (outcome {self.outcome})"
            )
        canceller = cancel_on_fence(spark, f"neli/{self.role}/{self.run_key}/{self.token}")
        self.on_fence(canceller)
        # Fenced already (e.g. while the SparkSession started)? Cancelling a job group before
        # its jobs exist stops nothing, so refuse to start the work at all.
        self.check()
        return canceller

    def fence_failure(self, cause: BaseException) -> dg.Failure:
        """Return the ``dagster.Failure`` that reports this run's fence (retries allowed)."""
        reason = self._fence_reason or str(cause)
        return dg.Failure(
            description=(
                f"fenced: deployment {self.deployment!r} lost role {self.role!r} while running "
                f"run key {self.run_key!r} with token {self.token}: {reason}. Its work was "
                "stopped. A fence fails this try, not the run: a retry (if the step has a retry"
                " policy) decides again from the ledger: skips, waits, or takes over."
            ),
            metadata={k: v for k, v in self.metadata.items() if v is not None},
            allow_retries=True,
        )

    def _note_fence(self, reason: object = None) -> None:
        self._fence_reason = str(reason) if reason is not None else "leadership lost"
        self._fenced.set()
        message = (
            f"neli: fenced: deployment {self.deployment!r} lost role {self.role!r} while running "
            f"run key {self.run_key!r} with token {self.token}: {self._fence_reason}; stopping "
            "the work"
        )
        if self._log is not None:
            try:
                self._log.error(message)
            except Exception:  # noqa: BLE001 - the watchdog thread must go on to cancel the work
                logger.exception("could not log the fence through Dagster's logger")
        else:
            logger.warning(message)

    def __repr__(self) -> str:
        return (
            f"NeliRun(role={self.role!r}, run_key={self.run_key!r}, "
            f"deployment={self.deployment!r}, outcome={self.outcome}, token={self.token})"
        )


def _op_context(context: Any) -> Any:
    # AssetExecutionContext wraps an OpExecutionContext; both are accepted everywhere.
    return getattr(context, "op_execution_context", context)


def default_role(context: Any) -> str:
    """Return the role of the executing step: the asset key (``a/b``), else the op's node path."""
    op_context = _op_context(context)
    if op_context.has_assets_def:
        keys = list(op_context.assets_def.keys_by_output_name.values())
        if len(keys) == 1:
            return keys[0].to_user_string()
    return str(op_context.node_handle)


def default_run_key(context: Any) -> str:
    """Return the run key of the executing step: its partition key; ConfigError otherwise."""
    op_context = _op_context(context)
    if op_context.has_partition_key:
        return str(op_context.partition_key)
    step = str(op_context.node_handle)
    if op_context.has_partition_key_range:
        key_range = op_context.partition_key_range
        raise ConfigError(
            f"step {step!r} runs over the partition range {key_range.start}..{key_range.end}; "
            "a singleton needs one run key per run: launch one run per partition (a backfill "
            "with one run per partition) or pass run_key= explicitly"
        )
    hint = ""
    scheduled = op_context.run.tags.get(SCHEDULED_EXECUTION_TIME_TAG)
    if scheduled:
        hint = (
            f"; this run comes from a schedule tick, e.g. run_key=context.run.tags"
            f"[{SCHEDULED_EXECUTION_TIME_TAG!r}] (here {scheduled!r})"
        )
    raise ConfigError(
        f"step {step!r} has no partition key, so neli.singleton() needs an explicit run_key=: "
        "a string every deployment derives identically for the same logical run (a date, a "
        f"schedule tick); Dagster run ids differ between deployments and cannot serve{hint}"
    )
