"""Start-up at the broker: leader topic created or checked, KIP-848 group timings applied."""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

import pytest
from core_fakes import FakeAdmin, FakeClients, FakeCluster

from neli_orchestrate.core.clock import FakeClock
from neli_orchestrate.core.config import NeliConfig
from neli_orchestrate.core.neli import Neli
from neli_orchestrate.core.topic import choose_group_protocol
from neli_orchestrate.errors import (
    AuthorizationError,
    ConfigError,
    KafkaUnavailableError,
    SessionTimeoutRejectedError,
    TopicMismatchError,
)


def config(**overrides: object) -> NeliConfig:
    settings: dict[str, object] = dict(bootstrap_servers="fake:0", group_id="g",
                                       profile="fast")
    settings.update(overrides)
    return NeliConfig(**settings)  # type: ignore[arg-type]


def start(cluster: FakeCluster, **overrides: object) -> Neli:
    return Neli(config(**overrides), clock=cluster.clock, kafka=FakeClients(cluster))


def test_missing_leader_topic_is_created_with_one_partition_per_role() -> None:
    cluster = FakeCluster(clock=FakeClock(), topic_exists=False)
    neli = start(cluster, roles=("a", "b", "c"))
    (topic, partitions, settings), = cluster.created
    assert (topic, partitions) == ("g.neli", 3) and neli.partitions == 3
    assert settings["cleanup.policy"] == "delete" and "retention.ms" in settings


def test_topic_created_concurrently_is_awaited_until_metadata_lists_it() -> None:
    # another member created it a moment ago: "already exists", but not in metadata yet
    cluster = FakeCluster(clock=FakeClock(), topic_exists=True, topic_invisible_reads=4)
    assert start(cluster).partitions == 1
    assert cluster.topic_invisible_reads == 0


def test_topic_config_overrides_the_defaults_of_a_created_topic() -> None:
    cluster = FakeCluster(clock=FakeClock(), topic_exists=False)
    start(cluster, partitions=2, topic_config={"retention.ms": "60000"})
    (_, partitions, settings), = cluster.created
    assert partitions == 2 and settings["retention.ms"] == "60000"


def test_denied_topic_creation_is_a_clear_error() -> None:
    cluster = FakeCluster(clock=FakeClock(), topic_exists=False, deny_create=True)
    with pytest.raises(AuthorizationError, match="creating leader topic 'g.neli'"):
        start(cluster)


def test_missing_topic_without_creation_is_a_clear_error() -> None:
    cluster = FakeCluster(clock=FakeClock(), topic_exists=False)
    with pytest.raises(TopicMismatchError, match="does not exist and NeliConfig.create_topic"):
        start(cluster, create_topic=False)


def test_partition_count_that_does_not_match_the_config_is_refused() -> None:
    cluster = FakeCluster(clock=FakeClock(), partitions=3)
    with pytest.raises(TopicMismatchError, match=r"has 3 partition\(s\) but NeliConfig"):
        start(cluster, partitions=4)
    assert start(cluster).partitions == 3   # partitions=None accepts the topic's count


def test_unreachable_cluster_is_a_clear_error() -> None:
    cluster = FakeCluster(clock=FakeClock(), unreachable=True)
    with pytest.raises(KafkaUnavailableError, match="cannot reach"):
        start(cluster)


def test_kip_848_group_gets_its_session_and_heartbeat_from_the_config() -> None:
    cluster = FakeCluster(clock=FakeClock())
    start(cluster, group_protocol="consumer")
    assert cluster.altered_groups == [{"consumer.session.timeout.ms": "1000",
                                       "consumer.heartbeat.interval.ms": "50"}]


def test_kip_848_group_settings_are_awaited_until_the_broker_shows_them() -> None:
    # the broker's default (3 s) is still visible for a moment after the change is accepted;
    # non-exclusive mode would refuse it, so the member must wait for its own values
    cluster = FakeCluster(clock=FakeClock(), group_stale_reads=3, group_settings={
        "consumer.session.timeout.ms": "3000", "consumer.heartbeat.interval.ms": "250"},
        topic_settings={"message.timestamp.type": "LogAppendTime"})
    start(cluster, group_protocol="consumer", mode="full", exclusive=False,
          heartbeat_timeout=2.0)
    assert cluster.group_stale_reads == 0


def test_kip_848_group_with_a_shorter_broker_session_is_refused(
        caplog: pytest.LogCaptureFixture) -> None:
    cluster = FakeCluster(clock=FakeClock(), deny_group_alter=True, group_settings={
        "consumer.session.timeout.ms": "300", "consumer.heartbeat.interval.ms": "50"})
    with caplog.at_level(logging.WARNING), pytest.raises(ConfigError, match="session timeout"):
        start(cluster, group_protocol="consumer")
    assert "could not set the session" in caplog.text


def test_kip_848_group_with_a_longer_broker_session_is_accepted_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    cluster = FakeCluster(clock=FakeClock(), deny_group_alter=True, group_settings={
        "consumer.session.timeout.ms": "45000", "consumer.heartbeat.interval.ms": "5000"})
    with caplog.at_level(logging.WARNING):
        start(cluster, group_protocol="consumer")
    assert "45 s session timeout" in caplog.text


def test_classic_group_needs_no_group_settings() -> None:
    cluster = FakeCluster(clock=FakeClock())
    start(cluster)  # auto, broker settings unreadable: classic
    assert cluster.altered_groups == []


KIP_848_BROKER = {"group.coordinator.rebalance.protocols": "classic,consumer",
                  "group.consumer.min.session.timeout.ms": "45000",
                  "group.consumer.max.session.timeout.ms": "60000",
                  "group.consumer.min.heartbeat.interval.ms": "5000",
                  "group.consumer.max.heartbeat.interval.ms": "15000",
                  "group.min.session.timeout.ms": "6000",
                  "group.max.session.timeout.ms": "1800000"}


@pytest.mark.parametrize(("broker", "overrides", "protocol", "why"), [
    (None, {}, "classic", "not readable"),
    ({"group.min.session.timeout.ms": "6000"}, {}, "classic", "predates KIP-848"),
    ({**KIP_848_BROKER, "group.coordinator.rebalance.protocols": "classic"}, {}, "classic",
     "does not enable KIP-848"),
    # the default profile's 45 s session fits a stock broker's KIP-848 limits, its 1 s group
    # heartbeat does not: classic (whose 45 s session rides through a broker's crash too)
    (KIP_848_BROKER, {"profile": "default"}, "classic",
     "group_heartbeat_interval=1 s is below the broker's group.consumer.min.heartbeat.interval"
     ".ms=5000"),
    (KIP_848_BROKER, {"profile": "default", "session_timeout": 10.0}, "classic",
     "session_timeout=10 s is below the broker's group.consumer.min.session.timeout.ms=45000"),
    (KIP_848_BROKER, {"profile": "default", "session_timeout": 50.0,
                      "group_heartbeat_interval": 5.0}, "consumer", "supports KIP-848"),
    (KIP_848_BROKER, {"profile": "default", "session_timeout": 50.0,
                      "group_heartbeat_interval": 5.0, "apply_group_config": False},
     "consumer", "supports KIP-848"),
    ({**KIP_848_BROKER, "group.consumer.min.session.timeout.ms": "100",
      "group.consumer.min.heartbeat.interval.ms": "50"}, {}, "consumer", "supports KIP-848"),
    (None, {"group_protocol": "consumer"}, "consumer", "configured"),
])
def test_auto_group_protocol_takes_kip_848_when_the_broker_supports_it(
        broker, overrides, protocol, why) -> None:  # type: ignore[no-untyped-def]
    r = config(**overrides).resolved
    chosen, reason = choose_group_protocol(broker, r)
    assert (chosen, why in reason) == (protocol, True), reason
    # the advice fits the setting that was refused (a too-short heartbeat is not fixed by a
    # longer session)
    assert "raise session_timeout" not in reason, reason


def test_the_chosen_protocol_reaches_the_consumer_and_the_log(
        caplog: pytest.LogCaptureFixture) -> None:
    cluster = FakeCluster(clock=FakeClock(), broker_settings={
        **KIP_848_BROKER, "group.consumer.min.session.timeout.ms": "100",
        "group.consumer.min.heartbeat.interval.ms": "50"})
    with caplog.at_level(logging.DEBUG, logger="neli_orchestrate.core.topic"):
        neli = start(cluster)
    assert neli.resolved.group_protocol == "consumer" and neli.resolved.assignor is None
    assert "uses the consumer group protocol: the broker supports KIP-848" in caplog.text
    # and KIP-848 means the member set its session and heartbeat on the group
    assert cluster.altered_groups == [{"consumer.session.timeout.ms": "1000",
                                       "consumer.heartbeat.interval.ms": "50"}]

    cluster = FakeCluster(clock=FakeClock(), broker_settings={
        **KIP_848_BROKER, "group.coordinator.rebalance.protocols": "classic",
        "group.min.session.timeout.ms": "100"})
    assert start(cluster).resolved.assignor == "cooperative-sticky"


@pytest.mark.parametrize("protocol", ["classic", "consumer", "auto"])
def test_a_session_timeout_outside_the_brokers_limits_fails_at_start(protocol: str) -> None:
    cluster = FakeCluster(clock=FakeClock(), broker_settings={
        **KIP_848_BROKER, "group.min.session.timeout.ms": "6000"})
    with pytest.raises(SessionTimeoutRejectedError, match="group.min.session.timeout.ms=6000"
                       if protocol != "consumer" else "group.consumer.min.session"):
        start(cluster, group_protocol=protocol)  # fast profile: a 1 s session


def test_a_config_the_kafka_client_rejects_is_a_config_error() -> None:
    # the real confluent-kafka client validates property names at construction
    with pytest.raises(ConfigError, match="kafka_config"):
        Neli(config(kafka_config={"no.such.property": "1"}, bootstrap_servers="127.0.0.1:1",
                    request_timeout=0.5))


def test_unreachable_real_broker_fails_fast_with_the_address() -> None:
    with pytest.raises(KafkaUnavailableError, match="127.0.0.1:1"):
        Neli(config(bootstrap_servers="127.0.0.1:1", request_timeout=1.0))


def test_every_client_reconnects_after_10_ms_unless_kafka_config_says_otherwise() -> None:
    # librdkafka drops the bootstrap connection once it knows the brokers; a start-up request
    # caught on it waits reconnect.backoff.ms / 2 for a new one (50 ms by default)
    cluster = FakeCluster(clock=FakeClock())
    clients = FakeClients(cluster)
    Neli(config(), clock=cluster.clock, kafka=clients)
    assert clients.admin_settings["reconnect.backoff.ms"] == 10
    assert cluster.consumer.settings["reconnect.backoff.ms"] == 10   # its join waits on it too
    assert cluster.producer.settings["reconnect.backoff.ms"] == 10
    Neli(config(kafka_config={"reconnect.backoff.ms": 250}), clock=cluster.clock, kafka=clients)
    assert clients.admin_settings["reconnect.backoff.ms"] == 250
    assert cluster.consumer.settings["reconnect.backoff.ms"] == 250

# -- a failing check stops the member before it joins (the checks overlap one read) -------------

SHORT_GROUP_SESSION = {"consumer.session.timeout.ms": "300",
                       "consumer.heartbeat.interval.ms": "50"}
FAILING_CHECKS: dict[str, tuple[dict[str, Any], dict[str, Any], type[Exception], str]] = {
    # name: (cluster, member settings, error, message)
    "partition count differs": ({"partitions": 2}, {"partitions": 3}, TopicMismatchError,
                                r"has 2 partition\(s\) but NeliConfig.partitions=3"),
    "topic missing, creation off": ({"topic_exists": False}, {"create_topic": False},
                                    TopicMismatchError, "does not exist"),
    "broker refuses the session": (
        {"broker_settings": {**KIP_848_BROKER, "group.min.session.timeout.ms": "6000"}}, {},
        SessionTimeoutRejectedError, "the broker refuses"),
    "group session shorter than the lease": (
        {"deny_group_alter": True, "group_settings": SHORT_GROUP_SESSION}, {}, ConfigError,
        "heartbeat_timeout"),
}


@pytest.mark.parametrize(("case", "protocol"), [
    (case, protocol) for case in FAILING_CHECKS for protocol in ("consumer", "auto", "classic")
    if case != "group session shorter than the lease" or protocol == "consumer"])
def test_a_failing_start_check_raises_before_the_member_joins_the_group(
        case: str, protocol: str) -> None:
    cluster_settings, settings, error, message = FAILING_CHECKS[case]
    cluster = FakeCluster(clock=FakeClock(), **cluster_settings)
    events: list[object] = []
    with pytest.raises(error, match=message):
        Neli(config(group_protocol=protocol, **settings), barrier=events.append,
             clock=cluster.clock, kafka=FakeClients(cluster))
    # never subscribed, so never assigned and never a leader; no client left open
    assert (cluster.consumers, cluster.producers, cluster.watchers, events) == ([], [], [], [])
    assert not [t.name for t in threading.enumerate() if t.name.startswith("neli-start-")]


def test_a_failing_topic_check_closes_the_admin_only_after_the_early_group_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # KIP-848: the group's settings are read on a thread while the topic is checked. When the
    # topic check fails, the admin client must not be closed under that read.
    trace: list[str] = []
    closed = threading.Event()

    def group_config(self: FakeAdmin, group_id: str, timeout: float) -> object:
        closed.wait(0.2)   # still reading when the topic check fails
        trace.append("group read returned")
        return self.cluster.group_settings

    def close(self: FakeAdmin) -> None:
        trace.append("admin closed")
        closed.set()

    monkeypatch.setattr(FakeAdmin, "group_config", group_config)
    monkeypatch.setattr(FakeAdmin, "close", close)
    cluster = FakeCluster(clock=FakeClock(), partitions=2)
    with pytest.raises(TopicMismatchError):
        start(cluster, partitions=3, group_protocol="consumer")
    assert trace == ["group read returned", "admin closed"]


@pytest.mark.kafka
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_real_member_on_a_topic_with_other_partitions_fails_at_start_and_never_joins(
        protocol: str, kafka_broker: str, kafka_admin: Any, new_topic: Any,
        capfd: pytest.CaptureFixture[str]) -> None:
    topic = new_topic(partitions=2)
    group = f"start.{uuid.uuid4().hex[:10]}"
    events: list[object] = []
    with pytest.raises(TopicMismatchError, match=r"has 2 partition\(s\)"):
        Neli(NeliConfig(bootstrap_servers=kafka_broker, group_id=group, topic=topic,
                        partitions=3, profile="fast", group_protocol=protocol),
             barrier=events.append)
    assert events == []
    groups = kafka_admin.list_consumer_groups(request_timeout=10).result()
    assert group not in {g.group_id for g in groups.valid}
    assert not [t.name for t in threading.enumerate() if t.name.startswith("neli-start-")]
    assert capfd.readouterr().err == ""   # no raw librdkafka output
