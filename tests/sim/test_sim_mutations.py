"""Mutation checks: a deliberately broken protocol must be caught, so the checker can fail."""

from __future__ import annotations

import pytest

from integration.sim.config import SimConfig
from integration.sim.runner import run_seed, run_seeds
from neli_orchestrate.decision import Claimant, Decision, DecisionPolicy, Outcome, decide
from neli_orchestrate.ledger.record import LedgerRecord

# mutation -> invariants that may catch it
EXPECTED = {
    "ignore_completed": {"S3", "S4"},
    "run_on_wait": {"S4"},
    "no_fencing": {"S2", "S3"},
    "token_reuse": {"S3", "S5"},
    "no_claim_check": {"S3", "S4"},
    "no_membership_proof": {"S1"},
    "no_self_fence": {"S1"},
    "hint_grants": {"S1"},
    # issue 9: the defects of the failure paths, re-introduced
    "superseded_by_own_claim": {"L1"},
    "fence_before_start_dropped": {"S7"},
    "sink_hwm_on_publish": {"S3"},
    # a newer deployment completed the run key (schema v2); deciding from the older record
    # runs it again
    "unread_unreadable": {"S3", "S4"},
    # issue 12: a host's replay checkpoint taken as the whole ledger misses later records
    "stale_replay_cache": {"S3", "L1"},
    # issue 20: a take-over on a (possibly false) GONE verdict without a new token
    "liveness_takeover_no_token": {"S3", "S5"},
    # issue 20/21: a fenced try that meets another deployment's live claim fails (uses a try)
    # instead of waiting as the gate does; a DAG run can run out of tries on WAIT
    "wait_fails_try": {"L1"},
    # issue 31: a replay takes the end offset -1001 of a partition whose leader is changing as
    # the end: token 0 over issued tokens, or the false "recreated" refusal (tokens, S5)
    "invalid_end_offset": {"S5"},
    # issue 31: riding through a stalled broker without the bound from the last proof
    "unbounded_ride_through": {"S1"},
}


@pytest.mark.parametrize("mutation", sorted(EXPECTED))
def test_broken_protocol_is_caught(mutation: str) -> None:
    summary = run_seeds(
        range(3000), SimConfig(mutation=mutation), workers=1, stop_at_first=True
    )
    assert summary.failures, f"{mutation} survived {summary.seeds} seeds: the checker is blind"
    seed, invariant, message = summary.failures[0]
    assert invariant in EXPECTED[mutation], (seed, invariant, message)
    # The failure replays from its seed alone.
    replayed = run_seed(seed, SimConfig(mutation=mutation))
    assert (replayed.invariant, replayed.message) == (invariant, message)


def test_an_injected_decision_that_never_waits_nor_skips_is_caught() -> None:
    def reckless(
        latest: LedgerRecord | None, me: Claimant, *, now: float, policy: DecisionPolicy,
        **liveness: object,
    ) -> Decision:
        attempt = 1 if latest is None else latest.attempt + 1
        return Decision(Outcome.TAKE_OVER, "always run", latest, attempt=attempt)

    for seed in range(200):
        result = run_seed(seed, decide_fn=reckless)
        if not result.ok:
            assert result.invariant in {"S3", "S4", "L1"}
            return
    pytest.fail("a decision policy that always runs was never caught")


def test_the_real_decision_passes_the_same_seeds() -> None:
    # Control for the tests above: the same seeds pass with the real code.
    for seed in range(50):
        assert run_seed(seed, decide_fn=decide).ok, seed


def test_s1_rests_on_the_lease_being_shorter_than_the_session() -> None:
    # Just inside the assumption: no overlap. Outside it (lease longer than the session
    # timeout): the coordinator hands the role over while the old leader's lease still runs.
    inside = SimConfig(heartbeat_timeout=950, rebalance_timeout=3000)
    assert run_seeds(range(300), inside, workers=1).failures == []
    outside = SimConfig(heartbeat_timeout=1300, check_assumptions=False)
    summary = run_seeds(range(300), outside, workers=1, stop_at_first=True)
    assert summary.failures and summary.failures[0][1] == "S1", summary.failures


def test_timings_that_break_the_assumptions_are_refused() -> None:
    from neli_orchestrate.errors import ConfigError

    with pytest.raises(ConfigError, match="heartbeat_timeout"):
        SimConfig(heartbeat_timeout=1000)
    with pytest.raises(ConfigError, match="rebalance_timeout"):
        SimConfig(barrier_deadline=2400)


def test_the_ride_through_rests_on_its_bound_being_below_the_session() -> None:
    # issue 31: a leader rides through broker stalls (SimConfig.broker_stall_fraction) up to
    # its last acknowledged session heartbeat + ride_through. Inside the session timeout: no
    # overlap. Beyond it: a cut-off or paused leader still leads when its successor does.
    inside = SimConfig(ride_through=950, rebalance_timeout=3000)
    assert run_seeds(range(300), inside, workers=1).failures == []
    outside = SimConfig(ride_through=1400, check_assumptions=False)
    summary = run_seeds(range(1000), outside, workers=1, stop_at_first=True)
    assert summary.failures and summary.failures[0][1] == "S1", summary.failures


def test_leaders_ride_through_broker_stalls_that_end_within_the_bound() -> None:
    # Control for the mutation above: the ride-through is exercised, and it is what keeps
    # leaders (and their work) through stalls shorter than its bound.
    stalls = {"broker_stall_fraction": 1.0, "broker_stall": (300, 600)}
    riding = run_seeds(range(300), SimConfig(**stalls), workers=1)  # type: ignore[arg-type]
    fenced = run_seeds(range(300), SimConfig(ride_through=0, **stalls),  # type: ignore[arg-type]
                       workers=1)
    assert riding.failures == [] and fenced.failures == []
    assert riding.as_dict()["fired"]["broker-stall"] > 100
    assert riding.as_dict()["fenced_tries"] < fenced.as_dict()["fenced_tries"]
