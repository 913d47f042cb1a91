"""The decision table: what a member that has just become leader does with a run key.

Usage (pure: no I/O, no clock; the caller passes ``now``)::

    policy = DecisionPolicy(handoff_timeout=300.0)
    me = Claimant(deployment="us-east-1", member=neli_member_name)
    decision = decide(replay.latest(run_key), me, now=time.time(), policy=policy)
    if decision.writes:                       # RUN, RETRY, TAKE_OVER, or GIVE_UP over a dead run
        record = claim_record(decision, replay, run_key=run_key, me=me, now=now, policy=policy)
        writer.write(record)                  # record.token goes to the work

The table (docs/internals/design.md, layer 3), for the latest record of the run key:

===========================================  ============  ================================
latest record                                outcome       writes
===========================================  ============  ================================
none, or RESET (an operator's audited reset)  RUN           claim, attempt 1
COMPLETED (also "skipped by the task")       SKIP_DONE     nothing
CLAIMED by another deployment, before its    WAIT          nothing (release leadership,
handoff deadline (+ max clock error)                       decide again later)
CLAIMED by another deployment, past it       TAKE_OVER     claim, same attempt number
CLAIMED by this deployment                   TAKE_OVER     claim (our earlier claim is void)
RUNNING (by anyone: we lead, so they don't)  TAKE_OVER     claim, attempt + 1
FAILED by this deployment                    RETRY         claim, attempt + 1
FAILED by another deployment, in its         WAIT          nothing (it retries first)
retry window (SAME_DEPLOYMENT_FIRST: the
record's handoff_deadline, else at +
handoff_timeout; Run.expect_retry)
FAILED by another deployment, past it        TAKE_OVER     claim, attempt + 1
FAILED with attempt >= max_attempts          GIVE_UP       nothing (terminal failure)
RUNNING with attempt >= max_attempts         GIVE_UP       a terminal FAILED record
CLAIMED or FAILED by another deployment      TAKE_OVER     claim (as past the deadline), at
that Kafka shows GONE (``liveness``)                       once: nobody of it is left to act
===========================================  ============  ================================

Deployment liveness (:mod:`neli_orchestrate.liveness`): ``liveness`` is what Kafka says about
the deployment of the latest record. ``GONE`` (its liveness group has had no member for longer
than its liveness timeout) ends the respect for its claim or its retry window at once;
``ALIVE`` or ``UNKNOWN`` (no information: an older version, the feature off) keep the rule
above. ``SAME_DEPLOYMENT_ONLY`` still waits: whoever chose it wants that deployment back.

A claim always carries a new token
(:attr:`neli_orchestrate.ledger.replay.Replay.next_token`), larger than every token before it,
so whatever the superseded claimant still does is refused by the ledger (fenced producer) and
by token-checked sinks.

.. note:: WAIT and the handoff window are about not wasting work, not about safety: safety
   comes from leadership, the fenced producer and the token. Wall clocks of deployments may
   differ by up to ``max_clock_error``; deadlines are only treated as passed after that margin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from neli_orchestrate.errors import ConfigError
from neli_orchestrate.ledger.record import LedgerRecord, RunState, format_epoch
from neli_orchestrate.ledger.replay import Replay
from neli_orchestrate.liveness import DeploymentLiveness

__all__ = [
    "ClaimCheck",
    "ClaimStatus",
    "Claimant",
    "Decision",
    "DecisionPolicy",
    "FailedRetry",
    "Outcome",
    "check_claim",
    "claim_record",
    "decide",
    "is_terminal",
    "reset_record",
    "skipped_by_work",
    "skipped_reason",
]

#: Reason prefix of a COMPLETED record whose work skipped itself (terminal, like any completion).
SKIPPED_BY_TASK = "skipped by the task"


def skipped_reason(detail: str) -> str:
    """The reason of the ``COMPLETED`` record written when the work skipped itself."""
    detail = detail.strip()
    return (f"{SKIPPED_BY_TASK}: {detail}" if detail else SKIPPED_BY_TASK)[:2000]


def skipped_by_work(record: LedgerRecord | None) -> bool:
    """True for a ``COMPLETED`` record whose work skipped itself (shown as such by CLI and UI)."""
    return (record is not None and record.state is RunState.COMPLETED
            and record.reason.startswith(SKIPPED_BY_TASK))


class Outcome(StrEnum):
    """What a new leader does with a run key (``run.outcome`` of a claim)."""

    #: No record: claim with a new token and run.
    RUN = "RUN"
    #: COMPLETED here or in another deployment: nothing to do.
    SKIP_DONE = "SKIP_DONE"
    #: Another deployment's claim (or first retry) is live: release leadership, decide later.
    WAIT = "WAIT"
    #: A dead or expired claim of someone else: claim again with a larger token and run.
    TAKE_OVER = "TAKE_OVER"
    #: Our deployment's run FAILED: claim again with a larger token and run.
    RETRY = "RETRY"
    #: ``max_attempts`` reached: the run key has terminally failed; do not run.
    GIVE_UP = "GIVE_UP"


class FailedRetry(StrEnum):
    """Who may run a FAILED run key again."""

    #: The failing deployment at once; another one after the handoff window (default).
    SAME_DEPLOYMENT_FIRST = "SAME_DEPLOYMENT_FIRST"
    #: Whichever deployment leads next, at once.
    ANY_DEPLOYMENT = "ANY_DEPLOYMENT"
    #: Only the failing deployment; others wait for it for ever (it must come back).
    SAME_DEPLOYMENT_ONLY = "SAME_DEPLOYMENT_ONLY"


@dataclass(frozen=True)
class DecisionPolicy:
    """Tunables of the decision table; ``handoff_timeout`` must cover executor start-up.

    - ``handoff_timeout``: seconds a CLAIMED run is reserved for its claimant's executor, and
      seconds a FAILED run is reserved for the failing deployment's retry
      (``SAME_DEPLOYMENT_FIRST``). Longer than the orchestrator's delay from gate to executor
      plus the executor's leadership acquisition.
    - ``failed_retry``: see :class:`FailedRetry`.
    - ``max_attempts``: None retries without bound; otherwise a run key whose attempt number
      reached it is terminally FAILED (:attr:`Outcome.GIVE_UP`).
    - ``max_clock_error``: bound on the difference between deployments' wall clocks.
    """

    handoff_timeout: float
    failed_retry: FailedRetry = FailedRetry.SAME_DEPLOYMENT_FIRST
    max_attempts: int | None = None
    max_clock_error: float = 0.0

    def __post_init__(self) -> None:
        for name in ("handoff_timeout", "max_clock_error"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                math.isfinite(value) and value >= 0
            ):
                raise ConfigError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
        if not isinstance(self.failed_retry, FailedRetry):
            raise ConfigError(
                f"failed_retry must be one of {', '.join(FailedRetry)}, got {self.failed_retry!r}"
            )
        if self.max_attempts is not None and (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or self.max_attempts < 1
        ):
            raise ConfigError(f"max_attempts must be None or >= 1, got {self.max_attempts!r}")


@dataclass(frozen=True)
class Claimant:
    """Who decides and writes: the orchestrator deployment and the NELI member name."""

    deployment: str
    member: str

    def __post_init__(self) -> None:
        for name in ("deployment", "member"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{name} must be a non-empty string, got {value!r}")


@dataclass(frozen=True)
class Decision:
    """The table's answer for one run key; :attr:`writes` says whether to write a record now."""

    outcome: Outcome
    reason: str
    #: The record the decision was taken on.
    latest: LedgerRecord | None
    #: Attempt number of the claim this decision makes (or of ``latest`` if it makes none).
    attempt: int
    #: WAIT: wall-clock time after which deciding again may give another answer (None: the
    #: other deployment must act first).
    wait_until: float | None = None
    #: GIVE_UP over a RUNNING record: write a terminal FAILED record for it.
    record_failure: bool = False

    @property
    def claims(self) -> bool:
        """True if the leader must write a new claim (new token) and run the work."""
        return self.outcome in (Outcome.RUN, Outcome.RETRY, Outcome.TAKE_OVER)

    @property
    def writes(self) -> bool:
        """True if the leader must write a record: a claim, or a terminal failure."""
        return self.claims or self.record_failure


def _attempts_left(attempt: int, policy: DecisionPolicy) -> bool:
    return policy.max_attempts is None or attempt < policy.max_attempts


def decide(
    latest: LedgerRecord | None, me: Claimant, *, now: float, policy: DecisionPolicy,
    liveness: DeploymentLiveness | None = None,
) -> Decision:
    """Apply the decision table to the latest record of a run key (see the module docstring).

    ``now`` is this host's wall clock (epoch seconds). Call only while leading the role, after
    ``begin()`` and a replay. ``liveness``: Kafka's reading of ``latest.deployment`` (None, or
    another deployment's: no information).
    """
    if latest is None:
        return Decision(Outcome.RUN, "no record of this run key", None, attempt=1)
    if latest.state is RunState.RESET:
        # An operator's audited reset: the run key starts over (attempt 1) under a new token.
        return Decision(
            Outcome.RUN,
            f"reset by {latest.deployment}/{latest.member} (token {latest.token}): {latest.reason}",
            latest,
            attempt=1,
        )

    state = latest.state
    who = f"{latest.deployment}/{latest.member}"
    ours = latest.deployment == me.deployment

    if state is RunState.COMPLETED:
        how = "skipped by its task" if skipped_by_work(latest) else "completed"
        return Decision(
            Outcome.SKIP_DONE,
            f"{how} by {who} with token {latest.token}",
            latest,
            attempt=latest.attempt,
        )

    if state is RunState.CLAIMED:
        if ours:
            return Decision(
                Outcome.TAKE_OVER,
                f"superseding this deployment's unstarted claim, token {latest.token}",
                latest,
                attempt=latest.attempt,
            )
        deadline = _deadline(latest, policy)
        if _gone(latest, liveness):
            return Decision(
                Outcome.TAKE_OVER,
                f"claim of {who} (token {latest.token}) is orphaned: {_said(liveness)}",
                latest,
                attempt=latest.attempt,
            )
        if now <= deadline:
            return Decision(
                Outcome.WAIT,
                f"{who} claimed it with token {latest.token}; its executor has until"
                f" {format_epoch(deadline)} to start",
                latest,
                attempt=latest.attempt,
                wait_until=deadline,
            )
        return Decision(
            Outcome.TAKE_OVER,
            f"claim of {who} (token {latest.token}) passed its handoff deadline unstarted",
            latest,
            attempt=latest.attempt,
        )

    if state is RunState.RUNNING:
        if not _attempts_left(latest.attempt, policy):
            return Decision(
                Outcome.GIVE_UP,
                f"attempt {latest.attempt} of at most {policy.max_attempts} lost its runner"
                f" {who} (token {latest.token})",
                latest,
                attempt=latest.attempt,
                record_failure=True,
            )
        return Decision(
            Outcome.TAKE_OVER,
            f"runner {who} (token {latest.token}) no longer leads the role",
            latest,
            attempt=latest.attempt + 1,
        )

    # FAILED
    if not _attempts_left(latest.attempt, policy):
        return Decision(
            Outcome.GIVE_UP,
            f"failed {latest.attempt} time(s), max_attempts={policy.max_attempts}: {latest.reason}",
            latest,
            attempt=latest.attempt,
        )
    if ours:
        return Decision(
            Outcome.RETRY,
            f"retrying this deployment's failed attempt {latest.attempt}",
            latest,
            attempt=latest.attempt + 1,
        )
    if policy.failed_retry is FailedRetry.ANY_DEPLOYMENT:
        return Decision(
            Outcome.TAKE_OVER,
            f"{who} failed attempt {latest.attempt}; any deployment may retry",
            latest,
            attempt=latest.attempt + 1,
        )
    if policy.failed_retry is FailedRetry.SAME_DEPLOYMENT_ONLY:
        return Decision(
            Outcome.WAIT,
            f"{who} failed attempt {latest.attempt}; only {latest.deployment} may retry it",
            latest,
            attempt=latest.attempt,
        )
    if _gone(latest, liveness):
        return Decision(
            Outcome.TAKE_OVER,
            f"{who} failed attempt {latest.attempt} and cannot retry it: {_said(liveness)}",
            latest,
            attempt=latest.attempt + 1,
        )
    deadline = _deadline(latest, policy)
    if now <= deadline:
        return Decision(
            Outcome.WAIT,
            f"{who} failed attempt {latest.attempt} and retries first, until"
            f" {format_epoch(deadline)}",
            latest,
            attempt=latest.attempt,
            wait_until=deadline,
        )
    return Decision(
        Outcome.TAKE_OVER,
        f"{who} failed attempt {latest.attempt} and did not retry within the handoff window",
        latest,
        attempt=latest.attempt + 1,
    )


def _gone(record: LedgerRecord, liveness: DeploymentLiveness | None) -> bool:
    return (liveness is not None and liveness.deployment == record.deployment
            and liveness.gone)


def _said(liveness: DeploymentLiveness | None) -> str:
    return "Kafka shows no deployment" if liveness is None else liveness.describe()


def _deadline(record: LedgerRecord, policy: DecisionPolicy) -> float:
    base = record.handoff_deadline
    if base is None:
        base = record.at + policy.handoff_timeout
    return base + policy.max_clock_error


def is_terminal(record: LedgerRecord | None, policy: DecisionPolicy) -> bool:
    """True if the run key is finished for good: COMPLETED, or FAILED with no attempts left."""
    if record is None:
        return False
    if record.state is RunState.COMPLETED:
        return True
    return record.state is RunState.FAILED and not _attempts_left(record.attempt, policy)


def claim_record(
    decision: Decision,
    replay: Replay,
    *,
    run_key: str,
    me: Claimant,
    now: float,
    policy: DecisionPolicy,
    state: RunState = RunState.CLAIMED,
) -> LedgerRecord:
    """The record a :attr:`Decision.writes` decision writes, with token ``replay.next_token``.

    ``state`` is ``CLAIMED`` for the split form (gate, with a handoff deadline) or ``RUNNING``
    when the claimant runs the work itself. A GIVE_UP over a dead run gives a terminal
    ``FAILED`` record instead. ``replay`` must come from :meth:`LedgerWriter.replay` after
    ``begin()``, or the token would not be fenced (``LedgerError``).
    """
    if not decision.writes:
        raise ValueError(f"a {decision.outcome} decision writes no record")
    if state not in (RunState.CLAIMED, RunState.RUNNING):
        raise ValueError(f"a claim is written as CLAIMED or RUNNING, not {state}")
    if decision.latest is not None and decision.latest.run_key != run_key:
        raise ValueError(f"decision was taken on {decision.latest.run_key!r}, not {run_key!r}")
    token = replay.next_token
    unstopped = may_still_run(decision.latest)
    if decision.record_failure:
        return LedgerRecord(
            role=replay.role,
            run_key=run_key,
            state=RunState.FAILED,
            token=token,
            deployment=me.deployment,
            member=me.member,
            attempt=decision.attempt,
            at=now,
            reason=decision.reason,
            unstopped=unstopped,
        )
    return LedgerRecord(
        role=replay.role,
        run_key=run_key,
        state=state,
        token=token,
        deployment=me.deployment,
        member=me.member,
        attempt=decision.attempt,
        at=now,
        reason=f"{decision.outcome}: {decision.reason}",
        handoff_deadline=now + policy.handoff_timeout if state is RunState.CLAIMED else None,
        unstopped=unstopped,
    )


def may_still_run(record: LedgerRecord | None) -> tuple[str, ...]:
    """The remote applications a new claim over ``record`` inherits as possibly still running.

    ``record``'s own ``unstopped`` (failed tries' unconfirmed kills, or ones carried from
    earlier claims that no try stopped), and the application a ``RUNNING`` record named: that
    try never recorded how it ended (its process died, or it was fenced), so its application
    may run on. The application of a ``FAILED`` try that confirmed it stopped, or of a
    ``COMPLETED`` one, is not inherited. The new claim's try stops them before it submits its
    own (docs/guide/spark.md).
    """
    if record is None:
        return ()
    if record.state is RunState.RUNNING and record.application:
        return with_application(record.unstopped, record.application)
    return record.unstopped


def with_application(applications: tuple[str, ...], application: str) -> tuple[str, ...]:
    """``applications`` and ``application``, each once, in order."""
    return applications if application in applications else (*applications, application)


def reset_record(
    latest: LedgerRecord | None,
    replay: Replay,
    *,
    run_key: str,
    me: Claimant,
    now: float,
    reason: str,
) -> LedgerRecord:
    """The audited ``RESET`` record of :meth:`neli_orchestrate.Singleton.reset`.

    The decision table treats it as "no record" (the next leader runs the run key again,
    attempt 1), but it carries a new token like a claim, so tokens keep growing and every
    earlier claimant stays refused by the ledger and by token-checked sinks. Only a finished
    run key (``COMPLETED`` or ``FAILED``) may be reset; a ``CLAIMED`` or ``RUNNING`` one is in
    progress (:class:`ValueError` says so). ``replay`` must be a writer's replay after
    ``begin()``.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise ConfigError("a reset needs a reason (who asks, and why), for the audit trail")
    if latest is not None and latest.run_key != run_key:
        raise ValueError(f"record is of {latest.run_key!r}, not {run_key!r}")
    if latest is None or latest.state is RunState.RESET:
        raise ValueError(
            f"run {run_key!r} of role {replay.role!r} has nothing to reset"
            f" ({'no record' if latest is None else 'already reset'}): its next run starts over"
        )
    if latest.state in (RunState.CLAIMED, RunState.RUNNING):
        raise ValueError(
            f"run {run_key!r} of role {replay.role!r} is in progress ({latest.state} by"
            f" {latest.deployment}/{latest.member}, token {latest.token}): let it finish or"
            " fail, then reset it"
        )
    return LedgerRecord(
        role=replay.role,
        run_key=run_key,
        state=RunState.RESET,
        token=replay.next_token,
        deployment=me.deployment,
        member=me.member,
        attempt=1,
        at=now,
        reason=reason.strip()[:2000],
        unstopped=latest.unstopped,
    )


class ClaimStatus(StrEnum):
    """Where a claim (token) handed to an executor stands; the executor acts on it.

    Only :attr:`OURS` lets the executor start under the handed token; :attr:`COMPLETED`
    skips; :attr:`MISSING` and :attr:`FOREIGN` refuse (the token or the ledger is wrong).
    Every other status means the run key moved on since the token was issued (a retry, a
    re-run gate, a fence, another deployment's take-over): the executor decides again from
    the ledger (:func:`decide`), as any leader would, and runs only under a new, larger token.
    """

    #: The latest record is our CLAIMED record: go ahead (write RUNNING with the same token).
    OURS = "OURS"
    #: A newer record of *this* deployment (an earlier try's re-claim, a re-run gate) is the
    #: latest: not someone else's; decide again.
    OWN_LATER = "OWN_LATER"
    #: A newer record of another deployment (a take-over, a retry) is the latest: decide
    #: again (WAIT while its claim is live; a dead one is taken over).
    SUPERSEDED = "SUPERSEDED"
    #: The run key is COMPLETED (by our token earlier, or by another claim): do not run.
    COMPLETED = "COMPLETED"
    #: Our claim's attempt already ended FAILED: decide again (retry) instead of reusing it.
    FAILED = "FAILED"
    #: An earlier execution of our claim started (RUNNING) and lost leadership: do not run
    #: it again under the same token; decide again (TAKE_OVER gives a new, larger token).
    INTERRUPTED = "INTERRUPTED"
    #: The ledger has no record of the run key: the claim was never written, or expired.
    MISSING = "MISSING"
    #: The token is not one this ledger issued for the run key (e.g. above every token in it,
    #: or belongs to another deployment): refuse, the token or the ledger is wrong.
    FOREIGN = "FOREIGN"


@dataclass(frozen=True)
class ClaimCheck:
    """Answer of :func:`check_claim`; ``ok`` means the executor may (still) run."""

    status: ClaimStatus
    reason: str
    latest: LedgerRecord | None

    @property
    def ok(self) -> bool:
        """True only for :attr:`ClaimStatus.OURS`."""
        return self.status is ClaimStatus.OURS

    @property
    def decide_again(self) -> bool:
        """True if the run key moved on since the token was issued: apply :func:`decide`."""
        return self.status in _DECIDE_AGAIN


_DECIDE_AGAIN = frozenset(
    {ClaimStatus.OWN_LATER, ClaimStatus.SUPERSEDED, ClaimStatus.FAILED, ClaimStatus.INTERRUPTED}
)


def check_claim(token: int, latest: LedgerRecord | None, me: Claimant | None = None) -> ClaimCheck:
    """Where does the claim with ``token`` stand? (executor; see :class:`ClaimStatus`)

    Call after re-acquiring leadership, ``begin()`` and a replay; only :attr:`ClaimStatus.OURS`
    allows the executor to write RUNNING (``latest.advance(RunState.RUNNING, ...)``) under
    ``token``; :attr:`ClaimCheck.decide_again` sends it to :func:`decide`. ``me`` (if given)
    must be of the claimant's deployment; without it a newer record counts as SUPERSEDED.
    """
    if latest is None:
        return ClaimCheck(ClaimStatus.MISSING, "no ledger record of this run key", None)
    who = f"{latest.deployment}/{latest.member}"
    if latest.state is RunState.COMPLETED:
        by = "by our claim" if latest.token == token else f"by {who} with token {latest.token}"
        return ClaimCheck(ClaimStatus.COMPLETED, f"already completed {by}", latest)
    if latest.token > token:
        if me is not None and latest.deployment == me.deployment:
            return ClaimCheck(
                ClaimStatus.OWN_LATER,
                f"this deployment's own later record is the latest ({latest.state}, token"
                f" {latest.token}, attempt {latest.attempt}): deciding again",
                latest,
            )
        return ClaimCheck(
            ClaimStatus.SUPERSEDED,
            f"superseded by token {latest.token} of {latest.deployment} ({latest.state})",
            latest,
        )
    if latest.token < token:
        return ClaimCheck(
            ClaimStatus.FOREIGN,
            f"token {token} is above the run key's latest token {latest.token}: it was not"
            " issued by this ledger (wrong token passed, or the ledger topic was recreated)",
            latest,
        )
    if me is not None and me.deployment != latest.deployment:
        return ClaimCheck(
            ClaimStatus.FOREIGN,
            f"token {token} belongs to deployment {latest.deployment}, not {me.deployment}",
            latest,
        )
    if latest.state is RunState.RESET:
        return ClaimCheck(
            ClaimStatus.FOREIGN,
            f"token {token} is a reset record's, not a claim's: pass the gate's token", latest,
        )
    if latest.state is RunState.FAILED:
        return ClaimCheck(
            ClaimStatus.FAILED,
            f"attempt {latest.attempt} of this claim already failed: {latest.reason}",
            latest,
        )
    if latest.state is RunState.RUNNING:
        # Two executions under one token could not be told apart by a token-checked sink.
        return ClaimCheck(
            ClaimStatus.INTERRUPTED,
            f"claim {token} already started running on {who} and lost leadership; decide again"
            " for a new token",
            latest,
        )
    return ClaimCheck(ClaimStatus.OURS, f"claim {token} is current (CLAIMED)", latest)
