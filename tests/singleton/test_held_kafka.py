"""A held role (Singleton.hold) against the real broker, under both group protocols.

One member stays in the role's group for every claim of the hold; another deployment finds the
group busy and answers from the ledger without joining; once the hold ends, it leads and
claims under a larger token. Asserted on the broker's group and on the ledger's records.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from test_failure_paths_kafka import history, singleton

from neli_orchestrate import Outcome
from neli_orchestrate.ledger.record import RunState

pytestmark = pytest.mark.kafka

ROLE = "flights"


@pytest.fixture(params=["classic", "consumer"])
def env(request: pytest.FixtureRequest, kafka_broker: str, tmp_path: Path) -> dict:  # type: ignore[type-arg]
    ns = f"t{uuid.uuid4().hex[:8]}"
    return {"bootstrap": kafka_broker, "namespace": ns, "ledger_topic": f"{ns}.ledger",
            "tmp": tmp_path, "timings": {"group_protocol": request.param}}


def test_a_held_role_claims_with_one_member_and_hands_over_when_released(env) -> None:  # type: ignore[no-untyped-def]
    with singleton(env, "us-east-1") as us, singleton(env, "eu-west-1") as eu:
        tokens = []
        with us.hold(ROLE) as held:
            for day in ("2013-01-01", "2013-01-02"):
                with held.claim(day) as run:
                    assert run.outcome is Outcome.RUN, run.reason
                    tokens.append(run.token)
            reservation = held.reserve("2013-01-03")
            assert reservation.outcome is Outcome.RUN and reservation.claim is not None
            tokens.append(held.execute(reservation.claim, lambda run: run.token))
            assert us.role_members(ROLE) == 1, "the hold's one member, never a second"
            waited = eu.reserve(ROLE, "2013-01-04")
            assert waited.outcome is Outcome.WAIT and "busy" in waited.reason
            assert eu.reserve(ROLE, "2013-01-01").outcome is Outcome.SKIP_DONE
            assert us.role_members(ROLE) == 1, "eu answered without joining"
        deadline = time.monotonic() + 30
        while us.role_members(ROLE):
            assert time.monotonic() < deadline, "the hold's member did not leave the group"
            time.sleep(0.1)
        after = eu.reserve(ROLE, "2013-01-04")
        assert after.outcome is Outcome.RUN and after.token is not None
    assert tokens == sorted(tokens) and len(set(tokens)) == 3, tokens
    assert after.token > tokens[-1]
    assert history(env, "2013-01-01") == [("us-east-1", RunState.RUNNING, tokens[0]),
                                          ("us-east-1", RunState.COMPLETED, tokens[0])]
    assert [state for _, state, _ in history(env, "2013-01-03")] == [
        RunState.CLAIMED, RunState.RUNNING, RunState.COMPLETED]
    assert history(env, "2013-01-04") == [("eu-west-1", RunState.CLAIMED, after.token)]
