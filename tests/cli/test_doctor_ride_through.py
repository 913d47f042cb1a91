"""``doctor``'s ride-through and failover arithmetic (docs/internals/protocol.md, 8a), without a
broker."""

from __future__ import annotations

import re
from typing import Any

import pytest

from neli_orchestrate.cli.doctor import OK, WARNING, failover_check, ride_through_check
from neli_orchestrate.core.config import NeliConfig

KAFKA_DEFAULTS = {"broker.session.timeout.ms": "9000", "replica.lag.time.max.ms": "30000",
                  "offsets.commit.timeout.ms": "5000"}


def check(protocol: str, broker: dict[str, str] | None = KAFKA_DEFAULTS,
          **settings: Any) -> tuple[str, str, str]:
    r = NeliConfig(bootstrap_servers="x:1", group_id="g", **settings).resolved
    return ride_through_check(r, protocol, broker)


def test_classic_with_a_longer_session_rides_through_a_dead_broker_on_kafka_defaults() -> None:
    # R = 24 - 0.5 - (24 - 8) / 2 = 15.5 s > 9 s fencing + 4 s until answered + 0.5 s
    level, message, fix = check("classic", session_timeout=24.0)
    assert level == OK, message
    assert "15.50 > 13.5" in message and "replica.lag.time.max.ms 30 s" in message
    assert fix == ""


def test_a_10_s_session_cannot_ride_through_and_says_by_how_much() -> None:
    # R = 10 - 0.5 - (10 - 3.33) / 2 = 6.17 s: the work's stop budget takes the rest
    level, message, fix = check("classic", session_timeout=10.0)
    assert level == WARNING
    assert "6.17 <= 13.5" in message and "broker.session.timeout.ms 9 s" in message
    assert "stop budget" in message and "21.0 s" in fix


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_the_default_profile_rides_through_a_dead_broker_on_kafka_defaults(protocol: str) -> None:
    # Kafka's own 45 s session: classic R = 45 - 0.5 - (45 - 15) / 2 = 29.5 s; KIP-848 also
    # loses the group heartbeat and the coordinator's write timeout: 23.5 s
    level, message, fix = check(protocol)
    assert level == OK, message
    assert fix == ""


@pytest.mark.parametrize(("session", "expected"), [(18.0, WARNING), (45.0, OK)])
def test_kip_848_needs_the_heartbeat_and_the_write_timeout_on_top(session: float,
                                                                   expected: str) -> None:
    level, message, fix = check("consumer", session_timeout=session)
    assert level == expected, message
    assert "offsets.commit.timeout.ms 5 s" in message
    if expected == WARNING:
        assert "30.0 s" in fix and "classic" in fix


def test_the_brokers_own_settings_are_used_when_readable() -> None:
    fast_fencing = {**KAFKA_DEFAULTS, "broker.session.timeout.ms": "3000"}
    level, message, _ = check("classic", fast_fencing, session_timeout=18.0)
    assert level == OK and "broker.session.timeout.ms 3 s (the broker's)" in message
    level, message, _ = check("classic", None, session_timeout=18.0)
    assert level == WARNING and "Kafka's default" in message


def failover(protocol: str, broker: dict[str, str] | None = KAFKA_DEFAULTS,
             **settings: Any) -> tuple[str, str, str]:
    r = NeliConfig(bootstrap_servers="x:1", group_id="g", **settings).resolved
    return failover_check(r, protocol, broker)


def test_a_lost_regions_take_over_waits_for_the_brokers_fencing_and_a_whole_session() -> None:
    # the new coordinator restarts every member's session when it loads the group:
    # 9 s + 45 s before anyone can take over (63-66 s measured, docs/internals/chaos.md)
    level, message, fix = failover("classic")
    assert level == OK
    assert "broker.session.timeout.ms 9 s" in message and "= 54 s" in message
    assert "above 21.0 s" in fix


def test_the_broker_fencing_read_from_the_broker_counts() -> None:
    _, message, _ = failover("classic", {**KAFKA_DEFAULTS, "broker.session.timeout.ms": "3000"},
                             session_timeout=30.0)
    assert "3 s (the broker's) + session_timeout 30 s = 33 s" in message


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_the_shortest_session_offered_for_a_faster_take_over_still_rides_through(
        protocol: str) -> None:
    # the advice must never trade L3 away: just above the floor it names, the ride-through
    # check is ok; just below, it warns
    _, _, fix = failover(protocol)
    floor = float(re.search(r"above ([0-9.]+) s", fix).group(1))  # type: ignore[union-attr]
    assert check(protocol, session_timeout=floor + 0.2)[0] == OK
    assert check(protocol, session_timeout=floor - 0.2)[0] == WARNING
    assert failover(protocol, session_timeout=floor + 0.5)[2] == ""
