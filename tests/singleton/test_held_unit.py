"""A held role (Singleton.hold) with scripted members and the in-memory ledger.

One join for many claims; other deployments find the group busy; a loss of leadership ends
the hold, and no claim is written once the lease has lapsed, even before the watchdog's next
pulse has noticed (its broken variant, without the check, writes one).
"""

from __future__ import annotations

import time

import pytest
from test_singleton_unit import ROLE, Coordinator, Member, make

from neli_orchestrate import AcquireTimeoutError, FencedError, Outcome, Singleton
from neli_orchestrate.ledger.record import RunState
from neli_orchestrate.singleton.leadership import _Leadership
from neli_orchestrate.testing.memory_ledger import MemoryLedger

GROUP = "acme." + ROLE


@pytest.fixture
def world() -> tuple[Coordinator, MemoryLedger]:
    return Coordinator(), MemoryLedger()


def seen_by(coordinator: Coordinator, deployment: str, ledger: MemoryLedger) -> Singleton:
    """A deployment that reads group membership from the coordinator (the busy-group rule)."""
    single = make(deployment, coordinator, ledger)
    single._membership = lambda group: len(coordinator.groups[group])
    return single


def test_a_held_role_joins_once_for_many_claims_and_leaves_at_the_end(world) -> None:
    coordinator, ledger = world
    us = seen_by(coordinator, "us-east-1", ledger)
    tokens = []
    with us.hold(ROLE) as held:
        for day in ("d1", "d2", "d3"):
            with held.claim(day) as run:
                assert run.outcome is Outcome.RUN
                tokens.append(run.token)
        reservation = held.reserve("d4")
        assert reservation.outcome is Outcome.RUN and reservation.claim is not None
        assert held.execute(reservation.claim, lambda run: run.token) == reservation.token
        with held.claim("d1") as again:
            assert again.outcome is Outcome.SKIP_DONE and not again.should_run
        assert len(coordinator.created) == 1, "one member for every claim of the hold"
        assert coordinator.groups[GROUP] == coordinator.created[:1]
    tokens.append(reservation.token)
    assert tokens == sorted(tokens) and len(set(tokens)) == 4, tokens
    assert ledger.history(ROLE, "d4") == [RunState.CLAIMED, RunState.RUNNING,
                                          RunState.COMPLETED]
    assert coordinator.groups[GROUP] == [], "leaving the block left the group"


def test_other_deployments_find_a_held_role_busy_and_lead_once_it_is_released(world) -> None:
    coordinator, ledger = world
    us = seen_by(coordinator, "us-east-1", ledger)
    eu = seen_by(coordinator, "eu-west-1", ledger)
    with us.hold(ROLE) as held:
        with held.claim("d1") as run:
            held_token = run.token
        waited = eu.reserve(ROLE, "d2")
        assert waited.outcome is Outcome.WAIT and waited.token is None
        assert eu.reserve(ROLE, "d1").outcome is Outcome.SKIP_DONE
        with pytest.raises(AcquireTimeoutError, match="busy"):
            with eu.hold(ROLE):
                pass
        assert len(coordinator.created) == 1, "eu never joined the held role's group"
    after = eu.reserve(ROLE, "d2")
    assert after.outcome is Outcome.RUN and after.token > held_token


def test_a_fence_between_claims_ends_the_hold_and_writes_nothing(world) -> None:
    coordinator, ledger = world
    us = make("us-east-1", coordinator, ledger)
    with us.hold(ROLE) as held:
        with held.claim("d1"):
            pass
        coordinator.created[0].fence()
        deadline = time.monotonic() + 10
        while held.lost is None:
            assert time.monotonic() < deadline, "the watchdog never saw the fence"
            time.sleep(0.01)
        with pytest.raises(FencedError, match="hold"):
            held.reserve("d2")
        with pytest.raises(FencedError, match="hold"):
            with held.claim("d2"):
                pass
    assert ledger.latest(ROLE, "d2") is None
    with pytest.raises(FencedError, match="no longer held"):
        held.reserve("d3")


class Lapsing(Member):
    """A member whose lease has lapsed while its pulses still say it leads (the watchdog's
    last pulse predates the lapse)."""

    lapsed = False

    @property
    def is_leader(self) -> bool:
        return not self.lapsed and super().is_leader


@pytest.mark.parametrize("broken", [False, True], ids=["checked", "broken-no-lease-check"])
def test_no_claim_is_written_once_the_lease_has_lapsed(world, monkeypatch, broken) -> None:
    coordinator, ledger = world
    coordinator.member_class = Lapsing
    if broken:  # the variant without the check: trust the watchdog's last pulse
        monkeypatch.setattr(_Leadership, "verify", lambda self: None)
    us = make("us-east-1", coordinator, ledger)
    with us.hold(ROLE) as held:
        with held.claim("d1"):
            pass
        coordinator.created[0].lapsed = True
        if broken:
            reservation = held.reserve("d2")
            # the check is what stops it: without it, a claim lands on a lapsed lease
            assert reservation.outcome is Outcome.RUN
            assert ledger.latest(ROLE, "d2") is not None
            return
        with pytest.raises(FencedError, match="lease lapsed"):
            held.reserve("d2")
    assert ledger.latest(ROLE, "d2") is None
