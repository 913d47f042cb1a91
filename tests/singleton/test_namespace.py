"""One namespace, one derivation: plain Python, the Airflow hook and the Dagster resource agree.

The unit tests compare every derived name; the real-broker test shows two deployments started
through different front doors share the role's group (one leads, the other sees a member) and
the ledger (one completes, the other skips).
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from neli_orchestrate import NeliConfig, Outcome, Singleton, SingletonConfig
from neli_orchestrate.core.namespace import derive
from neli_orchestrate.errors import ConfigError


def plain(bootstrap: str, namespace: str | None, deployment: str,
          **neli: object) -> SingletonConfig:
    return SingletonConfig(neli=NeliConfig(bootstrap_servers=bootstrap, **neli),  # type: ignore[arg-type]
                           namespace=namespace, deployment=deployment)


def hooked(bootstrap: str, namespace: str | None, deployment: str,
           **extra: object) -> SingletonConfig:
    from airflow.sdk import Connection

    from neli_orchestrate.airflow.hooks.neli import NeliHook

    extras = {"deployment": deployment, **extra}
    if namespace is not None:
        extras["namespace"] = namespace
    conn = Connection(conn_id="neli_x", conn_type="neli", host=bootstrap, extra=json.dumps(extras))
    return NeliHook("neli_x", connection=conn).singleton_config()


def resourced(bootstrap: str, namespace: str, deployment: str, **fields: object) -> SingletonConfig:
    from neli_orchestrate.dagster import NeliResource

    return NeliResource(bootstrap_servers=bootstrap, namespace=namespace, deployment=deployment,
                        **fields).singleton_config()  # type: ignore[arg-type]


def names(config: SingletonConfig, role: str) -> tuple[str, str, str, str]:
    group = config.role_neli(role).resolved
    ledger = config.ledger_config()
    return (group.group_id, group.topic, ledger.topic, ledger.transactional_id("x"))


def test_derive_names_every_kafka_resource_of_a_namespace() -> None:
    n = derive("acme")
    assert (n.group_id("daily"), n.leader_topic, n.ledger_topic, n.transactional_id_prefix) == (
        "acme.daily", "acme.neli", "acme.ledger", "acme.ledger:")
    assert derive("acme", ledger_topic="legacy.ledger").ledger_topic == "legacy.ledger"


@pytest.mark.parametrize("bad", [None, "", "  ", "a b", "x/y", ".", "a.b", "a:b", "é"])
def test_derive_refuses_a_missing_or_illegal_namespace(bad: object) -> None:
    with pytest.raises(ConfigError, match="namespace"):
        derive(bad)


def test_a_dotted_role_and_a_dotted_namespace_never_share_a_group() -> None:
    # Before: "acme" + "billing.daily" and "acme.billing" + "daily" both gave the group
    # "acme.billing.daily", so two namespaces shared one consumer group.
    with pytest.raises(ConfigError, match=r"contains '\.'.*'acme-billing'.*upgrading"):
        derive("acme.billing")
    assert derive("acme").group_id("billing.daily") == "acme.billing.daily"


@pytest.mark.parametrize("namespace", ["acme", "acme-billing", "acme_billing", "a", "A9_-x"])
@pytest.mark.parametrize("role", ["daily", "billing.daily", "x.y.z", "daily/{{ ds }}", ".", ":"])
def test_namespace_and_role_come_back_from_every_derived_name(namespace: str, role: str) -> None:
    # Injective: the namespace is everything before the first "." of a group id, topic or
    # transactional id, so no two (namespace, role) pairs can share one.
    n = derive(namespace)
    group, txn = n.group_id(role), n.transactional_id_prefix + role
    assert group.split(".", 1) == [namespace, role]
    assert txn.split(".", 1) == [namespace, "ledger:" + role]
    assert n.leader_topic.split(".", 1) == [namespace, "neli"]
    assert n.ledger_topic.split(".", 1) == [namespace, "ledger"]


@pytest.mark.parametrize("role", ["daily", "deployment", "deploymentx.y", "x.deployment.y"])
def test_no_role_group_is_a_deployment_liveness_group(role: str) -> None:
    # "<ns>.deployment.<name>" is a deployment's liveness group: a role may not produce it.
    n = derive("acme")
    assert n.liveness_group("us-east-1") == "acme.deployment.us-east-1"
    assert not n.is_liveness_group(n.group_id(role))
    assert n.is_liveness_group(n.liveness_group("us-east-1"))
    with pytest.raises(ConfigError, match="reserved for deployments' liveness groups"):
        n.group_id("deployment.us-east-1")


def test_names_longer_than_kafka_allows_are_refused_at_construction() -> None:
    longest = "n" * (249 - len(".ledger"))
    assert len(derive(longest).ledger_topic) == 249
    with pytest.raises(ConfigError, match="1-242"):
        derive(longest + "n")
    with pytest.raises(ConfigError, match="ledger_topic"):
        derive("acme", ledger_topic="t" * 250)
    with pytest.raises(ConfigError, match="too long"):
        derive("acme").group_id("r" * 32767)
    with pytest.raises(ConfigError, match="role must be a non-empty string"):
        derive("acme").group_id("")


def test_the_three_front_doors_derive_the_same_names() -> None:
    a = plain("k:9092", "acme", "us-east-1")
    b = hooked("k:9092", "acme", "eu-west-1")
    c = resourced("k:9092", "acme", "ap-south-1")
    assert names(a, "daily") == names(b, "daily") == names(c, "daily") == (
        "acme.daily", "acme.neli", "acme.ledger", "acme.ledger:x")


def test_no_front_door_starts_without_a_namespace(monkeypatch) -> None:
    monkeypatch.delenv("AIRFLOW__NELI__NAMESPACE", raising=False)
    with pytest.raises(ConfigError, match="no namespace"):
        plain("k:9092", None, "us-east-1")
    with pytest.raises(ConfigError, match="no namespace"):
        hooked("k:9092", None, "us-east-1")
    # the Dagster resource refuses it when defined (pydantic validation, a ValueError)
    with pytest.raises(ValueError, match="no namespace"):
        resourced("k:9092", "", "us-east-1")


def test_a_group_id_set_beside_the_namespace_is_refused() -> None:
    # The old spelling made plain Python's groups differ from the integrations' ones.
    with pytest.raises(ConfigError, match="leave NeliConfig.group_id unset"):
        plain("k:9092", "acme", "us-east-1", group_id="acme")


@pytest.mark.kafka
def test_deployments_through_different_front_doors_share_group_and_ledger(
        kafka_broker: str) -> None:
    ns = f"fd{uuid.uuid4().hex[:8]}"
    timing = {"profile": "fast", "session_timeout": 6.0, "heartbeat_timeout": 2.0}
    east = Singleton(plain(kafka_broker, ns, "us-east-1", **timing))
    west = Singleton(hooked(kafka_broker, ns, "eu-west-1", **timing))
    south = Singleton(resourced(kafka_broker, ns, "ap-south-1", **timing))
    try:
        # Shared group: while the plain deployment's member leads, the hook's deployment sees
        # it in the role's group (and would not join; see the busy-group rule).
        from neli_orchestrate.core.neli import Neli

        member = Neli(east.config.role_neli("daily"))
        try:
            deadline = time.monotonic() + 30
            while not member.pulse(0.05):
                assert time.monotonic() < deadline, "the only member never led"
            assert west.role_members("daily") == 1
            assert south.role_members("daily") == 1
        finally:
            member.close()

        # Shared ledger: what the Dagster-configured deployment completes, the others skip.
        with south.claim("daily", "2013-01-05") as run:
            assert run.should_run
            token = run.token
        for other in (east, west):
            with other.claim("daily", "2013-01-05") as seen:
                assert seen.outcome is Outcome.SKIP_DONE, seen
                assert seen.record is not None and seen.record.token == token
                assert seen.record.deployment == "ap-south-1"
    finally:
        for singleton in (east, west, south):
            singleton.close()


def test_the_ledger_and_the_busy_check_keep_every_security_setting_of_the_member() -> None:
    # The ledger's clients and the busy check's admin client (over which members now run their
    # start-up checks) connect as the member does: TLS verification, OAUTHBEARER settings and
    # the token callback are security settings too, not member-only ones.
    def token(config: object) -> tuple[str, float]:
        return "token", time.time() + 60

    security = {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
                "oauth_cb": token, "enable.ssl.certificate.verification": False,
                "enable.sasl.oauthbearer.unsecure.jwt": True}
    config = SingletonConfig(
        neli=NeliConfig(bootstrap_servers="localhost:9092",
                        kafka_config={**security, "queued.min.messages": 5}),
        namespace="sec", deployment="d")
    kept = config.ledger_config().kafka_config
    assert {k: kept.get(k) for k in security} == security
    assert "queued.min.messages" not in kept  # a member's consumer setting stays its own
