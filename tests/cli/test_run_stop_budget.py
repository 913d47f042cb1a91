"""`run`'s stop arithmetic with and without a ride-through: the stop (--grace + the SIGKILL
budget) must end before another deployment may lead, from whichever lease the member holds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from neli_orchestrate.cli.run import _guard_bounds, guard_margin
from neli_orchestrate.core.config import NeliConfig
from neli_orchestrate.errors import ConfigError
from neli_orchestrate.supervise.keeper import KILL_BUDGET


def single(**timing: float) -> SimpleNamespace:
    neli = NeliConfig(bootstrap_servers="127.0.0.1:9092", **timing)  # type: ignore[arg-type]
    return SimpleNamespace(config=SimpleNamespace(neli=neli))


def test_without_a_ride_through_the_guard_margin_bounds_the_stop() -> None:
    member = single(session_timeout=10.0)  # auto, a 10 s session: no ride-through
    r = member.config.neli.resolved
    assert r.ride_through == 0
    grace, _ = _guard_bounds(member, None)
    assert grace == pytest.approx((r.session_timeout - r.heartbeat_timeout) / 2)
    most = round(guard_margin(r) - KILL_BUDGET, 3)
    assert _guard_bounds(member, most)[0] == most
    with pytest.raises(ConfigError, match="too long"):
        _guard_bounds(member, most + 0.1)


@pytest.mark.parametrize("session", [24.0, None])  # None: the default profile's 45 s
def test_a_ridden_lease_leaves_only_the_stop_budget_for_the_stop(session: float | None) -> None:
    # rides through a broker's crash (protocol.md 8a)
    member = single(session_timeout=session) if session else single()
    r = member.config.neli.resolved
    assert r.ride_through > 0 and r.stop_budget < guard_margin(r)
    most = round(r.stop_budget - KILL_BUDGET, 3)
    assert _guard_bounds(member, None)[0] == most
    # the guard margin alone would allow more: after a ridden lease it would outlive it
    with pytest.raises(ConfigError, match="stop_budget"):
        _guard_bounds(member, most + 0.5)
    # from the end of a ridden lease (last accepted commit + R) to the earliest successor
    # (classic: the commit + session - clock error) the whole stop fits
    assert r.ride_through + most + KILL_BUDGET <= r.session_timeout - r.clock_error + 1e-9
