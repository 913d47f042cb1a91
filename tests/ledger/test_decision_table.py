"""The decision table of neli_orchestrate/decision.py, one test per row, the claim check, and a
stateful model."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from neli_orchestrate.decision import (
    Claimant,
    ClaimStatus,
    DecisionPolicy,
    FailedRetry,
    Outcome,
    check_claim,
    claim_record,
    decide,
    is_terminal,
    reset_record,
    skipped_by_work,
    skipped_reason,
)
from neli_orchestrate.errors import ConfigError
from neli_orchestrate.ledger.record import LedgerRecord, RunState
from neli_orchestrate.ledger.replay import Replay, ReplayBuilder
from neli_orchestrate.liveness import DeploymentLiveness, Liveness

NOW = 1_736_000_000.0
POLICY = DecisionPolicy(handoff_timeout=60.0)
US = Claimant("us-east-1", "us-member")
EU = Claimant("eu-west-1", "eu-member")


def rec(state: RunState, who: Claimant = EU, *, token: int = 10, attempt: int = 1,
        at: float = NOW - 10, deadline: float | None = None) -> LedgerRecord:
    if deadline is None and state is RunState.CLAIMED:
        deadline = at + POLICY.handoff_timeout
    return LedgerRecord(
        role="daily_flights", run_key="2013-01-05", state=state, token=token,
        deployment=who.deployment, member=who.member, attempt=attempt, at=at,
        handoff_deadline=deadline,
    )


def fenced_replay(end_offset: int = 20, *records: LedgerRecord) -> Replay:
    builder = ReplayBuilder("daily_flights")
    for offset, r in enumerate(records):
        builder.add(r.key, r.encode(), offset)
    return builder.build(end_offset, fenced=True)


# -- one test per row ------------------------------------------------------------------------


def test_no_record_runs_with_attempt_one() -> None:
    decision = decide(None, US, now=NOW, policy=POLICY)
    assert (decision.outcome, decision.attempt, decision.claims) == (Outcome.RUN, 1, True)


@pytest.mark.parametrize("who", [US, EU])
def test_completed_is_skipped_whoever_completed_it(who: Claimant) -> None:
    decision = decide(rec(RunState.COMPLETED, who), US, now=NOW, policy=POLICY)
    assert decision.outcome is Outcome.SKIP_DONE and not decision.writes


@pytest.mark.parametrize("who", [US, EU])
@pytest.mark.parametrize("at", [NOW - 10, NOW - 10_000])
def test_a_run_its_work_skipped_is_done_for_every_deployment_forever(
    who: Claimant, at: float
) -> None:
    running = rec(RunState.RUNNING, who, at=at - 1)
    skipped = running.advance(RunState.COMPLETED, at=at, reason=skipped_reason("exit code 99"))
    assert skipped_by_work(skipped) and skipped.reason == "skipped by the task: exit code 99"
    assert is_terminal(skipped, POLICY)
    for me in (US, EU):  # neither the skipping deployment nor another one runs it again
        decision = decide(skipped, me, now=NOW, policy=POLICY)
        assert decision.outcome is Outcome.SKIP_DONE and not decision.writes
        assert "skipped by its task" in decision.reason
    assert not skipped_by_work(running.advance(RunState.COMPLETED, at=at))
    assert not skipped_by_work(running.advance(RunState.FAILED, at=at, reason="skipped by x"))


# -- deployment liveness -----------------------------------------------------------------------

GONE = DeploymentLiveness(EU.deployment, Liveness.GONE, timeout=6.0)
ALIVE = DeploymentLiveness(EU.deployment, Liveness.ALIVE, members=1, since=NOW - 3600)
UNKNOWN = DeploymentLiveness(EU.deployment, Liveness.UNKNOWN)


def test_a_gone_deployments_live_claim_is_taken_over_at_once_with_a_new_token() -> None:
    claim = rec(RunState.CLAIMED, EU, at=NOW - 1, attempt=2)
    decision = decide(claim, US, now=NOW, policy=POLICY, liveness=GONE)
    assert (decision.outcome, decision.attempt) == (Outcome.TAKE_OVER, 2)
    assert "GONE" in decision.reason
    record = claim_record(decision, fenced_replay(30, claim), run_key=claim.run_key, me=US,
                          now=NOW, policy=POLICY)
    assert record.token == 30 > claim.token


@pytest.mark.parametrize("liveness", [ALIVE, UNKNOWN, None,
                                      DeploymentLiveness("ap-south-1", Liveness.GONE)])
def test_a_live_or_unknown_deployments_claim_is_still_respected_for_the_handoff_window(
    liveness: DeploymentLiveness | None
) -> None:
    claim = rec(RunState.CLAIMED, EU, at=NOW - 1)
    decision = decide(claim, US, now=NOW, policy=POLICY, liveness=liveness)
    assert decision.outcome is Outcome.WAIT and decision.wait_until == claim.handoff_deadline
    failed = rec(RunState.FAILED, EU, at=NOW - 1)
    assert decide(failed, US, now=NOW, policy=POLICY, liveness=liveness).outcome is Outcome.WAIT


def test_a_gone_deployments_failure_is_retried_elsewhere_at_once_within_the_attempt_limit(
) -> None:
    failed = rec(RunState.FAILED, EU, at=NOW - 1, attempt=1)
    decision = decide(failed, US, now=NOW, policy=POLICY, liveness=GONE)
    assert (decision.outcome, decision.attempt) == (Outcome.TAKE_OVER, 2)
    limited = DecisionPolicy(handoff_timeout=60.0, max_attempts=1)
    assert decide(failed, US, now=NOW, policy=limited, liveness=GONE).outcome is Outcome.GIVE_UP
    only = DecisionPolicy(handoff_timeout=60.0, failed_retry=FailedRetry.SAME_DEPLOYMENT_ONLY)
    assert decide(failed, US, now=NOW, policy=only, liveness=GONE).outcome is Outcome.WAIT


def test_liveness_changes_nothing_for_our_own_records_running_or_completed() -> None:
    mine_gone = DeploymentLiveness(US.deployment, Liveness.GONE)
    for state, outcome in ((RunState.CLAIMED, Outcome.TAKE_OVER), (RunState.FAILED, Outcome.RETRY),
                           (RunState.RUNNING, Outcome.TAKE_OVER),
                           (RunState.COMPLETED, Outcome.SKIP_DONE)):
        assert decide(rec(state, US), US, now=NOW, policy=POLICY,
                      liveness=mine_gone).outcome is outcome
    assert decide(rec(RunState.COMPLETED, EU), US, now=NOW, policy=POLICY,
                  liveness=GONE).outcome is Outcome.SKIP_DONE


def test_another_deployments_live_claim_means_wait_until_its_deadline() -> None:
    claim = rec(RunState.CLAIMED, EU, at=NOW - 10)
    decision = decide(claim, US, now=NOW, policy=POLICY)
    assert decision.outcome is Outcome.WAIT and not decision.writes
    assert decision.wait_until == claim.handoff_deadline


def test_another_deployments_claim_past_its_handoff_deadline_is_taken_over() -> None:
    claim = rec(RunState.CLAIMED, EU, at=NOW - 61)
    decision = decide(claim, US, now=NOW, policy=POLICY)
    assert decision.outcome is Outcome.TAKE_OVER and decision.claims
    assert decision.attempt == 1  # the superseded claim never started its work


def test_the_handoff_deadline_allows_for_clock_error() -> None:
    claim = rec(RunState.CLAIMED, EU, at=NOW - 61)  # deadline passed by 1 s on our clock
    careful = DecisionPolicy(handoff_timeout=60.0, max_clock_error=2.0)
    assert decide(claim, US, now=NOW, policy=careful).outcome is Outcome.WAIT
    assert decide(claim, US, now=NOW + 1.5, policy=careful).outcome is Outcome.TAKE_OVER


def test_our_own_deployments_unstarted_claim_is_superseded() -> None:
    decision = decide(rec(RunState.CLAIMED, US), US, now=NOW, policy=POLICY)
    assert decision.outcome is Outcome.TAKE_OVER and decision.claims


@pytest.mark.parametrize("who", [US, EU, Claimant("us-east-1", "us-other-member")])
def test_running_by_anyone_is_taken_over_because_we_lead_now(who: Claimant) -> None:
    decision = decide(rec(RunState.RUNNING, who, attempt=1), US, now=NOW, policy=POLICY)
    assert decision.outcome is Outcome.TAKE_OVER
    assert decision.attempt == 2


def test_our_failed_run_is_retried_at_once() -> None:
    decision = decide(rec(RunState.FAILED, US, attempt=1), US, now=NOW, policy=POLICY)
    assert (decision.outcome, decision.attempt) == (Outcome.RETRY, 2)


def test_another_deployments_failure_waits_for_its_own_retry_first() -> None:
    failed = rec(RunState.FAILED, EU, at=NOW - 10)
    decision = decide(failed, US, now=NOW, policy=POLICY)
    assert decision.outcome is Outcome.WAIT
    assert decision.wait_until == failed.at + POLICY.handoff_timeout


def test_another_deployments_failure_is_taken_over_after_the_handoff_window() -> None:
    failed = rec(RunState.FAILED, EU, at=NOW - 61)
    decision = decide(failed, US, now=NOW, policy=POLICY)
    assert (decision.outcome, decision.attempt) == (Outcome.TAKE_OVER, 2)


def test_failed_retry_window_comes_from_the_record_when_it_has_one() -> None:
    failed = rec(RunState.FAILED, EU, at=NOW - 61, deadline=NOW + 5)
    assert decide(failed, US, now=NOW, policy=POLICY).outcome is Outcome.WAIT


def test_any_deployment_may_retry_at_once_when_configured() -> None:
    policy = DecisionPolicy(handoff_timeout=60.0, failed_retry=FailedRetry.ANY_DEPLOYMENT)
    failed = rec(RunState.FAILED, EU, at=NOW - 1)
    assert decide(failed, US, now=NOW, policy=policy).outcome is Outcome.TAKE_OVER


def test_only_the_failing_deployment_retries_when_configured() -> None:
    policy = DecisionPolicy(handoff_timeout=60.0, failed_retry=FailedRetry.SAME_DEPLOYMENT_ONLY)
    failed = rec(RunState.FAILED, EU, at=NOW - 3600)
    decision = decide(failed, US, now=NOW, policy=policy)
    assert decision.outcome is Outcome.WAIT and decision.wait_until is None
    assert decide(failed, EU, now=NOW, policy=policy).outcome is Outcome.RETRY


def test_failed_with_no_attempts_left_is_a_terminal_failure() -> None:
    policy = DecisionPolicy(handoff_timeout=60.0, max_attempts=3)
    failed = rec(RunState.FAILED, US, attempt=3)
    decision = decide(failed, US, now=NOW, policy=policy)
    assert decision.outcome is Outcome.GIVE_UP and not decision.writes
    assert is_terminal(failed, policy)
    assert not is_terminal(rec(RunState.FAILED, US, attempt=2), policy)


def test_a_runner_lost_at_the_last_attempt_is_recorded_as_terminal_failure() -> None:
    policy = DecisionPolicy(handoff_timeout=60.0, max_attempts=2)
    running = rec(RunState.RUNNING, EU, attempt=2, token=10)
    decision = decide(running, US, now=NOW, policy=policy)
    assert decision.outcome is Outcome.GIVE_UP and decision.record_failure and decision.writes
    failed = claim_record(decision, fenced_replay(20, running), run_key="2013-01-05", me=US,
                          now=NOW, policy=policy)
    assert failed.state is RunState.FAILED and failed.token == 20 and failed.attempt == 2
    assert is_terminal(failed, policy)
    assert decide(failed, EU, now=NOW, policy=policy).outcome is Outcome.GIVE_UP


# -- claim records and the claim check -------------------------------------------------------


def test_claim_record_carries_the_fenced_replays_token_and_a_handoff_deadline() -> None:
    decision = decide(None, US, now=NOW, policy=POLICY)
    claim = claim_record(decision, fenced_replay(42), run_key="2013-01-05", me=US, now=NOW,
                         policy=POLICY)
    assert (claim.state, claim.token, claim.deployment, claim.member) == (
        RunState.CLAIMED, 42, "us-east-1", "us-member"
    )
    assert claim.handoff_deadline == NOW + POLICY.handoff_timeout
    running = claim_record(decision, fenced_replay(42), run_key="2013-01-05", me=US, now=NOW,
                           policy=POLICY, state=RunState.RUNNING)
    assert running.state is RunState.RUNNING and running.handoff_deadline is None


def test_claim_record_refuses_decisions_that_write_nothing() -> None:
    decision = decide(rec(RunState.COMPLETED), US, now=NOW, policy=POLICY)
    with pytest.raises(ValueError, match="writes no record"):
        claim_record(decision, fenced_replay(), run_key="2013-01-05", me=US, now=NOW,
                     policy=POLICY)


def test_check_claim_ours_only_while_our_claim_is_unstarted() -> None:
    assert check_claim(10, rec(RunState.CLAIMED, US, token=10), US).status is ClaimStatus.OURS
    assert check_claim(10, rec(RunState.CLAIMED, US, token=10), US).ok


def test_check_claim_refuses_to_run_an_interrupted_claim_again_under_the_same_token() -> None:
    check = check_claim(10, rec(RunState.RUNNING, US, token=10), US)
    assert check.status is ClaimStatus.INTERRUPTED and not check.ok


def test_check_claim_superseded_names_the_new_token_and_deployment() -> None:
    check = check_claim(10, rec(RunState.CLAIMED, EU, token=14), US)
    assert check.status is ClaimStatus.SUPERSEDED and not check.ok
    assert "14" in check.reason and "eu-west-1" in check.reason


@pytest.mark.parametrize("state", [RunState.CLAIMED, RunState.RUNNING, RunState.FAILED])
def test_check_claim_own_later_records_are_not_someone_elses(state: RunState) -> None:
    """Issue 9 item 1: a retry holding the gate's token meets its own deployment's re-claim."""
    check = check_claim(10, rec(state, US, token=14, attempt=2), US)
    assert check.status is ClaimStatus.OWN_LATER and check.decide_again and not check.ok
    assert "own" in check.reason and "14" in check.reason


@pytest.mark.parametrize("status", list(ClaimStatus))
def test_check_claim_only_missing_foreign_completed_and_ours_do_not_decide_again(
    status: ClaimStatus,
) -> None:
    # the executor's three answers: run under the token, stop (skip or refuse), decide again
    stop = {ClaimStatus.OURS, ClaimStatus.COMPLETED, ClaimStatus.MISSING, ClaimStatus.FOREIGN}
    from neli_orchestrate.decision import ClaimCheck

    assert ClaimCheck(status, "", None).decide_again is (status not in stop)


def test_an_executor_deciding_again_on_its_own_later_records_runs_or_retries() -> None:
    """What Singleton.execute does with OWN_LATER: the table, as any leader would apply it."""
    for state, outcome in [(RunState.FAILED, Outcome.RETRY), (RunState.RUNNING, Outcome.TAKE_OVER),
                           (RunState.CLAIMED, Outcome.TAKE_OVER)]:
        decision = decide(rec(state, US, token=14, attempt=2), US, now=NOW, policy=POLICY)
        assert decision.outcome is outcome and decision.claims


def test_reset_reads_as_no_record_and_its_token_is_a_fresh_offset() -> None:
    done = rec(RunState.COMPLETED, EU, token=10, attempt=2)
    replay = fenced_replay(20, done)
    reset = reset_record(done, replay, run_key=done.run_key, me=US, now=NOW, reason="alice")
    assert (reset.state, reset.token, reset.attempt, reset.reason) == (RunState.RESET, 20, 1,
                                                                       "alice")
    decision = decide(reset, EU, now=NOW, policy=POLICY)
    assert (decision.outcome, decision.attempt, decision.claims) == (Outcome.RUN, 1, True)
    assert "alice" in decision.reason and not is_terminal(reset, POLICY)
    claim = claim_record(decision, fenced_replay(21, done, reset), run_key=done.run_key, me=EU,
                         now=NOW, policy=POLICY)
    assert claim.token > reset.token, "tokens keep growing across a reset"
    assert check_claim(10, reset, US).decide_again, "an old try decides again after a reset"
    assert check_claim(20, reset, US).status is ClaimStatus.FOREIGN
    # the wire form round-trips
    assert LedgerRecord.decode(reset.encode(), key=reset.key) == reset


@pytest.mark.parametrize("state", [RunState.CLAIMED, RunState.RUNNING])
def test_reset_refuses_a_run_in_progress(state: RunState) -> None:
    with pytest.raises(ValueError, match="in progress"):
        reset_record(rec(state, EU), fenced_replay(), run_key="2013-01-05", me=US, now=NOW,
                     reason="alice")
    with pytest.raises(ConfigError, match="reason"):
        reset_record(rec(RunState.FAILED, EU), fenced_replay(), run_key="2013-01-05", me=US,
                     now=NOW, reason="")


def test_check_claim_completed_elsewhere_or_by_us() -> None:
    assert check_claim(10, rec(RunState.COMPLETED, EU, token=14)).status is ClaimStatus.COMPLETED
    assert check_claim(10, rec(RunState.COMPLETED, US, token=10)).status is ClaimStatus.COMPLETED


def test_check_claim_missing_failed_and_foreign() -> None:
    assert check_claim(10, None).status is ClaimStatus.MISSING
    assert check_claim(10, rec(RunState.FAILED, US, token=10), US).status is ClaimStatus.FAILED
    assert check_claim(12, rec(RunState.CLAIMED, US, token=10), US).status is ClaimStatus.FOREIGN
    assert check_claim(10, rec(RunState.CLAIMED, EU, token=10), US).status is ClaimStatus.FOREIGN


@pytest.mark.parametrize(
    "kwargs",
    [
        {"handoff_timeout": -1},
        {"handoff_timeout": float("nan")},
        {"handoff_timeout": 1, "max_attempts": 0},
        {"handoff_timeout": 1, "max_clock_error": -0.5},
        {"handoff_timeout": 1, "failed_retry": "sometimes"},
    ],
)
def test_invalid_policy_is_a_config_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        DecisionPolicy(**kwargs)  # type: ignore[arg-type]


# -- stateful model --------------------------------------------------------------------------

DEPLOYMENTS = [Claimant(f"d{i}", f"d{i}-member") for i in range(3)]


class LedgerOfOneRunKey(RuleBasedStateMachine):
    """Leaders of several deployments take turns on one run key through the real code.

    Whoever leads replays (the ledger's latest record and the end offset as token), decides,
    writes what the decision says, and executors verify their claims before running. The
    invariants are the ledger's promises: at most one COMPLETED, tokens of claims strictly
    increasing, nothing runs on a superseded claim, a terminal run key stays terminal.
    """

    def __init__(self) -> None:
        super().__init__()
        self.policy = DecisionPolicy(handoff_timeout=60.0, max_attempts=4, max_clock_error=1.0)
        self.log: list[LedgerRecord] = []
        self.now = NOW
        self.claims: list[tuple[int, Claimant]] = []  # tokens handed to executors
        self.running: tuple[int, Claimant] | None = None
        self.completed = 0
        self.executions: list[int] = []

    def replay(self) -> Replay:
        builder = ReplayBuilder("daily_flights")
        for offset, r in enumerate(self.log):
            builder.add(r.key, r.encode(), offset)
        return builder.build(len(self.log), fenced=True)

    def latest(self) -> LedgerRecord | None:
        return self.replay().latest("2013-01-05")

    @rule(seconds=st.floats(min_value=0, max_value=90))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @rule(who=st.sampled_from(DEPLOYMENTS), state=st.sampled_from([RunState.CLAIMED,
                                                                   RunState.RUNNING]))
    def a_gate_leads_and_decides(self, who: Claimant, state: RunState) -> None:
        self.running = None  # whoever ran before lost leadership: we lead now
        replay = self.replay()
        latest = replay.latest("2013-01-05")
        decision = decide(latest, who, now=self.now, policy=self.policy)
        if latest is not None and is_terminal(latest, self.policy):
            assert not decision.claims
        if decision.writes:
            new = claim_record(decision, replay, run_key="2013-01-05", me=who, now=self.now,
                               policy=self.policy, state=state)
            self.log.append(new)
            if decision.claims:
                self.claims.append((new.token, who))
                if state is RunState.RUNNING:
                    self.running = (new.token, who)
                    self.executions.append(new.token)

    @precondition(lambda self: self.claims)
    @rule(pick=st.integers(min_value=0, max_value=50))
    def an_executor_verifies_its_claim(self, pick: int) -> None:
        token, who = self.claims[pick % len(self.claims)]
        self.running = None
        latest = self.latest()
        check = check_claim(token, latest, who)
        if check.ok:
            assert latest is not None and latest.token == token
            assert token == max(t for t, _ in self.claims)  # only the newest claim may run
            self.log.append(latest.advance(RunState.RUNNING, at=self.now, member=who.member))
            self.running = (token, who)
            self.executions.append(token)

    @precondition(lambda self: self.running is not None)
    @rule(success=st.booleans())
    def the_work_ends(self, success: bool) -> None:
        assert self.running is not None
        token, who = self.running
        latest = self.latest()
        assert latest is not None and latest.token == token and latest.state is RunState.RUNNING
        if success:
            self.log.append(latest.advance(RunState.COMPLETED, at=self.now))
            self.completed += 1
        else:
            self.log.append(latest.advance(
                RunState.FAILED, at=self.now, reason="boom",
                handoff_deadline=self.now + self.policy.handoff_timeout,
            ))
        self.running = None

    @invariant()
    def at_most_one_completed(self) -> None:
        assert sum(r.state is RunState.COMPLETED for r in self.log) == self.completed <= 1

    @invariant()
    def claim_tokens_strictly_increase(self) -> None:
        tokens = [t for t, _ in self.claims]
        assert tokens == sorted(set(tokens))

    @invariant()
    def nothing_follows_completion(self) -> None:
        states = [r.state for r in self.log]
        if RunState.COMPLETED in states:
            assert states[-1] is RunState.COMPLETED

    @invariant()
    def attempts_are_bounded(self) -> None:
        assert all(r.attempt <= self.policy.max_attempts for r in self.log)  # type: ignore[operator]


TestLedgerOfOneRunKey = LedgerOfOneRunKey.TestCase
TestLedgerOfOneRunKey.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
