"""The default group protocol ("auto") on the real broker: chosen from its settings, and said.

The test broker enables KIP-848 with its minimum session lowered to 100 ms and Kafka's maximum
of 60 s, so a 6 s session takes KIP-848 and a 61 s session falls back to classic.
"""

from __future__ import annotations

import logging
import uuid

import pytest

from neli_orchestrate import NeliConfig, SingletonConfig
from neli_orchestrate.core.neli import Neli

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize(("session", "protocol", "why"), [
    (6.0, "consumer", "the broker supports KIP-848"),
    (61.0, "classic", "group.consumer.max.session.timeout.ms=60000"),
])
def test_auto_chooses_the_protocol_from_the_broker_and_says_why(
        kafka_broker: str, caplog: pytest.LogCaptureFixture, session: float, protocol: str,
        why: str) -> None:
    ns = f"gp{uuid.uuid4().hex[:8]}"
    neli = NeliConfig(bootstrap_servers=kafka_broker, profile="fast", session_timeout=session,
                      heartbeat_timeout=2.0)
    assert neli.resolved.group_protocol == "auto"
    config = SingletonConfig(neli=neli, namespace=ns, deployment="us-east-1")
    with caplog.at_level(logging.DEBUG, logger="neli_orchestrate.core.topic"):
        member = Neli(config.role_neli("daily"))
    try:
        assert member.resolved.group_protocol == protocol
        assert f"uses the {protocol} group protocol" in caplog.text and why in caplog.text
    finally:
        member.close()
    # (claims on the default path: test_namespace.py's real-broker test uses "auto")
