"""``doctor`` and docs/guide/security.md agree: the documented ACLs pass its tried checks."""

from __future__ import annotations

import uuid

import pytest

from neli_orchestrate import NeliConfig, Singleton, SingletonConfig
from neli_orchestrate.acls import required_acls
from neli_orchestrate.cli._context import Target
from neli_orchestrate.cli.doctor import ERROR, diagnose

pytestmark = pytest.mark.kafka


def test_doctor_finds_no_acl_error_for_a_principal_with_the_documented_acls(
        secured_kafka) -> None:  # type: ignore[no-untyped-def]
    user = f"svc-{uuid.uuid4().hex[:8]}"
    settings = secured_kafka.add_user(user)
    kafka_config = {k: v for k, v in settings.items() if k != "bootstrap.servers"}
    namespace = f"doc{uuid.uuid4().hex[:8]}"
    neli = NeliConfig(bootstrap_servers=secured_kafka.bootstrap_servers,
                      kafka_config=kafka_config, profile="fast", session_timeout=10.0,
                      heartbeat_timeout=4.0)
    config = SingletonConfig(neli=neli, deployment="us-east-1", namespace=namespace)
    secured_kafka.grant(required_acls(config, f"User:{user}"))
    with Singleton(config) as singleton:  # a first run creates the topics, as in production
        reservation = singleton.reserve("export", "2013-01-01")
        assert reservation.should_run, reservation
    target = Target(bootstrap_servers=secured_kafka.bootstrap_servers, namespace=namespace,
                    kafka_config=kafka_config, connect_timeout=10.0)
    findings = diagnose(target, NeliConfig(bootstrap_servers=secured_kafka.bootstrap_servers,
                                           group_id=namespace, topic=config.names.leader_topic,
                                           kafka_config=kafka_config,
                                           profile="fast", session_timeout=10.0,
                                           heartbeat_timeout=4.0))
    acl_errors = [f for f in findings if f.check == "acl" and f.level == ERROR]
    assert acl_errors == [], acl_errors
    assert [f for f in findings if f.check == "acl"], "doctor tried no ACL at all"
