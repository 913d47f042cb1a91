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
  and when the run completed, and skips the singleton: its direct child and the tasks named in
  ``singleton_tasks``. Every other task downstream runs as its trigger rule says (a task after
  the child with ``trigger_rule="none_failed"`` runs in every region; with the default
  ``all_success`` Airflow skips it too). The skipped tasks' outlets receive an asset event
  here by proxy, whose ``extra["neli"]`` names the deployment that ran the run, its role, run
  key and token (``proxy_asset_events=False`` turns that off). A run whose work skipped
  itself (``COMPLETED``, "skipped by the task") produced nothing: no event by proxy.
- ``WAIT``: another deployment leads the role or holds a live claim. The gate keeps waiting
  (poke, reschedule or deferred), and never skips: a run nobody has completed must stay
  runnable here in case the other deployment dies.

.. note:: The gate waits at most ``timeout`` seconds (sensor semantics; default from
   ``[sensors] default_timeout``) and then fails, which leaves the run for a later retry or a
   manual clear of the gate. It does not skip on timeout. A COMPLETED run is re-run only after
   ``neli-orchestrate ledger reset ROLE RUN_KEY --reason ...`` (docs/guide/airflow.md, "Re-running a
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
    DONE_ELSEWHERE_XCOM_KEY,
    describe,
    open_singleton,
    record_to_dict,
    reset_command,
)
from neli_orchestrate.airflow.hooks.neli import NeliHook
from neli_orchestrate.airflow.lineage import Claimed, Lineage, LineageHooks, read_back, remember
from neli_orchestrate.airflow.policy import (
    UnfenceableTaskError,
    fence_downstream,
    is_fenced,
    policy_loaded,
)
from neli_orchestrate.airflow.sensors.base import DeferrableNeliSensor, default_deferrable
from neli_orchestrate.errors import ConfigError, KafkaUnavailableError
from neli_orchestrate.observe import ledger_time, skipped_by_task

if TYPE_CHECKING:
    from airflow.sdk import Context

logger = logging.getLogger(__name__)

# Default run key (run_key=None): "<dag_id>/<ts>" when the run has a logical date, the same
# string in every deployment for the same date. A run without one (asset-triggered) derives its
# key from the singleton identity its triggering asset events carry
# (neli_orchestrate.airflow.assets.run_key_after_assets); with neither, the gate refuses to run
# and says what to set.


class LeaderGateOperator(DeferrableNeliSensor, SkipMixin, LineageHooks):
    """Claim this run for this deployment, or skip downstream when it completed elsewhere.

    :param role: the singleton role (templated); one holder at a time. Template it per date
        (``"daily/{{ ds }}"``) to let dates run in parallel.
    :param run_key: the run's exactly-once key (templated); default
        ``"<dag_id>/<logical date ISO>"``. A run without a logical date that was triggered by a
        singleton's asset events gets ``"<dag_id>/after/<role>/<run key>@<token>"`` of the
        upstream run, the same in every region; any other run without a logical date (manual
        with ``logical_date=None``) fails the gate: set ``run_key`` from something every region
        shares, e.g. ``"{{ dag.dag_id }}/{{ params.day }}"``.
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
    :param singleton_tasks: ids of further tasks that belong to the singleton: skipped with the
        gate's direct child in the regions where the run completed elsewhere, whatever their
        trigger rule (e.g. an ``all_done`` clean-up of the job's scratch space, a notification
        only the running region sends). Each must be downstream of the gate.
    :param proxy_asset_events: when the run completed elsewhere, emit the asset events of the
        skipped tasks' outlets here by proxy (default True), so DAGs scheduled on those assets
        run in this region too. The gate declares an ``AssetAlias`` outlet
        (``neli-proxy/<dag_id>/<task_id>``) for it; False declares none and emits nothing.

    The one task directly downstream runs fenced, whatever its operator (see
    :func:`neli_orchestrate.airflow.policy.fence_downstream`).
    """

    template_fields: Sequence[str] = ("role", "run_key")
    ui_color = "#d7ecd9"
    inherits_from_skipmixin = True
    neli_gate = True  # airflow.graph.GATE_MARKER: found by the fencing code without an import

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
        singleton_tasks: Sequence[str] = (),
        proxy_asset_events: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        if not role:
            raise ValueError(f"{type(self).__name__} {self.task_id!r}: role must not be empty")
        if isinstance(singleton_tasks, str):
            raise ValueError(
                f"{type(self).__name__} {self.task_id!r}: singleton_tasks is a list of task ids, "
                f"not one string: write singleton_tasks=[{singleton_tasks!r}]"
            )
        self.role = role
        # None: derived per run in poke() (logical date, else the triggering assets' identity).
        self.run_key: str | None = run_key or None
        self._derive_run_key = not run_key
        self.singleton_tasks = list(singleton_tasks)
        self.proxy_asset_events = proxy_asset_events
        if proxy_asset_events:
            from airflow.sdk import AssetAlias

            from neli_orchestrate.airflow.assets import proxy_alias_name

            self.outlets = [
                *(self.outlets or []),
                AssetAlias(proxy_alias_name(self.dag_id, self.task_id)),
            ]
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

    def render_template_fields(self, context: Context, jinja_env: Any = None) -> None:
        """Render the templates, and the default run key with them (the UI's rendered fields
        and the NELI run link show it before the gate pokes)."""
        super().render_template_fields(context, jinja_env)
        if self._derive_run_key:
            try:
                self._resolve_run_key(context)
            except AirflowFailException:
                self.run_key = None  # poke() raises it, failing the task with the message

    def _resolve_run_key(self, context: Context) -> str:
        """This run's key: the explicit one, else from the logical date or triggering assets."""
        if self.run_key and not self._derive_run_key:
            return self.run_key
        from neli_orchestrate.airflow.assets import run_key_after_assets

        if context.get("logical_date") is not None:
            self.run_key = f"{self.dag_id}/{context['ts']}"
            return self.run_key
        dag_run = context.get("dag_run")
        events = list(getattr(dag_run, "consumed_asset_events", None) or ())
        derived = run_key_after_assets(self.dag_id, events)
        if derived is not None:
            if self.run_key == derived:
                return derived
            self.run_key = derived
            self.log.info(
                "Run key %r derived from the singleton run that triggered this DAG run "
                "(asset event extra 'neli'); every region derives the same",
                derived,
            )
            return derived
        why = (
            f"its {len(events)} triggering asset event(s) carry no NELI singleton identity "
            "(extra 'neli': they come from a task that is not a singleton behind a gate)"
            if events
            else "it was not triggered by a singleton's asset events"
        )
        raise AirflowFailException(
            f"gate {self.task_id!r}: this DAG run has no logical date and {why}, so no run key "
            "is the same in every region; the run would execute once per region. Set run_key= "
            "on the gate to a template every region renders alike, e.g. "
            "run_key=\"{{ dag.dag_id }}/{{ params.day }}\", or trigger the run with a logical date"
        )

    def poke(self, context: Context) -> bool | PokeReturnValue:
        """One attempt: reserve the run and act on the outcome (RUN, SKIP_DONE or WAIT)."""
        from neli_orchestrate import Outcome

        self._check_fencing()
        run_key = self._resolve_run_key(context)
        skipped_where_done = self.singleton_task_list()
        hook = self._hook()
        try:
            with open_singleton(hook) as singleton:
                # Singleton.reserve never joins a busy group (it reads the ledger instead).
                reservation = singleton.reserve(self.role, run_key)
                # OpenLineage: the claim's record read back, with its ledger offset
                claimed = (read_back(singleton, self.role, run_key, reservation.token)
                           if reservation.token is not None else None)
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
            # OpenLineage (the provider's hooks, after this task): the claim, read back
            remember(self, Lineage(
                recorded_by=deployment,
                record=claimed or Claimed(self.role, run_key, int(claim["token"]), deployment)))
            return PokeReturnValue(is_done=True, xcom_value=claim)
        if outcome is Outcome.SKIP_DONE:
            if reservation.record is not None:
                # OpenLineage: the record this region saw (a proxy where another region ran it)
                remember(self, Lineage(recorded_by=deployment, record=reservation.record))
            self._skip_singleton(context, reservation.record, skipped_where_done, deployment)
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
                f"{reset_command(self.role, str(self.run_key))}, then clear this gate in one region"
            )
        raise AirflowException(f"unexpected reservation outcome {outcome!r} for {self.run_key!r}")

    def _check_fencing(self) -> None:
        """Claim only if the task after the gate will run fenced in its own process too."""
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

    def singleton_task_list(self) -> list[Any]:
        """The tasks skipped where the run completed elsewhere: the child, then singleton_tasks."""
        if self.dag is None:
            return list(self.downstream_list)
        downstream = {t.task_id: t for t in self.get_flat_relatives(upstream=False)}
        unknown = [t for t in self.singleton_tasks if t not in downstream]
        if unknown:
            raise AirflowFailException(
                f"gate {self.task_id!r}: singleton_tasks {unknown} are not downstream of the gate "
                f"in DAG {self.dag_id!r}; name tasks after it (downstream: {sorted(downstream)})"
            )
        tasks = list(self.downstream_list)
        tasks += [downstream[t] for t in self.singleton_tasks if downstream[t] not in tasks]
        return tasks

    def _skip_singleton(
        self, context: Context, record: Any, tasks: list[Any], here: str
    ) -> None:
        ti = context["ti"]
        where = (
            f"deployment {record.deployment!r} at {ledger_time(record.at)} (token {record.token})"
            if record is not None
            else "another deployment"
        )
        skipped = [t.task_id for t in tasks]
        # The work skipped itself where it ran: it produced nothing, so nothing is emitted
        # here by proxy either (no asset event, no consumer DAG queued), as in that region.
        by_task = skipped_by_task(record)
        self.log.info(
            "Run %r of role %r already %s %s; skipping the singleton %s here%s; tasks after it "
            "run as their trigger rules say. To run it again: %s, then clear this gate in one "
            "region",
            self.run_key,
            self.role,
            "skipped by the task in" if by_task else "completed by",
            where,
            skipped,
            " without asset events by proxy (the work produced nothing)" if by_task else "",
            reset_command(self.role, self.run_key or "RUN_KEY"),
        )
        done = record_to_dict(record)
        if done is not None:
            # what the "Ran in region" extra link and the NELI page read (plugins/leadership)
            done["skipped"] = skipped
            done["skipped_by_task"] = by_task
            url = self.region_url(record, run_key=str(self.run_key),
                                  child=skipped[0] if skipped else None)
            if url:
                done["url"] = url
                self.log.info(
                    "%s deployment %r with token %s: %s",
                    "Skipped by the task in" if by_task else "Ran in", record.deployment,
                    record.token, url,
                )
        ti.xcom_push(key=DONE_ELSEWHERE_XCOM_KEY, value=done)
        if self.proxy_asset_events and record is not None and not by_task:
            self._emit_by_proxy(context, record, tasks, here)
        # Raises DownstreamTasksSkipped when there is anything to skip; the task runner then
        # records the gate's success with the outlet events added above.
        self.skip(ti=ti, tasks=tasks)

    def region_url(self, record: Any, *, run_key: str, child: str | None) -> str | None:
        """The DAG run that ran ``run_key`` in ``record.deployment``'s UI, from the setting
        ``region_urls`` (``{"us-east-1": "https://airflow.us-east-1.example.com", ...}``):
        that region's NELI page redirects to its run (neli_orchestrate.airflow.assets.ran_url).
        None if the region's URL is unknown."""
        from neli_orchestrate.airflow.assets import ran_url

        try:
            urls = self._hook().settings.region_urls
        except Exception as exc:  # noqa: BLE001 - a link must never fail the gate
            self.log.warning("Cannot read region_urls of connection %r: %s", self.neli_conn_id, exc)
            return None
        base = urls.get(record.deployment)
        if not base:
            return None
        return ran_url(base, role=self.role, run_key=run_key, token=record.token,
                       dag_id=self.dag_id, task_id=child)

    def _emit_by_proxy(self, context: Context, record: Any, tasks: list[Any], here: str) -> None:
        """Add an asset event for each skipped task's outlet, through the gate's proxy alias."""
        from airflow.sdk import AssetAlias

        from neli_orchestrate.airflow.assets import (
            EXTRA_KEY,
            PROXY_ALIAS_PREFIX,
            concrete_outlets,
            proxy_alias_name,
            proxy_identity,
        )

        events = context.get("outlet_events")
        assets: list[Any] = []
        for task in tasks:
            found, refused = concrete_outlets(task)
            assets += [a for a in found if a not in assets]
            if refused:
                self.log.warning(
                    "Task %r declares %s as outlets: which assets those resolve to is decided "
                    "in the run itself, so no event is emitted for them here by proxy",
                    task.task_id,
                    refused,
                )
        if not assets:
            return
        if events is None:
            self.log.warning("No outlet_events in this context: no asset event by proxy")
            return
        extra: dict[str, Any] = {
            EXTRA_KEY: proxy_identity(record, role=self.role, run_key=str(self.run_key), here=here)
        }
        # The alias declared in __init__ (the DAG's id was known then if the gate was made in
        # a `with DAG` block), else this DAG's.
        name = next(
            (o.name for o in self.outlets or ()
             if isinstance(o, AssetAlias) and o.name.startswith(PROXY_ALIAS_PREFIX)),
            proxy_alias_name(self.dag_id, self.task_id),
        )
        alias = events[AssetAlias(name)]
        for asset in assets:
            alias.add(asset, extra=extra)
        self.log.info(
            "Asset event(s) by proxy for %s: the run was done by deployment %r with token %s",
            [getattr(a, "name", None) or getattr(a, "uri", None) for a in assets],
            record.deployment,
            record.token,
        )
