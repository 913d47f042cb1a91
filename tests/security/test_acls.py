"""The documented ACLs are exactly what a deployment needs, and a missing one fails at once.

Against a broker with SASL/SCRAM and the StandardAuthorizer (``secured_kafka``): a principal
holding exactly ``required_acls(config, principal)`` runs every step of a singleton run; with
any one rule removed, the first step that needs it raises ``AuthorizationError`` naming the
rule, without waiting for leadership and without claiming that another member leads.
"""

from __future__ import annotations

import logging
import secrets
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from neli_orchestrate import NeliConfig, Outcome, Singleton, SingletonConfig
from neli_orchestrate.acls import Acl, required_acls
from neli_orchestrate.errors import (
    AuthorizationError,
    KafkaUnavailableError,
    PermanentKafkaError,
)
from neli_orchestrate.ledger.record import RunState

pytestmark = pytest.mark.kafka

# Wide margins: 2 busy cores. acquire_timeout is long so that "waited for leadership" and
# "failed at once" cannot be confused.
TIMINGS = {"profile": "fast", "session_timeout": 20.0, "heartbeat_timeout": 8.0}
ACQUIRE_TIMEOUT = 300.0


def password() -> str:
    return f"pw-{secrets.token_hex(8)}-never-logged"


@pytest.fixture
def principal(secured_kafka) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """A fresh SCRAM user without any ACL: its librdkafka settings."""
    name = f"svc-{uuid.uuid4().hex[:8]}"
    yield secured_kafka.add_user(name, password())


def config_for(settings: dict[str, Any], *, protocol: str = "consumer",
               **singleton: Any) -> SingletonConfig:
    namespace = f"s{uuid.uuid4().hex[:8]}"
    kafka_config = {k: v for k, v in settings.items() if k != "bootstrap.servers"}
    neli = NeliConfig(bootstrap_servers=settings["bootstrap.servers"],
                      kafka_config=kafka_config, group_protocol=protocol, **TIMINGS)
    singleton.setdefault("acquire_timeout", ACQUIRE_TIMEOUT)
    return SingletonConfig(neli=neli, deployment="us-east-1", namespace=namespace,
                           handoff_timeout=60.0, **singleton)


def user_of(settings: dict[str, Any]) -> str:
    return f"User:{settings['sasl.username']}"


def whole_flow(singleton: Singleton) -> list[tuple[str, int]]:
    """Every step of singleton runs: claim, split reserve/execute, skip, status, members."""
    executed: list[tuple[str, int]] = []
    with singleton.claim("export", "2013-01-01") as run:
        assert run.should_run, run
        assert run.token is not None
        executed.append(("export", run.token))
    reservation = singleton.reserve("load", "2013-01-01")
    assert reservation.should_run, reservation
    singleton.execute("load", "2013-01-01", reservation.token,
                      lambda run: executed.append(("load", run.token)))
    with singleton.claim("export", "2013-01-01") as again:
        assert again.outcome is Outcome.SKIP_DONE, again
    # a closed member leaves its group a moment later (the broker acknowledges the leave)
    deadline = time.monotonic() + 60
    while singleton.role_members("export") != 0:
        assert time.monotonic() < deadline, "the closed member never left the group"
        time.sleep(0.1)
    return executed


def describe_only(acls: list[Acl]) -> list[Acl]:
    """``acls`` with the group READ replaced by DESCRIBE: the role's members can be counted
    (the busy-group check passes) but the member may not join."""
    [read] = [a for a in acls if a.resource_type == "group" and a.operation == "read"]
    return [a for a in acls if a != read] + [
        Acl(read.principal, "describe", "group", read.name, read.pattern)]


def assert_no_secret(secret: str, *texts: str) -> None:
    for text in texts:
        assert secret not in text


def test_exactly_the_documented_acls_run_the_whole_singleton_flow(
        secured_kafka, principal, caplog, capfd) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)
    config = config_for(principal)
    acls = required_acls(config, user_of(principal))
    secured_kafka.grant(acls)
    with Singleton(config) as singleton:
        executed = whole_flow(singleton)
        assert [role for role, _ in executed] == ["export", "load"]
        for role, token in executed:
            latest = singleton.status(role, "2013-01-01")
            assert latest is not None and latest.state is RunState.COMPLETED
            assert latest.token == token
    # the authorizer is on: the same principal may not touch another namespace's ledger
    other = config_for(principal)
    with Singleton(other) as outsider, pytest.raises(AuthorizationError):
        outsider.status("export", "2013-01-01")
    logged = "\n".join(f"{r.name} {r.getMessage()}" for r in caplog.records)
    out, err = capfd.readouterr()
    assert_no_secret(principal["sasl.password"], logged, out, err)


def test_librdkafka_debug_logs_of_every_client_never_contain_the_password(
        secured_kafka, principal, caplog, capfd) -> None:  # type: ignore[no-untyped-def]
    # Debug logging makes every client slow (each line goes through Python logging on the
    # polling thread): this test leads and reads, it does not hold a run under a lease.
    caplog.set_level(logging.DEBUG)
    config = config_for({**principal, "debug": "security,conf"})
    secured_kafka.grant(required_acls(config, user_of(principal)))
    with Singleton(config) as singleton:
        assert singleton.leads("export", timeout=120.0)   # member: admin, consumer, producer
        assert singleton.status("export", "2013-01-01") is None   # ledger replay consumer
        assert singleton.role_members("export") == 0              # admin of role_members
    logged = "\n".join(f"{r.name} {r.getMessage()}" for r in caplog.records)
    assert "SCRAM" in logged, "librdkafka's SASL debug log was not captured"
    out, err = capfd.readouterr()
    assert_no_secret(principal["sasl.password"], logged, out, err)


def _rule_cases() -> list[Any]:
    cases = [
        ("read", "group", "member"), ("alter_configs", "group", "member"),
        ("read", "topic", "leader"), ("write", "topic", "leader"),
        ("create", "topic", "leader"),
        ("read", "topic", "ledger"), ("write", "topic", "ledger"),
        ("create", "topic", "ledger"), ("write", "transactional_id", "ledger"),
    ]
    return [pytest.param(*case, id=f"{case[0]}-{case[1]}-{case[2]}") for case in cases]


def _pick(acls: list[Acl], operation: str, rtype: str, which: str,
          config: SingletonConfig) -> Acl:
    names = {"leader": config.names.leader_topic, "ledger": config.names.ledger_topic}
    found = [a for a in acls if a.operation == operation and a.resource_type == rtype
             and (rtype != "topic" or a.name == names[which])]
    assert len(found) == 1, (operation, rtype, which, acls)
    return found[0]


@pytest.mark.parametrize(("operation", "rtype", "which"), _rule_cases())
def test_each_missing_acl_fails_at_once_naming_what_to_grant(
        secured_kafka, principal, caplog, operation, rtype, which) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)
    config = config_for(principal)
    acls = required_acls(config, user_of(principal))
    missing = _pick(acls, operation, rtype, which, config)
    secured_kafka.grant([a for a in acls if a != missing])
    started = time.monotonic()
    with Singleton(config) as singleton, pytest.raises(AuthorizationError) as denied:
        whole_flow(singleton)
    # "at once": it never waited for leadership (which would take acquire_timeout)
    assert time.monotonic() - started < ACQUIRE_TIMEOUT / 2
    message = str(denied.value)
    assert operation.upper() in message, message
    assert missing.name.rstrip(".:") in message, message
    assert "docs/guide/security.md" in message
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "another member leads" not in logged
    assert_no_secret(principal["sasl.password"], message, logged)


def test_without_describe_configs_on_the_ledger_the_run_proceeds_with_a_warning(
        secured_kafka, principal, caplog) -> None:  # type: ignore[no-untyped-def]
    config = config_for(principal)
    acls = required_acls(config, user_of(principal))
    missing = _pick(acls, "describe_configs", "topic", "ledger", config)
    secured_kafka.grant([a for a in acls if a != missing])
    with Singleton(config) as singleton:
        assert len(whole_flow(singleton)) == 2
    assert any("cannot verify cleanup.policy" in r.getMessage() for r in caplog.records)


def test_role_members_without_the_group_acl_is_an_authorization_error(
        secured_kafka, principal) -> None:  # type: ignore[no-untyped-def]
    config = config_for(principal)
    with Singleton(config) as singleton, pytest.raises(AuthorizationError, match="READ"):
        singleton.role_members("export")


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_the_check_catches_a_denied_group_mistaken_for_a_busy_or_unreachable_one(
        secured_kafka, principal, caplog, monkeypatch, protocol) -> None:  # type: ignore[no-untyped-def]
    """Mutation: without the mapping, a denied group is the defect of issue 9 item 8 — a WAIT
    saying another member leads (classic), or "Kafka unavailable", which callers wait on
    (KIP-848) — and never the AuthorizationError the tests above require."""
    import neli_orchestrate.core.neli as neli_module

    monkeypatch.setattr(neli_module, "authorization_denied", lambda code, message="": False)
    caplog.set_level(logging.INFO)
    config = config_for(principal, protocol=protocol, acquire_timeout=5.0)
    secured_kafka.grant(describe_only(required_acls(config, user_of(principal))))
    with Singleton(config) as singleton:
        if protocol == "classic":
            reservation = singleton.reserve("export", "2013-01-01")
            assert reservation.outcome is Outcome.WAIT
            assert any("another member leads" in r.getMessage() for r in caplog.records)
        else:
            with pytest.raises(KafkaUnavailableError) as unavailable:
                singleton.reserve("export", "2013-01-01")
            assert not isinstance(unavailable.value, AuthorizationError)


def test_classic_groups_need_no_group_config_acl(
        secured_kafka, principal) -> None:  # type: ignore[no-untyped-def]
    config = config_for(principal, protocol="classic")
    acls = required_acls(config, user_of(principal))
    assert not [a for a in acls if a.resource_type == "group" and a.operation != "read"]
    secured_kafka.grant(acls)
    with Singleton(config) as singleton:
        assert len(whole_flow(singleton)) == 2


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_member_denied_its_group_fails_at_once(
        secured_kafka, principal, caplog, protocol) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO)
    config = config_for(principal, protocol=protocol)
    secured_kafka.grant(describe_only(required_acls(config, user_of(principal))))
    started = time.monotonic()
    with Singleton(config) as singleton, pytest.raises(AuthorizationError, match="READ") as denied:
        singleton.reserve("export", "2013-01-01")
    assert time.monotonic() - started < ACQUIRE_TIMEOUT / 2
    assert config.role_neli("export").resolved.group_id in str(denied.value)
    assert not any("another member leads" in r.getMessage() for r in caplog.records)


def test_a_wrong_password_is_a_permanent_error_that_does_not_echo_it(
        secured_kafka, principal, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)
    wrong = password()
    config = config_for({**principal, "sasl.password": wrong})
    secured_kafka.grant(required_acls(config, user_of(principal)))
    started = time.monotonic()
    with Singleton(config) as singleton, pytest.raises(PermanentKafkaError) as refused:
        singleton.reserve("export", "2013-01-01")
    assert time.monotonic() - started < ACQUIRE_TIMEOUT / 2
    message = str(refused.value)
    assert "sasl.username" in message and "sasl.password" in message, message
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert_no_secret(wrong, message, logged)
    assert_no_secret(principal["sasl.password"], message, logged)
