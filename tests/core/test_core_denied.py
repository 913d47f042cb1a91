"""A denied ACL reaches the member as an AuthorizationError at once (fake Kafka, no broker).

Waiting cannot fix a missing ACL: the member must not sit unassigned until acquire_timeout
and let its caller believe that another member leads (issue 9 item 8).
"""

from __future__ import annotations

import pytest
from core_fakes import kinds
from test_core_fast_neli import lead, make

from neli_orchestrate.core.kafka import authorization_denied
from neli_orchestrate.errors import AuthorizationError


@pytest.mark.parametrize(("code", "message", "denied"), [
    ("GROUP_AUTHORIZATION_FAILED", "", True),
    ("TOPIC_AUTHORIZATION_FAILED", "", True),
    ("TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "", True),
    ("CLUSTER_AUTHORIZATION_FAILED", "", True),
    # librdkafka reports a KIP-848 group it may not join as a fatal error naming the cause
    ("_FATAL", "Fatal error: Broker: Group authorization failed: ConsumerGroupHeartbeat", True),
    ("_FATAL", "Fatal error: Broker: Producer fenced", False),
    ("_TRANSPORT", "Broker: Topic authorization failed", False),
    ("_MAX_POLL_EXCEEDED", "", False),
])
def test_authorization_denied_knows_the_codes(code: str, message: str, denied: bool) -> None:
    assert authorization_denied(code, message) is denied


def test_a_denied_group_before_leading_raises_at_once_naming_group_and_topic() -> None:
    neli, cluster, rec = make()
    cluster.consumer.fault("GROUP_AUTHORIZATION_FAILED")
    with pytest.raises(AuthorizationError) as denied:
        neli.pulse(0.01)
    message = str(denied.value)
    assert "READ on consumer group 'g'" in message and "'g.neli'" in message
    with pytest.raises(AuthorizationError):  # every later pulse says the same
        neli.pulse(0.01)
    neli.close()


def test_a_denied_topic_while_leading_fences_then_raises() -> None:
    neli, cluster, rec = make()
    lead(neli, cluster)
    cluster.consumer.fault("TOPIC_AUTHORIZATION_FAILED")
    with pytest.raises(AuthorizationError, match="leader topic"):
        neli.pulse(0.01)
    assert neli.is_leader is False
    assert kinds(rec.events)[-1] == "LeaderFenced"
    neli.close()


def test_a_refused_heartbeat_raises_instead_of_waiting_for_the_lease() -> None:
    neli, cluster, rec = make()
    producer = cluster.producer

    def refuse(partition, key, value, on_delivery=None):  # type: ignore[no-untyped-def]
        producer.reports.append((on_delivery, None, "TOPIC_AUTHORIZATION_FAILED"))

    producer.send = refuse  # type: ignore[method-assign]
    cluster.consumer.assign(0)
    with pytest.raises(AuthorizationError, match="TOPIC_AUTHORIZATION_FAILED"):
        neli.pulse(0.2)
    neli.close()



def test_a_denied_group_config_is_not_mistaken_for_a_broker_without_group_configs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from core_fakes import FakeAdmin

    def deny(self, group_id, settings, timeout):  # type: ignore[no-untyped-def]
        raise AuthorizationError(f"setting {settings} on consumer group {group_id!r} was denied")

    monkeypatch.setattr(FakeAdmin, "alter_group_config", deny)
    with pytest.raises(AuthorizationError, match="consumer group 'g'"):
        make(group_protocol="consumer")
