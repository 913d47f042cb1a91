"""The busy-group rule lives in Singleton: reserve, claim and leads never join a busy group.

While anyone leads a role or waits for it, a join would rebalance the group under the running
leader (and under classic groups may fence it). Singleton reads membership and the ledger
instead. Deterministic: the fake group coordinator of test_singleton_unit, no Kafka.
"""

from __future__ import annotations

import time

import pytest
from test_singleton_unit import ROLE, Coordinator

from neli_orchestrate import NeliConfig, Outcome, Singleton, SingletonConfig
from neli_orchestrate.testing.memory_ledger import MemoryLedger


def deployment(name: str, coordinator: Coordinator, ledger: MemoryLedger, *,
               blind: bool = False, **settings: object) -> Singleton:
    config = SingletonConfig(neli=NeliConfig(bootstrap_servers="unused:9092"), namespace="acme",
                             deployment=name, acquire_timeout=0.5, handoff_timeout=60.0,
                             **settings)  # type: ignore[arg-type]

    def members(group: str) -> int:
        with coordinator.lock:
            return 0 if blind else len(coordinator.groups[group])

    return Singleton(config, ledger=ledger, neli_factory=coordinator, membership=members)


@pytest.fixture
def world() -> tuple[Coordinator, MemoryLedger]:
    return Coordinator(), MemoryLedger()


def test_reserve_claim_and_leads_do_not_join_while_the_role_is_led(world) -> None:
    coordinator, ledger = world
    east = deployment("us-east-1", coordinator, ledger)
    west = deployment("eu-west-1", coordinator, ledger)
    with east.claim(ROLE, "2013-01-05") as run:
        assert run.should_run
        joined = len(coordinator.created)

        reservation = west.reserve(ROLE, "2013-01-06")
        assert reservation.outcome is Outcome.WAIT and not reservation.should_run
        assert "busy (1 member(s)" in reservation.reason
        with west.claim(ROLE, "2013-01-05") as seen:
            assert seen.outcome is Outcome.WAIT and not seen.should_run
        assert west.leads(ROLE, timeout=0.5) is False

        assert len(coordinator.created) == joined, "a busy group was joined"
        assert run.check() is None and not run.fenced, "the leader was disturbed"
    # idle again: the next reserve joins, leads and claims
    assert west.reserve(ROLE, "2013-01-06").should_run


def test_a_busy_role_still_answers_skip_for_a_completed_run_key(world) -> None:
    coordinator, ledger = world
    east = deployment("us-east-1", coordinator, ledger)
    west = deployment("eu-west-1", coordinator, ledger)
    with east.claim(ROLE, "2013-01-05") as run:
        assert run.should_run
    with east.claim(ROLE, "2013-01-07"):  # the role is busy with another run key
        joined = len(coordinator.created)
        reservation = west.reserve(ROLE, "2013-01-05")
        assert reservation.outcome is Outcome.SKIP_DONE
        assert reservation.record is not None and reservation.record.deployment == "us-east-1"
        with west.claim(ROLE, "2013-01-05") as seen:
            assert seen.outcome is Outcome.SKIP_DONE
        assert len(coordinator.created) == joined


def test_a_live_claim_read_while_busy_gives_its_deadline(world) -> None:
    coordinator, ledger = world
    east = deployment("us-east-1", coordinator, ledger)
    west = deployment("eu-west-1", coordinator, ledger)
    claimed = east.reserve(ROLE, "2013-01-05")
    assert claimed.should_run
    with east.claim(ROLE, "2013-01-08"):
        reservation = west.reserve(ROLE, "2013-01-05")
    assert reservation.outcome is Outcome.WAIT
    assert reservation.wait_until is not None and reservation.wait_until > time.time()


def test_the_check_catches_a_singleton_that_joins_a_busy_group(world) -> None:
    # The deliberately broken variant: membership reads as idle, so reserve joins the busy
    # group. The assertion the tests above rely on (no member created) must catch it.
    coordinator, ledger = world
    east = deployment("us-east-1", coordinator, ledger)
    blind = deployment("eu-west-1", coordinator, ledger, blind=True)
    with east.claim(ROLE, "2013-01-05"):
        joined = len(coordinator.created)
        assert blind.reserve(ROLE, "2013-01-06").outcome is Outcome.WAIT
        assert len(coordinator.created) == joined + 1
