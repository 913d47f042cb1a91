"""Permanent errors fail fast, against the real broker: a clear error from the first call.

Each case would otherwise look like "Kafka unavailable" or "another member leads" and make a
gate or sensor wait for its whole timeout. The tests assert that the call raises the permanent
error (no WAIT answer), that its message says what to change, and that nothing claims another
member leads.
"""

from __future__ import annotations

import logging
import uuid

import pytest
from confluent_kafka.admin import NewTopic

from neli_orchestrate import NeliConfig, Singleton, SingletonConfig
from neli_orchestrate.core import confluent as core_kafka
from neli_orchestrate.errors import (
    PermanentKafkaError,
    SessionTimeoutRejectedError,
    TopicMismatchError,
)

pytestmark = pytest.mark.kafka

FAST = {"profile": "fast", "session_timeout": 6.0, "heartbeat_timeout": 2.0}


def singleton(bootstrap: str, ns: str, *, ledger_partitions: int = 1,
              **neli: object) -> Singleton:
    settings = {**FAST, **neli}
    return Singleton(SingletonConfig(
        neli=NeliConfig(bootstrap_servers=bootstrap, **settings),  # type: ignore[arg-type]
        namespace=ns, deployment="us-east-1", acquire_timeout=60.0,
        ledger_partitions=ledger_partitions))


def create(kafka_admin, topic: str, partitions: int, **config: str) -> None:  # type: ignore[no-untyped-def]
    kafka_admin.create_topics([NewTopic(topic, partitions, 1, config=config)])[topic].result(30)


@pytest.fixture
def ns() -> str:
    return f"perm{uuid.uuid4().hex[:8]}"


def no_wait_logged(caplog: pytest.LogCaptureFixture) -> None:
    assert "another member leads" not in caplog.text
    assert "WAIT" not in caplog.text


def test_a_leader_topic_with_another_partition_count_fails_reserve_at_once(
        kafka_broker: str, kafka_admin, ns: str, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    create(kafka_admin, f"{ns}.neli", 2)
    with singleton(kafka_broker, ns, partitions=1) as s, caplog.at_level(logging.INFO), \
            pytest.raises(TopicMismatchError, match=r"has 2 partition\(s\) but NeliConfig"
                          r".partitions=1.*set partitions=2"):
        s.reserve("daily", "2013-01-05")
    no_wait_logged(caplog)


def test_a_ledger_topic_with_another_partition_count_fails_claim_at_once(
        kafka_broker: str, kafka_admin, ns: str, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    create(kafka_admin, f"{ns}.ledger", 2, **{"cleanup.policy": "compact"})
    with singleton(kafka_broker, ns) as s, caplog.at_level(logging.INFO), \
            pytest.raises(TopicMismatchError, match="has 2 partitions but the config says "
                                                    "partitions=1"):
        with s.claim("daily", "2013-01-05"):
            pytest.fail("a claim on a mismatched ledger must not start")
    no_wait_logged(caplog)


def test_a_missing_leader_topic_that_may_not_be_created_fails_reserve_at_once(
        kafka_broker: str, ns: str, caplog: pytest.LogCaptureFixture) -> None:
    with singleton(kafka_broker, ns, create_topic=False) as s, caplog.at_level(logging.INFO), \
            pytest.raises(TopicMismatchError, match=f"leader topic '{ns}.neli' does not exist "
                                                    "and NeliConfig.create_topic is False"):
        s.reserve("daily", "2013-01-05")
    no_wait_logged(caplog)


@pytest.mark.parametrize(("protocol", "session", "limit"), [
    # the test broker keeps Kafka's maxima: classic 30 min, KIP-848 60 s
    ("classic", 1900.0, "group.max.session.timeout.ms=1800000"),
    ("consumer", 120.0, "group.consumer.max.session.timeout.ms=60000"),
])
def test_a_session_timeout_the_broker_rejects_fails_reserve_at_once(
        kafka_broker: str, ns: str, protocol: str, session: float, limit: str,
        caplog: pytest.LogCaptureFixture) -> None:
    with singleton(kafka_broker, ns, group_protocol=protocol, session_timeout=session,
                   heartbeat_timeout=None) as s, caplog.at_level(logging.INFO), \
            pytest.raises(SessionTimeoutRejectedError, match=limit):
        s.reserve("daily", "2013-01-05")
    no_wait_logged(caplog)
    assert s.role_members("daily") == 0, "a refused member must not stay in the group"


def test_a_session_timeout_rejected_at_join_fails_the_member_at_once(
        kafka_broker: str, ns: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # Without DescribeConfigs on the cluster the limits are unknown at start: the broker's
    # JoinGroup answer (INVALID_SESSION_TIMEOUT) must end the member, not leave it retrying.
    monkeypatch.setattr(core_kafka._ConfluentAdmin, "broker_config",
                        lambda self, topic, timeout: None)
    with singleton(kafka_broker, ns, session_timeout=1900.0, heartbeat_timeout=None) as s, \
            caplog.at_level(logging.INFO), \
            pytest.raises(SessionTimeoutRejectedError, match="INVALID_SESSION_TIMEOUT|nvalid "
                                                             "session timeout"):
        s.reserve("daily", "2013-01-05")
    assert "uses the classic group protocol" in caplog.text
    no_wait_logged(caplog)


def test_permanent_errors_are_not_kafka_unavailable() -> None:
    # Callers that wait on KafkaUnavailableError (gates, sensors, triggers) must not catch them.
    from neli_orchestrate.errors import KafkaUnavailableError

    assert not issubclass(PermanentKafkaError, KafkaUnavailableError)
