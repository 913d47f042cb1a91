"""What a user of each supported Kafka release sees: doctor names the release and the group
protocol, and a KIP-848 member is refused at start where the broker lacks KIP-848.

Runs against the session broker: the pinned release in the normal run, 3.9.1 and 4.4.0 in the
compatibility job (``NELI_TEST_KAFKA_VERSION``, .ci/compat).
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

from neli_orchestrate import NeliConfig
from neli_orchestrate.core.neli import Neli
from neli_orchestrate.errors import ConfigError
from neli_orchestrate.testing.local_kafka import KAFKA_VERSION

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from cli_helpers import cli, new_namespace  # noqa: E402

pytestmark = pytest.mark.kafka

VERSION = os.environ.get("NELI_TEST_KAFKA_VERSION", "").strip() or KAFKA_VERSION
KIP_848 = int(VERSION.split(".")[0]) >= 4


def test_doctor_names_the_release_and_the_group_protocol(kafka_broker: str) -> None:
    out = cli("doctor", "-b", kafka_broker, "-n", new_namespace(), "--profile", "fast",
              "--json")
    findings = {f["check"]: f for f in out.json()["findings"] if f["check"] == "version"}
    release = "4.x" if KIP_848 else ".".join(VERSION.split(".")[:2])
    assert findings["version"]["level"] == "ok"
    assert findings["version"]["message"].startswith(f"Kafka {release} ("), findings
    protocol = [f["message"] for f in out.json()["findings"]
                if f["message"].startswith("members use the")]
    assert protocol == [f"members use the {'consumer' if KIP_848 else 'classic'} group protocol: "
                        + protocol[0].split(": ", 1)[1]]


def test_a_kip_848_member_leads_where_offered_and_is_refused_where_not(kafka_broker) -> None:
    config = NeliConfig(bootstrap_servers=kafka_broker, group_id=f"g{uuid.uuid4().hex[:8]}",
                        profile="fast", group_protocol="consumer")
    if not KIP_848:
        with pytest.raises(ConfigError, match="lacks the KIP-848 consumer group protocol"):
            Neli(config)
        return
    with Neli(config) as member:
        assert member.pulse(timeout=30)
