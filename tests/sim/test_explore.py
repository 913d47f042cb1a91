"""Bounded exhaustive exploration: every interleaving of a small scope keeps the invariants,
and the mutations the seeded simulation catches are caught here too
(docs/internals/simulation.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from integration.sim.explore import EXPLORE_MUTATIONS, Scope, explore


def test_every_interleaving_of_two_deployments_two_run_keys_two_faults_keeps_the_invariants(
) -> None:
    scope = Scope()  # 2 deployments, 1 role, 2 run keys, <= 2 faults, depth 12
    assert (scope.deployments, scope.run_keys, scope.faults) == (2, 2, 2)
    result = explore(scope)
    print("\n" + result.text())
    assert result.violation is None, result.text()
    assert result.complete and result.depth == scope.depth
    assert result.states > 100_000  # the scope was explored, not cut short
    # every fault kind happened, at every reachable point of the depth
    assert all(result.fired.get(kind, 0) > 0 for kind in ("crash", "pause", "lost"))


# mutation -> (scope, invariants that may catch it)
CAUGHT: dict[str, tuple[Scope, set[str]]] = {
    # issue 20: a take-over on a GONE verdict without a new token, with only liveness losses
    # (the deployment whose claim is taken over keeps running: a false verdict)
    "liveness_takeover_no_token": (Scope(fault_kinds=("liveness_loss",)), {"S3", "S5"}),
    "token_reuse": (Scope(), {"S3", "S5"}),
    "run_on_wait": (Scope(), {"S4"}),
    # the late executor that skips its claim check needs a deeper path: one run key
    "no_claim_check": (Scope(run_keys=1, depth=18), {"S3", "S4", "S5"}),
}


@pytest.mark.parametrize("mutation", EXPLORE_MUTATIONS)
def test_the_exploration_catches_each_mutation(mutation: str) -> None:
    scope, invariants = CAUGHT[mutation]
    result = explore(replace(scope, mutation=mutation))
    assert result.violation is not None, f"{mutation} survived: {result.text()}"
    assert result.violation.split(":")[0] in invariants, result.text()
    if mutation == "liveness_takeover_no_token":
        assert any("liveness heartbeats lost" in step for step in result.trace)
        assert not any("paused" in step or "crashes" in step for step in result.trace)
    if scope != Scope():  # the default scope's control is the test above
        assert explore(scope).violation is None  # the real protocol passes the same scope
