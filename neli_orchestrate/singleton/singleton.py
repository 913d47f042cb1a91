"""The Singleton API: claim, reserve, execute, reset and expire the runs of singleton roles.

Usage (the split form; :meth:`Singleton.claim` does both in one process)::

    gate = singleton.reserve("daily_flights", "2013-01-05")          # in the gate's process
    if gate.should_run:
        singleton.execute(gate.claim,                                 # in the executor's
                          lambda run: build_table(token=run.token))

The steps of one claim: become leader of the role's NELI group
(:mod:`~neli_orchestrate.singleton.leadership`) → begin the role's transactional ledger writer
(``init_transactions()`` fences every earlier leader at the broker) → replay the ledger → apply
the decision table (:mod:`neli_orchestrate.decision`) → write the claim with a new, larger
token → run the work while a watchdog thread keeps the member polled → record ``COMPLETED`` or
``FAILED`` → close the member, so the next deployment does not wait for a session timeout.
While the role's group is busy, none of this happens (:mod:`~neli_orchestrate.singleton.busy`).

The split form serves orchestrators whose gate and work run in different processes (Airflow):
:meth:`Singleton.reserve` writes ``CLAIMED`` with a handoff deadline and releases leadership;
:meth:`Singleton.execute` re-acquires it, checks that the claim is still ours, and runs.

Pass ``metrics=`` (a :data:`~neli_orchestrate.metrics.MetricsHook`) to count claims, skips,
takeovers, fences and leadership changes and to time leadership acquisition.

.. note:: Exactly-once holds for the ledger and for token-checked sinks. A job that writes
   elsewhere must be idempotent for the narrow windows described in ``docs/guide/guarantees.md``
   (e.g. a fence that arrives after the external write but before ``COMPLETED`` is recorded).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, overload

from neli_orchestrate.claim import Claim, as_claim
from neli_orchestrate.core.neli import Neli
from neli_orchestrate.decision import (
    Claimant,
    ClaimStatus,
    Decision,
    Outcome,
    check_claim,
    claim_record,
    decide,
    reset_record,
    skipped_reason,
    with_application,
)
from neli_orchestrate.errors import (
    AcquireTimeoutError,
    ConfigError,
    FencedError,
    SkippedRun,
    WorkNotStopped,
    WorkSkipped,
)
from neli_orchestrate.ledger.kafka import KafkaLedger
from neli_orchestrate.ledger.record import LedgerRecord, RunState
from neli_orchestrate.ledger.replay import Replay
from neli_orchestrate.ledger.store import LedgerStore, LedgerWriter, expire
from neli_orchestrate.liveness import DeploymentLiveness
from neli_orchestrate.metrics import Metric, MetricEvent, MetricsHook, emit
from neli_orchestrate.singleton.busy import busy_answer, while_preparing
from neli_orchestrate.singleton.config import SingletonConfig
from neli_orchestrate.singleton.groups import GroupReads, MemberClients
from neli_orchestrate.singleton.held import HeldRole
from neli_orchestrate.singleton.leadership import NeliFactory, _Leadership
from neli_orchestrate.singleton.run import Reservation, Run

log = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = ["Singleton"]


class Singleton:
    """Claim and run singleton work exactly once across deployments (see the module docstring).

    Thread-safe for concurrent claims of different roles. Cheap to construct: Kafka clients
    are created on first use. Call :meth:`close` (or use it as a context manager) when done.
    """

    def __init__(
        self,
        config: SingletonConfig,
        *,
        ledger: LedgerStore | None = None,
        neli_factory: NeliFactory | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        membership: Callable[[str], int] | None = None,
        metrics: MetricsHook | None = None,
        liveness: Callable[[str], DeploymentLiveness] | None = None,
    ) -> None:
        self.config = config
        self._metrics = metrics
        self._ledger = ledger
        self._ledger_lock = threading.Lock()
        self._clock = clock
        self._wall = wall_clock
        self._groups = GroupReads(config)
        # Members check their topic over the busy check's admin client, already connected.
        self._neli_factory: NeliFactory = neli_factory or functools.partial(
            Neli, kafka=MemberClients(self._groups))
        # How many members a consumer group has (by group id): the broker's answer, unless
        # members are injected (tests, simulations): then groups count as idle unless the
        # caller injects membership as well.
        self._membership: Callable[[str], int] = membership or (
            self._groups.members if neli_factory is None else (lambda group: 0))
        # Another deployment's liveness (by deployment): Kafka's answer, unless injected
        # (tests, simulations); None: no information (the handoff window alone).
        self._liveness: Callable[[str], DeploymentLiveness] | None = liveness or (
            self._groups.liveness if neli_factory is None else None)

    # -- public API --------------------------------------------------------------------------

    @property
    def ledger(self) -> LedgerStore:
        """The run ledger (created on first use)."""
        with self._ledger_lock:
            if self._ledger is None:
                self._ledger = KafkaLedger(self.config.ledger_config())
            return self._ledger

    def status(self, role: str, run_key: str) -> LedgerRecord | None:
        """The latest ledger record of a run (read-only; no leadership needed)."""
        return self.ledger.replay(role).latest(run_key)

    def role_members(self, role: str) -> int:
        """How many members contend for ``role`` right now; read-only (no join, no rebalance).

        Non-zero means some deployment leads the role or is trying to. Waiting callers (gates,
        sensors) need not: :meth:`reserve`, :meth:`claim` and :meth:`leads` apply the busy-group
        rule themselves. Raises :class:`KafkaUnavailableError` if the cluster does not answer.
        """
        return self._membership(self.config.role_neli(role).resolved.group_id)

    def _liveness_of(self, latest: LedgerRecord | None, me: Claimant) -> DeploymentLiveness | None:
        """Kafka's reading of the deployment whose unfinished record another one would respect;
        None when the rule does not need it or cannot get it (then the handoff window holds)."""
        if (self._liveness is None or not self.config.deployment_liveness or latest is None
                or latest.deployment == me.deployment
                or latest.state not in (RunState.CLAIMED, RunState.FAILED)):
            return None
        try:
            seen = self._liveness(latest.deployment)
        except Exception as exc:  # noqa: BLE001 - no information: today's rule, never a guess
            log.warning("cannot read the liveness of deployment %r (%s): respecting its %s"
                        " record for the handoff window", latest.deployment, exc, latest.state)
            return None
        log.info("liveness: %s", seen.describe())
        return seen

    def expire(self, role: str, retention: float) -> list[str]:
        """Tombstone ``role``'s finished run keys last written over ``retention`` seconds ago.

        Leads the role first (only the leader writes the ledger); returns the expired run keys,
        or raises :class:`AcquireTimeoutError`. Running and claimed runs are never expired.
        Compaction then removes them; tokens keep increasing (they are offsets).
        """
        lead = self._lead(role)
        try:
            if not lead.acquire(self.config.acquire_timeout):
                raise AcquireTimeoutError(f"could not lead role {role!r} to expire its ledger")
            writer = self.ledger.begin(role)
            try:
                return expire(writer, self._wall() - retention)
            finally:
                writer.close()
        finally:
            lead.close()

    def leads(self, role: str, timeout: float) -> bool:
        """True if this deployment's member became leader of ``role`` within ``timeout``.

        False at once, without joining, while the role's group is busy (the busy-group rule,
        see :meth:`reserve`).

        .. note:: Leadership ends when this returns (the member leaves the group); use it to
           wait for a region to be able to lead, not as a lock.
        """
        members = self.role_members(role)
        if members:
            log.info("role %r is busy (%d member(s) lead or wait for it): not joining", role,
                     members)
            return False
        lead = self._lead(role)
        try:
            return lead.acquire(timeout)
        finally:
            lead.close()

    @contextlib.contextmanager
    def hold(self, role: str, timeout: float | None = None) -> Iterator[HeldRole]:
        """Lead ``role`` for the block; its claims there skip the join and the leave.

        A process that claims a role's runs one after another (a scheduler loop, a worker)
        joins the role's group once: each claim through the :class:`HeldRole` then replays the
        ledger's tail and commits, about four round trips, where a one-off claim pays about
        twenty across regions (:mod:`~neli_orchestrate.singleton.held`). Other deployments find
        the group busy meanwhile, as under any running leader; leaving the block leaves it.

        Follows the busy-group rule: while anyone leads the role or waits for it, this does
        not join. Raises :class:`AcquireTimeoutError` then, or when leadership is not acquired
        within ``timeout`` (default ``acquire_timeout``).
        """
        members = self.role_members(role)
        if members:
            raise AcquireTimeoutError(
                f"role {role!r} is busy ({members} member(s) lead or wait for it): not joining;"
                " hold it once its group is idle")
        self._warm(role)
        lead = self._lead(role)
        held: HeldRole | None = None
        try:
            wait = self.config.acquire_timeout if timeout is None else timeout
            if not lead.acquire(wait):
                raise AcquireTimeoutError(f"could not lead role {role!r} within {wait:g} s to"
                                          " hold it; another member holds it")
            held = HeldRole(self, lead)
            yield held
        finally:
            if held is not None:
                held._end()
            lead.close()

    @contextlib.contextmanager
    def claim(self, role: str, run_key: str) -> Iterator[Run]:
        """Lead ``role``, decide on ``run_key`` and, if it is ours to run, hold it for the block.

        Inside the block run the work only if ``run.should_run``. Leaving the block normally
        records ``COMPLETED``; an exception records ``FAILED`` (and is re-raised); a fence
        raises :class:`FencedError` (nothing is recorded: the next leader takes over).
        Follows the busy-group rule of :meth:`reserve`.
        """
        busy = self._busy_while_preparing(role, run_key)
        if busy is not None:
            yield busy
            return
        lead = self._lead(role)
        try:
            if not lead.acquire(self.config.acquire_timeout):
                run = self._not_leading(role, run_key)
                lead.close()  # release at once: a WAIT must not hold the claimant's executor
                yield run
                return
            with self._claimed(lead, role, run_key, let_go=lead.close) as run:
                yield run
        finally:
            lead.close()

    def run(self, role: str, run_key: str, work: Callable[[Run], T]) -> T | None:
        """Claim and, if ours, run ``work(run)``; returns its value, or None when not run."""
        with self.claim(role, run_key) as run:
            if not run.should_run:
                return None
            return work(run)

    def reserve(self, role: str, run_key: str) -> Reservation:
        """Gate (split form): decide and, if ours, record ``CLAIMED`` with a handoff deadline.

        Releases leadership before returning, so this deployment's executor (another process)
        can acquire it. ``WAIT`` means another deployment leads the role or holds a live claim:
        ask again later — never skip a run on WAIT.

        The busy-group rule: while anyone leads the role or waits for it (its group has
        members), this does not join the group — every join rebalances the group under the
        running leader, and under classic groups may fence it. It reads the ledger instead:
        ``SKIP_DONE`` (or ``GIVE_UP``) when the run key is finished, else ``WAIT``.
        """
        busy = self._busy_while_preparing(role, run_key)
        if busy is not None:
            return self._reservation(busy)
        lead = self._lead(role)
        writer: LedgerWriter | None = None
        try:
            run, _, writer = self._lead_and_claim(lead, role, run_key, RunState.CLAIMED)
            return self._reservation(run)
        finally:
            if writer is not None:
                self._release(writer, lead)
            lead.close()

    @overload
    def execute(self, claim: Claim, work: Callable[[Run], T], /, *,
                on_fence: Callable[[str], object] | None = None) -> T: ...

    @overload
    def execute(self, role: str, run_key: str, token: int, work: Callable[[Run], T], /, *,
                on_fence: Callable[[str], object] | None = None) -> T: ...

    def execute(self, *args: Any, on_fence: Callable[[str], object] | None = None) -> Any:
        """Executor (split form): ``execute(claim, work)`` re-acquires leadership, verifies the
        gate's claim, runs ``work(run)`` and records the outcome.

        ``claim`` is the gate's :class:`~neli_orchestrate.claim.Claim` (``reservation.claim``,
        or ``Claim.from_xcom(...)``); it must name its role. The loose form
        ``execute(role, run_key, token, work)`` builds that Claim and does the same.
        """
        if len(args) == 4:
            role, run_key, token, work = args
            return self._execute(as_claim(run_key, token, role=role), work, on_fence=on_fence)
        if len(args) != 2 or not isinstance(args[0], Claim):
            raise TypeError("execute() takes (claim, work) or (role, run_key, token, work)")
        return self._execute(args[0], args[1], on_fence=on_fence)

    def _execute(
        self,
        claim: Claim,
        work: Callable[[Run], T],
        *,
        on_fence: Callable[[str], object] | None = None,
    ) -> T:
        """Executor (split form): re-acquire, verify claim ``token``, run ``work(run)``, record.

        ``token`` is the gate's (an orchestrator passes the same one to every try of the task,
        e.g. from XCom). If its claim is still the run key's current, unstarted claim, this
        records ``RUNNING`` under it. If the run key moved on since (an earlier try ran and
        failed or was fenced, a re-run gate claimed again, another deployment took over),
        this try decides again from the ledger as a gate would: it runs under a new, larger
        token when the decision table allows (``RETRY``/``TAKE_OVER``; the work must use
        ``run.token``, not the reserved one). Then ``COMPLETED`` (returns the value) or
        ``FAILED`` (re-raises). No number of tries strands a run key.

        Raises :class:`SkippedRun` if the run was completed; :class:`AcquireTimeoutError` if
        leadership could not be acquired within ``acquire_timeout`` or another deployment
        holds a live claim on the run (retry the try later); :class:`FencedError` if
        leadership was lost (before or during the work: no work starts once fenced), if the
        run key terminally failed (``max_attempts``), or if ``token`` is not a claim this
        ledger issued for the run key.
        """
        if claim.role is None:
            raise ConfigError(f"the claim of run {claim.run_key!r} names no role: execute() "
                              "needs the role it was reserved for")
        role, run_key = claim.role, claim.run_key
        self._warm(role)
        lead = self._lead(role)
        try:
            if not lead.acquire(self.config.acquire_timeout):
                raise AcquireTimeoutError(
                    f"could not lead role {role!r} within {self.config.acquire_timeout} s to run"
                    f" {run_key!r}; another member holds it (latest record:"
                    f" {_describe(self.status(role, run_key))})"
                )
            return self._execute_as_leader(lead, claim, work, on_fence=on_fence)
        finally:
            lead.close()

    def _execute_as_leader(self, lead: _Leadership, claim: Claim, work: Callable[[Run], T], *,
                           on_fence: Callable[[str], object] | None = None) -> T:
        """:meth:`_execute` once ``lead`` leads the claim's role (a held role's too)."""
        role, run_key, token = str(claim.role), claim.run_key, claim.token
        writer: LedgerWriter | None = None
        try:
            writer = self.ledger.begin(role)
            me = Claimant(self.config.deployment, lead.member)
            replay = writer.replay()
            now = self._wall()
            latest = replay.latest(run_key)
            check = check_claim(token, latest, me)
            log.info("role %r run %r: claim %s is %s: %s", role, run_key, token, check.status,
                     check.reason)
            if check.status is ClaimStatus.COMPLETED:
                raise SkippedRun(f"run {run_key!r} of role {role!r} is {check.reason}",
                                 record=latest)
            if check.ok and latest is not None:
                record = latest.advance(RunState.RUNNING, at=now, member=me.member)
                decision_outcome, reason = Outcome.RUN, check.reason
            elif check.decide_again:
                record, decision_outcome, reason = self._decide_again(
                    writer, replay, role, run_key, token, me, now)
            else:
                raise FencedError(
                    f"claim {token} of run {run_key!r} (role {role!r}) is not this ledger's"
                    f" current claim: {check.reason}", role=role, token=token, final=True)
            if lead.lost is not None:
                raise FencedError(f"lost leadership of role {role!r} before running {run_key!r}:"
                                  f" {lead.lost}", role=role, token=token)
            writer.write(record)
            if record.token != token:  # a new claim (decided again), not the gate's
                self._count(role, run_key, decision_outcome)
            run = Run(role=role, run_key=run_key, deployment=self.config.deployment,
                      outcome=decision_outcome, reason=reason, token=record.token,
                      record=latest)
            if on_fence is not None:
                run.on_fence(on_fence)
            with self._hold(lead, writer, run, record):
                return work(run)
        finally:
            if writer is not None:
                writer.close()

    def _decide_again(
        self, writer: LedgerWriter, replay: Replay, role: str, run_key: str, token: int,
        me: Claimant, now: float,
    ) -> tuple[LedgerRecord, Outcome, str]:
        """An executor try whose claim moved on decides again, as a gate would.

        Returns the RUNNING claim to write (a new, larger token); raises when this try must
        not run: :class:`SkippedRun` (completed), :class:`AcquireTimeoutError` (another
        deployment's claim is live: fail this try cleanly, the orchestrator retries later),
        :class:`FencedError` (``max_attempts`` reached: terminally failed).
        """
        latest = replay.latest(run_key)
        decision = self._decide(role, run_key, latest, me, now)
        if decision.claims:
            record = claim_record(decision, replay, run_key=run_key, me=me, now=now,
                                  policy=self.config.policy, state=RunState.RUNNING)
            log.info("role %r run %r: try with claim %s runs again under token %s (%s)", role,
                     run_key, token, record.token, decision.outcome)
            return record, decision.outcome, decision.reason
        if decision.outcome is Outcome.SKIP_DONE:
            raise SkippedRun(f"run {run_key!r} of role {role!r} is {decision.reason}",
                             record=latest)
        if decision.outcome is Outcome.WAIT:
            until = ("" if decision.wait_until is None else " until " + time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime(decision.wait_until)))
            raise AcquireTimeoutError(
                f"run {run_key!r} of role {role!r} is held by another deployment{until}:"
                f" {decision.reason}. This try does not run; asked again (the Airflow fenced"
                " try waits and asks again), it runs the work if that claim lapses",
                wait_until=decision.wait_until)
        if decision.record_failure:
            # RUNNING at max_attempts: record the terminal failure, as a gate would.
            failure = claim_record(decision, replay, run_key=run_key, me=me, now=now,
                                   policy=self.config.policy)
            writer.write(failure)
        raise FencedError(
            f"run {run_key!r} of role {role!r} may not run again: {decision.outcome}:"
            f" {decision.reason}. Reset it to run it again (Singleton.reset)",
            role=role, token=token, final=True)

    def reset(self, role: str, run_key: str, reason: str) -> LedgerRecord:
        """Reset a finished run key so that its next run starts over (audited; leader only).

        Writes a ``RESET`` record with ``reason`` (who asks and why), this deployment and a new
        token: the decision table treats it as no record (the next gate or claim anywhere
        runs the run key again, attempt 1, under a still larger token). Only ``COMPLETED`` or
        ``FAILED`` run keys may be reset; a ``CLAIMED`` or ``RUNNING`` one is in progress.
        Returns the record written. Raises :class:`ConfigError` (no reason, or the run key
        is in progress or has nothing to reset) or :class:`AcquireTimeoutError`.

        .. note:: Whatever the earlier run wrote stays; a token-checked sink replaces it when
           the re-run publishes with its larger token.
        """
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError("Singleton.reset needs a reason (who asks, and why), for the audit"
                              " trail")
        lead = self._lead(role)
        try:
            if not lead.acquire(self.config.acquire_timeout):
                raise AcquireTimeoutError(
                    f"could not lead role {role!r} within {self.config.acquire_timeout} s to"
                    f" reset {run_key!r}; another member holds it, try again when it is idle")
            writer = self.ledger.begin(role)
            try:
                me = Claimant(self.config.deployment, lead.member)
                replay = writer.replay()
                latest = replay.latest(run_key)
                try:
                    record = reset_record(latest, replay, run_key=run_key, me=me,
                                          now=self._wall(), reason=reason)
                except ValueError as exc:
                    raise ConfigError(str(exc)) from None
                if lead.lost is not None:
                    raise FencedError(f"lost leadership of role {role!r} before resetting"
                                      f" {run_key!r}: {lead.lost}", role=role)
                writer.write(record)
            finally:
                writer.close()
        finally:
            lead.close()
        log.warning("role %r run %r reset by %s (token %s; was %s): %s", role, run_key,
                    self.config.deployment, record.token, _describe(latest), record.reason)
        return record

    def close(self) -> None:
        """Release the ledger's Kafka clients."""
        with self._ledger_lock:
            if self._ledger is not None:
                self._ledger.close()
                self._ledger = None

    def __enter__(self) -> Singleton:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------

    def _lead(self, role: str) -> _Leadership:
        """A member for ``role`` (joins its group; :meth:`_Leadership.acquire` to lead)."""
        return _Leadership(self.config, role, self._neli_factory, self._clock, self._metric)

    def _lead_and_claim(
        self, lead: _Leadership, role: str, run_key: str, state: RunState
    ) -> tuple[Run, LedgerRecord | None, LedgerWriter | None]:
        """Acquire, fence earlier leaders, replay, decide and write the claim (as ``state``).

        Returns the run, the claim record written (None if the decision claims nothing) and
        the open writer (None if leadership was not acquired).
        """
        if not lead.acquire(self.config.acquire_timeout):
            return self._not_leading(role, run_key), None, None
        return self._claim_as_leader(lead, role, run_key, state)

    def _claim_as_leader(
        self, lead: _Leadership, role: str, run_key: str, state: RunState
    ) -> tuple[Run, LedgerRecord | None, LedgerWriter]:
        """:meth:`_lead_and_claim` once ``lead`` leads (a held role's claims start here)."""
        # init_transactions() fences every earlier leader; a producer kept from this process's
        # last claim of the role was fenced then, and a newer leader's fence makes it fail.
        writer = self._resume(role)
        try:
            me = Claimant(self.config.deployment, lead.member)
            while True:
                replay = writer.replay()
                now = self._wall()
                latest = replay.latest(run_key)
                decision = self._decide(role, run_key, latest, me, now)
                if not decision.writes:
                    return self._run_for(role, run_key, decision, token=None), None, writer
                record = claim_record(decision, replay, run_key=run_key, me=me, now=now,
                                      policy=self.config.policy, state=state)
                lead.verify()  # by the lease at this instant, not the watchdog's last pulse
                if lead.lost is not None:
                    # Never write a claim without leadership; whoever leads now decides.
                    run = Run(role=role, run_key=run_key, deployment=self.config.deployment,
                              outcome=Outcome.WAIT, reason=f"lost leadership while deciding:"
                              f" {lead.lost}", token=None, record=decision.latest)
                    return run, None, writer
                try:
                    writer.write(record)
                except FencedError:
                    if not getattr(writer, "reused", False):
                        raise
                    # The kept producer was fenced by another leader's begin since this
                    # process's last claim; nothing was written. Fence anew and decide again.
                    log.info("role %r: the kept ledger writer was fenced by another leader"
                             " since; fencing again and deciding anew", role)
                    writer.close()
                    writer = self.ledger.begin(role)
                    continue
                break
            if decision.claims:
                self._count(role, run_key, decision.outcome)
        except BaseException:
            writer.close()
            raise
        token = record.token if decision.claims else None
        return self._run_for(role, run_key, decision, token=token), record, writer

    @contextlib.contextmanager
    def _claimed(self, lead: _Leadership, role: str, run_key: str, *,
                 let_go: Callable[[], None]) -> Iterator[Run]:
        """The block of :meth:`claim` once ``lead`` leads: decide, and hold the run for the
        block if it is ours. ``let_go`` ends the claim's hold on leadership (closes the member,
        or readies a held role for its next claim)."""
        writer: LedgerWriter | None = None
        try:
            run, record, writer = self._claim_as_leader(lead, role, run_key, RunState.RUNNING)
            if record is None or not run.should_run:
                self._release(writer, lead)
                writer = None
                let_go()  # release at once: a WAIT must not hold the claimant's executor
                yield run
                return
            with contextlib.suppress(WorkSkipped), self._hold(lead, writer, run, record):
                yield run  # a WorkSkipped ends the block: recorded COMPLETED (skipped)
            self._release(writer, lead)  # the end record is written: the claim went well
            writer = None
        finally:
            if writer is not None:
                writer.close()
            let_go()

    def _resume(self, role: str) -> LedgerWriter:
        """The role's writer for a claim: the producer kept from this process's last claim of
        the role when the ledger keeps one (``KafkaLedger.resume``), else a newly fenced one."""
        ledger = self.ledger
        if isinstance(ledger, KafkaLedger):
            return ledger.resume(role)
        return ledger.begin(role)

    @staticmethod
    def _release(writer: LedgerWriter, lead: _Leadership) -> None:
        """End a claim's writer: kept for the role's next claim while leadership holds (a
        Kafka writer that did not err), closed otherwise."""
        release = getattr(writer, "release", None)
        if lead.lost is None and release is not None:
            release()
        else:
            writer.close()

    def _busy_while_preparing(self, role: str, run_key: str) -> Run | None:
        """:meth:`_busy`, while the ledger prepares (:meth:`_warm`) on a helper thread."""
        return while_preparing(lambda: self._busy(role, run_key), lambda: self._warm(role),
                               name=f"neli-prepare-{role}")

    def _warm(self, role: str) -> None:
        """Before joining: a first replay from offset 0 runs here, not against the lease, and
        the ledger producer connects (``KafkaLedger.prepare``)."""
        ledger = self.ledger
        if isinstance(ledger, KafkaLedger):
            ledger.prepare(role)

    @contextlib.contextmanager
    def _hold(self, lead: _Leadership, writer: LedgerWriter, run: Run,
              record: LedgerRecord) -> Iterator[Run]:
        """Around the work: watchdog on; then record COMPLETED, FAILED, or raise FencedError.

        No work starts under a fenced run: once the run is attached (a fence from now on
        reaches it), leadership is checked again, so a fence that landed between the claim
        check and here (e.g. during a slow ``RUNNING`` write) fails the try before the work.
        """
        run.on_fence(lambda reason: self._metric(Metric.FENCE, run.role, run.run_key))
        held = _Held(self, writer, record)
        object.__setattr__(run, "_held", held)
        deadline = getattr(lead.neli, "leadership_deadline", None)
        object.__setattr__(run, "_lease", deadline if callable(deadline) else None)
        lead.attach(run)
        try:
            lead.verify()
            run.check()
            try:
                yield run
            except WorkSkipped as exc:
                # The work skipped itself: terminal (COMPLETED, "skipped by the task"), never
                # FAILED, which another region would take over and skip again, for ever.
                run.check()
                skipped = skipped_reason(str(exc))
                held.end(run, lambda r: r.advance(
                    RunState.COMPLETED, at=self._wall(), reason=skipped))
                raise
            except BaseException as exc:
                if isinstance(exc, FencedError):
                    raise
                run.check()  # fenced: the work failed because it was stopped; record nothing
                reason = f"{type(exc).__name__}: {exc}"[:2000]
                # what the claim inherited stays; an application the try could not stop joins
                own = exc.application if isinstance(exc, WorkNotStopped) else ""
                now = self._wall()
                held.end(run, lambda r: r.advance(
                    RunState.FAILED, at=now, reason=reason,
                    unstopped=with_application(r.unstopped, own) if own else None,
                    handoff_deadline=run._retry_deadline(now, self.config.policy.handoff_timeout)))
                raise
            run.check()
            held.end(run, lambda r: r.advance(RunState.COMPLETED, at=self._wall()))
        finally:
            held.ended = True
            lead.work_finished()

    def _write_end(self, writer: LedgerWriter, run: Run, record: LedgerRecord) -> None:
        try:
            writer.write(record)
        except FencedError as exc:
            run._fence(f"the ledger refused the {record.state} record: {exc}")
            raise FencedError(
                f"role {run.role!r} run {run.run_key!r} (token {run.token}): a newer leader"
                f" fenced this member before it could record {record.state}",
                role=run.role, token=run.token) from exc
        log.info("role %r run %r %s (token %s)", run.role, run.run_key, record.state,
                 record.token)

    def _busy(self, role: str, run_key: str) -> Run | None:
        """The answer without joining when ``role``'s group is busy; None when it is idle
        (the busy-group rule, :mod:`neli_orchestrate.singleton.busy`)."""
        members = self.role_members(role)
        if not members:
            return None
        latest = self.status(role, run_key)
        outcome, reason, until = busy_answer(role, members, latest,
                                             deployment=self.config.deployment,
                                             now=self._wall(), policy=self.config.policy)
        log.info("role %r run %r: %s: %s", role, run_key, outcome, reason)
        self._count(role, run_key, outcome)
        return Run(role=role, run_key=run_key, deployment=self.config.deployment,
                   outcome=outcome, reason=reason, token=None, record=latest, wait_until=until)

    def _not_leading(self, role: str, run_key: str) -> Run:
        latest = self.status(role, run_key)
        if latest is not None and latest.state is RunState.COMPLETED:
            outcome, reason = Outcome.SKIP_DONE, f"completed: {_describe(latest)}"
        else:
            outcome = Outcome.WAIT
            reason = (f"another member leads role {role!r} (not acquired within"
                      f" {self.config.acquire_timeout} s); latest record: {_describe(latest)}")
        log.info("role %r run %r: %s: %s", role, run_key, outcome, reason)
        self._count(role, run_key, outcome)
        return Run(role=role, run_key=run_key, deployment=self.config.deployment,
                   outcome=outcome, reason=reason, token=None, record=latest)

    def _run_for(self, role: str, run_key: str, decision: Decision, token: int | None) -> Run:
        return Run(role=role, run_key=run_key, deployment=self.config.deployment,
                   outcome=decision.outcome, reason=decision.reason, token=token,
                   record=decision.latest, wait_until=decision.wait_until)

    def _reservation(self, run: Run) -> Reservation:
        return Reservation(**{f.name: getattr(run, f.name)
                              for f in dataclasses.fields(Reservation)})

    def _metric(self, name: Metric, role: str, run_key: str | None = None, *,
                outcome: Outcome | None = None, value: float = 1.0) -> None:
        emit(self._metrics, MetricEvent(name=name, role=role, deployment=self.config.deployment,
                                        run_key=run_key, outcome=outcome, value=value))

    def _count(self, role: str, run_key: str, outcome: Outcome) -> None:
        """The metrics of one decision (a claim written, a skip, a wait, a give-up)."""
        self._metric(_OUTCOME_METRIC[outcome], role, run_key, outcome=outcome)
        if outcome is Outcome.TAKE_OVER:
            self._metric(Metric.TAKEOVER, role, run_key, outcome=outcome)

    def _decide(self, role: str, run_key: str, latest: LedgerRecord | None, me: Claimant,
                now: float) -> Decision:
        """The decision table on ``latest`` (with the other deployment's liveness where the rule
        needs it), logged; a decision that claims nothing is counted here, a claim once
        written."""
        decision = decide(latest, me, now=now, policy=self.config.policy,
                          liveness=self._liveness_of(latest, me))
        log.info("role %r run %r: %s: %s", role, run_key, decision.outcome, decision.reason)
        if not decision.claims:
            self._count(role, run_key, decision.outcome)
        return decision


_OUTCOME_METRIC = {
    Outcome.RUN: Metric.CLAIM,
    Outcome.RETRY: Metric.CLAIM,
    Outcome.TAKE_OVER: Metric.CLAIM,
    Outcome.SKIP_DONE: Metric.SKIP,
    Outcome.WAIT: Metric.WAIT,
    Outcome.GIVE_UP: Metric.GIVE_UP,
}


class _Held:
    """The claim's current record while its work runs: ``RUNNING`` updates (from any thread,
    e.g. a watcher that names the submitted application) and the end record, one at a time."""

    def __init__(self, singleton: Singleton, writer: LedgerWriter, record: LedgerRecord) -> None:
        self.singleton = singleton
        self.writer = writer
        self.record = record
        self.ended = False
        self.lock = threading.Lock()

    def update(self, run: Run, **fields: Any) -> None:
        with self.lock:
            if self.ended:
                raise RuntimeError(f"run {run.run_key!r} already ended: nothing to update")
            record = self.record.advance(RunState.RUNNING, at=self.singleton._wall(), **fields)
            self.singleton._write_end(self.writer, run, record)
            self.record = record

    def end(self, run: Run, build: Callable[[LedgerRecord], LedgerRecord]) -> None:
        with self.lock:
            self.ended = True
            self.singleton._write_end(self.writer, run, build(self.record))


def _describe(record: LedgerRecord | None) -> str:
    return "none" if record is None else record.describe()
