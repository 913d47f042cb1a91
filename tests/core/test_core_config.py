"""NeliConfig: defaults computed in one place, every violation a clear error naming the field."""

from __future__ import annotations

import dataclasses
import os
import re
import socket

import pytest

from neli_orchestrate.core.config import PROFILES, PROTECTED_KAFKA_SETTINGS, NeliConfig
from neli_orchestrate.core.confluent import consumer_settings, producer_settings
from neli_orchestrate.errors import ConfigError, NeliError


def test_defaults_follow_gonelis_spirit() -> None:
    config = NeliConfig(bootstrap_servers="k:9092")
    r = config.resolved
    assert r.group_id.endswith(".neli-group")
    assert r.topic == r.group_id + ".neli"
    host, pid, started = r.name.rsplit("_", 2)
    assert host == socket.gethostname() and pid == str(os.getpid()) and started.isdigit()
    assert r.min_poll_interval == pytest.approx(0.1)
    assert r.heartbeat_timeout == pytest.approx(r.session_timeout / 3)
    assert r.mode == "fast" and r.exclusive and r.roles == (0,)
    # the protocol is chosen at start-up from the broker's settings (test_core_startup.py)
    assert r.group_protocol == "auto" and r.assignor is None
    assert r.revoke_timeout < r.max_poll_interval
    # the raw fields stay as given: derived values live in .resolved only
    assert config.topic is None and config.group_id is None


def test_replace_rederives_what_was_left_to_derive() -> None:
    base = NeliConfig(bootstrap_servers="k:9092", group_id="ns.billing", profile="fast")
    other = dataclasses.replace(base, group_id="ns.compaction")
    assert other.resolved.topic == "ns.compaction.neli"
    assert other.resolved.session_timeout == base.resolved.session_timeout
    explicit = dataclasses.replace(base, topic="shared.neli")
    assert dataclasses.replace(explicit, group_id="x").resolved.topic == "shared.neli"


def test_config_is_frozen_and_copies_mappings() -> None:
    settings = {"security.protocol": "PLAINTEXT"}
    config = NeliConfig(kafka_config=settings)
    settings["security.protocol"] = "SSL"
    assert config.kafka_config["security.protocol"] == "PLAINTEXT"
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.group_id = "x"  # type: ignore[misc]
    assert hash(config) == hash(NeliConfig(kafka_config={"other": 1}))


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_profile_is_valid_in_every_mode(profile: str) -> None:
    for mode, exclusive in (("fast", True), ("full", True), ("full", False)):
        for protocol in ("classic", "consumer"):
            r = NeliConfig(profile=profile, mode=mode, exclusive=exclusive,  # type: ignore[arg-type]
                           group_protocol=protocol).resolved  # type: ignore[arg-type]
            assert r.profile == profile


def test_fast_profile_is_tighter_than_default() -> None:
    fast, default = PROFILES["fast"], PROFILES["default"]
    assert fast.session_timeout < default.session_timeout
    assert fast.group_heartbeat_interval < default.group_heartbeat_interval
    assert fast.min_poll_interval < default.min_poll_interval
    assert fast.fetch_wait_max < default.fetch_wait_max


def test_fields_override_the_profile() -> None:
    r = NeliConfig(profile="fast", session_timeout=2.0, heartbeat_timeout=0.5).resolved
    assert (r.session_timeout, r.heartbeat_timeout) == (2.0, 0.5)


def test_non_exclusive_full_neli_defaults_t_above_the_session_timeout() -> None:
    r = NeliConfig(mode="full", exclusive=False, profile="fast").resolved
    assert r.heartbeat_timeout > r.session_timeout + r.clock_error
    assert r.grace_period == 0.0
    assert NeliConfig(mode="full", profile="fast").resolved.grace_period == pytest.approx(
        NeliConfig(mode="full", profile="fast").resolved.heartbeat_timeout)


@pytest.mark.parametrize("key", sorted(PROTECTED_KAFKA_SETTINGS))
def test_protected_kafka_settings_are_refused_by_name(key: str) -> None:
    with pytest.raises(ConfigError) as info:
        NeliConfig(kafka_config={key: "x"})
    assert repr(key) in str(info.value)
    assert "kafka_config" in str(info.value)


def test_protected_settings_are_matched_regardless_of_case_and_spaces() -> None:
    with pytest.raises(ConfigError, match="group.instance.id"):
        NeliConfig(kafka_config={" Group.Instance.Id ": "static-1"})


def test_static_membership_refusal_explains_the_handover_delay() -> None:
    with pytest.raises(ConfigError, match="LeaveGroup"):
        NeliConfig(kafka_config={"group.instance.id": "a"})


def test_ordinary_kafka_settings_pass_through_to_every_client() -> None:
    config = NeliConfig(kafka_config={"security.protocol": "SASL_SSL",
                                      "sasl.password": "hunter2"}, group_protocol="classic")
    assert consumer_settings(config.resolved)["security.protocol"] == "SASL_SSL"
    assert producer_settings(config.resolved)["sasl.password"] == "hunter2"
    assert "hunter2" not in repr(config)


S10 = {"session_timeout": 10.0}  # the rules' numbers below are for a 10 s session


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({**S10, "heartbeat_timeout": 9.0},
         r"heartbeat_timeout=9 s is too long for session_timeout"),
        ({"heartbeat_timeout": 2.0, "session_timeout": 2.5},
         r"heartbeat_timeout \+ clock_error .* < session_timeout"),
        ({**S10, "heartbeat_interval": 2.0}, r"heartbeat_interval=2 s must be at most half"),
        ({**S10, "min_poll_interval": 2.0}, r"min_poll_interval=2 s must be at most half"),
        ({**S10, "group_heartbeat_interval": 10.0}, r"group_heartbeat_interval=10 s must be below"),
        ({"max_poll_interval": 5.0}, r"max_poll_interval=5 s must be at least session_timeout"),
        ({"revoke_timeout": 300.0}, r"revoke_timeout=300 s must be below max_poll_interval"),
        ({**S10, "fetch_wait_max": 4.0}, r"fetch_wait_max=4 s must be below heartbeat_timeout"),
        ({"mode": "full", "exclusive": False, "heartbeat_timeout": 5.0},
         r"must exceed session_timeout .* non-exclusive"),
        ({"exclusive": False}, r"exclusive=False needs mode='full'"),
        ({"mode": "medium"}, r"mode='medium'"),
        ({"profile": "turbo"}, r"profile='turbo' is unknown; choose one of \['default', 'fast'\]"),
        ({"group_protocol": "eager"}, r"group_protocol='eager'"),
        ({"group_protocol": "classic", "assignor": "range"},
         r"eager assignor 'range'.*cooperative-sticky"),
        ({"group_protocol": "classic", "assignor": "roundrobin,cooperative-sticky"},
         r"eager assignor 'roundrobin'"),
        ({"assignor": "uniform"}, r"set group_protocol='classic' or 'consumer' explicitly"),
        ({"group_protocol": "consumer", "assignor": "cooperative-sticky"},
         r"choose 'uniform', 'range'"),
        ({"session_timeout": 0}, r"session_timeout=0 must be > 0"),
        ({"session_timeout": -1.0}, r"session_timeout=-1.0 must be > 0"),
        ({"session_timeout": "10"}, r"session_timeout must be a number of seconds"),
        ({"clock_error": float("nan")}, r"clock_error must be a finite number"),
        ({"roles": ()}, r"at least one role"),
        ({"roles": (1, 1)}, r"lists 1 twice"),
        ({"roles": (-1,)}, r"role -1 must be >= 0"),
        ({"roles": (True,)}, r"must be an int >= 0 or a non-empty str"),
        ({"roles": "billing"}, r"write roles=\('billing',\)"),
        ({"partitions": 0}, r"partitions=0 must be an int >= 1"),
        ({"topic": "bad topic!"}, r"not a legal Kafka topic name"),
        ({"group_id": ""}, r"group_id must be a non-empty string"),
        ({"bootstrap_servers": " "}, r"bootstrap_servers must name at least one broker"),
        ({"kafka_config": ["x"]}, r"kafka_config must be a mapping"),
        ({"topic_config": {"retention.ms": 5}}, r"topic_config must map str to str"),
        ({"create_topic": "yes"}, r"create_topic must be True or False"),
    ],
)
def test_invalid_settings_name_the_field_and_the_broken_rule(
        overrides: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        NeliConfig(**overrides)  # type: ignore[arg-type]
    assert re.search(fragment, str(info.value)), str(info.value)


def test_config_errors_are_neli_errors_and_value_errors() -> None:
    with pytest.raises(NeliError):
        NeliConfig(heartbeat_timeout=100.0)
    with pytest.raises(ValueError):
        NeliConfig(heartbeat_timeout=100.0)


def test_exclusive_rule_includes_clock_error_and_group_heartbeat() -> None:
    # 3 + 0.5 + 1 < 10 holds ...
    NeliConfig(session_timeout=10.0, heartbeat_timeout=8.0, clock_error=0.5,
               group_heartbeat_interval=1.0)
    # ... 8.6 + 0.5 + 1 does not, although 8.6 < 10 alone would
    with pytest.raises(ConfigError, match="choose heartbeat_timeout < 8.5 s"):
        NeliConfig(session_timeout=10.0, heartbeat_timeout=8.6, clock_error=0.5,
                   group_heartbeat_interval=1.0)


def test_consumer_settings_for_the_classic_protocol() -> None:
    r = NeliConfig(bootstrap_servers="k:1", group_id="g", profile="fast",
                   group_protocol="classic").resolved
    s = consumer_settings(r)
    assert s["group.id"] == "g" and s["bootstrap.servers"] == "k:1"
    assert s["partition.assignment.strategy"] == "cooperative-sticky"
    assert s["session.timeout.ms"] == 1000 and s["heartbeat.interval.ms"] == 50
    assert s["enable.auto.offset.store"] is False      # nothing is ever stored...
    assert "group.instance.id" not in s                 # ...and no static membership
    assert s["max.poll.interval.ms"] == 30000


def test_consumer_settings_for_kip_848_leave_timings_to_the_broker() -> None:
    r = NeliConfig(group_protocol="consumer", assignor="uniform").resolved
    s = consumer_settings(r)
    assert s["group.protocol"] == "consumer" and s["group.remote.assignor"] == "uniform"
    for key in ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy"):
        assert key not in s


def test_producer_settings_bound_heartbeat_delivery_by_the_lease() -> None:
    r = NeliConfig(profile="fast").resolved
    s = producer_settings(r)
    assert s["acks"] == "all" and s["linger.ms"] == 0
    assert s["message.timeout.ms"] == round(r.heartbeat_timeout * 1000)


def test_describe_summarises_the_effective_settings() -> None:
    text = NeliConfig(group_id="billing", profile="fast").describe()
    assert "billing.neli" in text and "profile 'fast'" in text and "session 1 s" in text
