"""MockNeli: the test double users drive in their own unit tests; same API as Neli."""

from __future__ import annotations

import inspect
import threading

import pytest

from neli_orchestrate.core.clock import FakeClock
from neli_orchestrate.core.config import NeliConfig
from neli_orchestrate.core.events import LeaderAcquired, LeaderEvent, LeaderFenced, LeaderRevoked
from neli_orchestrate.core.mock import MockNeli
from neli_orchestrate.core.neli import Neli, NeliLike
from neli_orchestrate.errors import NeliError


def test_commands_take_effect_at_the_next_pulse_with_barrier_events() -> None:
    seen: list[LeaderEvent] = []
    neli = MockNeli(barrier=seen.append, clock=FakeClock())
    neli.acquire()
    assert neli.is_leader is False            # not before the next pulse, like a rebalance
    assert neli.pulse() is True
    neli.fence()
    assert neli.pulse() is False
    neli.acquire()                            # leader again after a fence
    neli.pulse()
    neli.revoke()
    neli.pulse()
    assert [type(e) for e in seen] == [LeaderAcquired, LeaderFenced, LeaderAcquired,
                                       LeaderRevoked]
    assert seen == neli.events
    assert all(e.role == 0 and e.member == "mock-member" for e in seen)
    assert seen[-1].deadline > seen[-1].timestamp  # type: ignore[attr-defined]


def test_mock_has_the_public_api_of_neli() -> None:
    assert isinstance(MockNeli(), NeliLike)
    for name in ("pulse", "leads", "background", "close", "partition_for"):
        real = inspect.signature(getattr(Neli, name)).parameters
        mock = inspect.signature(getattr(MockNeli, name)).parameters
        assert list(real) == list(mock), name
    for prop in ("is_leader", "closed", "member_id", "roles", "partitions"):
        assert isinstance(getattr(MockNeli, prop), property), prop


def test_roles_from_config_and_per_role_commands() -> None:
    neli = MockNeli(NeliConfig(roles=("a", "b")))
    neli.acquire("b")
    neli.pulse()
    assert (neli.leads("a"), neli.leads("b"), neli.is_leader) == (False, True, False)
    with pytest.raises(NeliError):
        neli.leads("c")


def test_background_runs_the_task_only_while_leading() -> None:
    runs = threading.Semaphore(0)
    neli = MockNeli()
    pulser = neli.background(task=runs.release)
    assert not runs.acquire(timeout=0.2)
    neli.acquire()
    assert runs.acquire(timeout=5)
    neli.close()
    assert pulser.join(5)


def test_close_revokes_and_pulse_then_returns_false() -> None:
    seen: list[LeaderEvent] = []
    with MockNeli(barrier=seen.append) as neli:
        neli.acquire()
        neli.pulse()
    assert isinstance(seen[-1], LeaderRevoked) and neli.closed
    assert neli.pulse(0.1) is False


def test_barrier_errors_are_kept_and_do_not_break_the_mock() -> None:
    def barrier(event: LeaderEvent) -> None:
        raise RuntimeError("user bug")

    neli = MockNeli(barrier=barrier)
    neli.acquire()
    assert neli.pulse()
    assert len(neli.barrier_errors) == 1


def test_pulse_waits_for_a_command_from_another_thread() -> None:
    neli = MockNeli()
    threading.Timer(0.05, neli.acquire).start()
    assert neli.pulse(timeout=5.0)
