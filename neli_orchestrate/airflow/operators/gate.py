"""LeaderGateOperator: let one deployment claim a run; skip it everywhere else once it is done.

Usage::

    gate = LeaderGateOperator(task_id="gate", role="nycflights_daily")
    job = FencedSparkSubmitOperator(task_id="job", application="jobs/nycflights_daily.py")
    gate >> job >> report

Every deployment runs the same DAG. For each run the gate asks the run ledger (through
:meth:`neli_orchestrate.Singleton.reserve`) what to do:

- ``RUN``: this deployment now holds the claim. The gate succeeds and pushes
  ``{"token", "run_key", "role", "deployment"}`` as its return value XCom; the fenced task
  downstream re-verifies the claim and runs under it.
- ``SKIP_DONE``: the run is ``COMPLETED`` (here or elsewhere). The gate succeeds, logs where
  and when the run completed, and skips everything downstream.
- ``WAIT``: another deployment leads the role or holds a live claim. The gate keeps waiting
  (poke, reschedule or deferred), and never skips: a run nobody has completed must stay
  runnable here in case the other deployment dies.

.. note:: The gate waits at most ``timeout`` seconds (sensor semantics; default from
   ``[sensors] default_timeout``) and then fails, which leaves the run for a later retry or a
   manual clear of the gate. It does not skip on timeout. A COMPLETED run is re-run only after
   ``neli-orchestrate ledger reset ROLE RUN_KEY --reason ...`` (docs/airflow.md, "Re-running a
   date").
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import PokeReturnValue, SkipMixin
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from neli_orchestrate.airflow.claims import (
    describe,
    open_singleton,
    record_to_dict,
    reset_command,
)
from neli_orchestrate.airflow.hooks.neli import NeliHook
from neli_orchestrate.airflow.sensors.base import DeferrableNeliSensor, default_deferrable
from neli_orchestrate.errors import ConfigError, KafkaUnavailableError
from neli_orchestrate.ledger.record import format_epoch

if TYPE_CHECKING:
    from airflow.sdk import Context

logger = logging.getLogger(__name__)

#: Default run key: the same string in every deployment for the same logical date. Runs without
#: a logical date (asset-triggered, or manual with logical_date=None) fall back to the run id,
#: which differs between deployments; give such DAGs an explicit run_key.
DEFAULT_RUN_KEY = "{{ dag.dag_id }}/{{ ts if logical_date else run_id }}"

#: XCom key under which a skipping gate records the ledger entry it found.
DONE_ELSEWHERE_XCOM_KEY = "neli_done"



class LeaderGateOperator(DeferrableNeliSensor, SkipMixin):
    """Claim this run for this deployment, or skip downstream when it completed elsewhere.

    :param role: the singleton role (templated); one holder at a time. Template it per date
        (``"daily/{{ ds }}"``) to let dates run in parallel.
    :param run_key: the run's exactly-once key (templated); default
        ``"<dag_id>/<logical date ISO>"`` (the run id when there is no logical date).
    :param neli_conn_id: ``neli`` or ``kafka`` connection (see NeliHook).
    :param deployment: overrides the connection's deployment id.
    :param acquire_timeout: seconds one attempt waits to lead the role (connection default).
    :param deferrable: wait in the triggerer (NeliLeadershipTrigger) instead of a worker slot;
        default ``[operators] default_deferrable``.
    :param mode: ``poke`` (hold a worker slot) or ``reschedule`` (free it between attempts).
    :param poke_interval: seconds between attempts while waiting (default 30).
    :param run_acquire_timeout: seconds the fenced task after the gate waits to lead the role
        before failing its try (connection default). Runs of one role execute one after
        another, so allow for the longest run ahead of this one.

    The one task directly downstream runs fenced, whatever its operator (see
    :func:`neli_orchestrate.airflow.operators.fenced.fence_downstream`).
    """

    template_fields: Sequence[str] = ("role", "run_key")
    ui_color = "#d7ecd9"
    inherits_from_skipmixin = True
    neli_gate = True  # operators.fenced.GATE_MARKER: found by the fencing code without an import

    def __init__(
        self,
        *,
        role: str,
        run_key: str | None = None,
        neli_conn_id: str = NeliHook.default_conn_name,
        deployment: str | None = None,
        acquire_timeout: float | None = None,
        deferrable: bool | None = None,
        poke_interval: float | timedelta = 30,
        run_acquire_timeout: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        if not role:
            raise ValueError(f"{type(self).__name__} {self.task_id!r}: role must not be empty")
        self.role = role
        self.run_key = run_key or DEFAULT_RUN_KEY
        self.neli_conn_id = neli_conn_id
        self.deployment = deployment
        self.acquire_timeout = acquire_timeout
        self.run_acquire_timeout = run_acquire_timeout
        self.deferrable = default_deferrable() if deferrable is None else deferrable

    def _hook(self) -> NeliHook:
        return NeliHook(
            self.neli_conn_id, deployment=self.deployment, acquire_timeout=self.acquire_timeout
        )

    def _trigger_run_key(self) -> str | None:
        return self.run_key

    def poke(self, context: Context) -> bool | PokeReturnValue:
        """One attempt: reserve the run and act on the outcome (RUN, SKIP_DONE or WAIT)."""
        from neli_orchestrate.decision import Outcome

        self._check_fencing()
        hook = self._hook()
        try:
            with open_singleton(hook) as singleton:
                # Singleton.reserve never joins a busy group (it reads the ledger instead).
                reservation = singleton.reserve(self.role, self.run_key)
        except ConfigError as exc:
            # Configuration does not fix itself between pokes or retries.
            raise AirflowFailException(f"NELI configuration error: {exc}") from exc
        except KafkaUnavailableError as exc:
            # A deployment cut off from Kafka waits: the others can still run the work, and a
            # skip here could lose the run.
            self.log.warning(
                "Kafka unavailable, will try again (run %r of role %r): %s",
                self.run_key,
                self.role,
                exc,
            )
            return False
        outcome = reservation.outcome
        deployment = hook.deployment
        if reservation.should_run:
            claim = reservation.claim.xcom()  # type: ignore[union-attr]
            self.log.info(
                "Claimed run %r of role %r for deployment %r with fencing token %s (%s; "
                "previous: %s)",
                self.run_key,
                self.role,
                deployment,
                reservation.token,
                outcome,
                describe(reservation.record),
            )
            return PokeReturnValue(is_done=True, xcom_value=claim)
        if outcome is Outcome.SKIP_DONE:
            self._skip_downstream(context, reservation.record)
            return PokeReturnValue(is_done=True, xcom_value=None)
        if outcome is Outcome.WAIT:
            self.log.info(
                "Waiting: run %r of role %r is not ours to run yet: %s (latest record: %s); "
                "next attempt in %ss",
                self.run_key,
                self.role,
                reservation.reason,
                describe(reservation.record),
                self.poke_interval,
            )
            return False
        if outcome is Outcome.GIVE_UP:
            raise AirflowFailException(
                f"run {self.run_key!r} of role {self.role!r} failed for good (max attempts "
                f"reached): {describe(reservation.record)}. To run it again: "
                f"{reset_command(self.role, self.run_key)}, then clear this gate in one region"
            )
        raise AirflowException(f"unexpected reservation outcome {outcome!r} for {self.run_key!r}")

    def _check_fencing(self) -> None:
        """Claim only if the task after the gate will run fenced in its own process too."""
        from neli_orchestrate.airflow.operators.fenced import (
            UnfenceableTaskError,
            fence_downstream,
            is_fenced,
        )
        from neli_orchestrate.airflow.policy import policy_loaded

        if self.dag is None:
            return
        unfenced_before = [t.task_id for t in self.downstream_list if not is_fenced(t)]
        try:
            # Fences this DAG object's tasks: what dag.test() runs in this very process.
            fence_downstream(self.dag)
        except UnfenceableTaskError as exc:
            raise AirflowFailException(str(exc)) from exc
        if unfenced_before and not policy_loaded():
            # Loaded without the provider's cluster policy: the task process of the child
            # would load it the same way and run it unfenced. Never claim for that.
            raise AirflowFailException(
                f"{unfenced_before} after gate {self.task_id!r} would run unfenced: the "
                "neli-orchestrate cluster policy is not loaded in this Airflow (entry point "
                "airflow.policy). Reinstall neli-orchestrate where Airflow runs, or add "
                "`from neli_orchestrate.airflow.policy import dag_policy` to "
                "airflow_local_settings.py"
            )

    def _skip_downstream(self, context: Context, record: Any) -> None:
        ti = context["ti"]
        downstream = list(self.get_flat_relatives(upstream=False))
        where = (
            f"deployment {record.deployment!r} at {format_epoch(record.at)} (token {record.token})"
            if record is not None
            else "another deployment"
        )
        self.log.info(
            "Run %r of role %r already completed by %s; skipping downstream %s. To run it "
            "again: %s, then clear this gate in one region",
            self.run_key,
            self.role,
            where,
            sorted(t.task_id for t in downstream),
            reset_command(self.role, self.run_key),
        )
        ti.xcom_push(key=DONE_ELSEWHERE_XCOM_KEY, value=record_to_dict(record))
        # Raises DownstreamTasksSkipped when there is anything to skip.
        self.skip(ti=ti, tasks=downstream)
