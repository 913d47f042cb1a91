"""`neli-orchestrate status` and `doctor` against a real broker."""

from __future__ import annotations

import threading

import pytest
from cli_helpers import cli, new_namespace, singleton

from neli_orchestrate.core.config import PROFILES

pytestmark = pytest.mark.kafka


def test_status_names_the_member_and_deployment_that_lead_from_its_heartbeats(
        kafka_broker) -> None:
    namespace = new_namespace()
    holding, release = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def lead() -> None:
        with singleton(kafka_broker, namespace, "eu-west-1") as west, \
                west.claim("hourly", "2013-01-01T05") as run:
            assert run.should_run
            record = west.status("hourly", "2013-01-01T05")
            seen["member"] = record.member if record else None
            holding.set()
            release.wait(120)

    thread = threading.Thread(target=lead)
    thread.start()
    try:
        assert holding.wait(120), "the leader did not start"
        out = cli("status", "-b", kafka_broker, "-n", namespace, "--json")
        assert out.code == 0, out.stderr
        roles = {r["role"]: r for r in out.json()["roles"]}
        hourly = roles["hourly"]
        assert hourly["group"] == f"{namespace}.hourly"
        assert hourly["state"] == "stable"
        # NeliConfig's group_protocol="auto" takes KIP-848 on this broker; the session is then
        # a group setting the member wrote at the broker, and status reads it back
        assert hourly["protocol"] in ("classic", "consumer")
        if hourly["protocol"] == "consumer":
            # the default profile's session, as the member wrote it at the broker
            assert hourly["session_timeout_ms"] == PROFILES["default"].session_timeout * 1000
            assert hourly["session_source"] == "group config"
        assert len(hourly["members"]) == 1
        assert hourly["leader_member"] == seen["member"]
        assert hourly["leader_deployment"] == "eu-west-1"
        # the timeline ends with the leader's spell, which started when it began to lead
        spell = hourly["timeline"][-1]
        assert (spell["member"], spell["deployment"]) == (seen["member"], "eu-west-1")
        assert hourly["leader_since"] == spell["start"] <= spell["end"]
        assert hourly["lag"] is not None and hourly["lag"] >= 0
        table = cli("status", "-b", kafka_broker, "-n", namespace, "--role", "hourly")
        assert "eu-west-1" in table.stdout and str(seen["member"]) in table.stdout
        assert max(len(line) for line in table.stdout.splitlines()) <= 120, table.stdout
    finally:
        release.set()
        thread.join(60)
    after = cli("status", "-b", kafka_broker, "-n", namespace, "--role", "hourly", "--json")
    hourly = after.json()["roles"][0]
    assert hourly["members"] == [] and hourly["leader_member"] is None


def test_status_says_a_run_whose_work_skipped_itself_was_skipped_by_the_task_there(
        kafka_broker) -> None:
    from neli_orchestrate.errors import WorkSkipped

    namespace = new_namespace()
    with singleton(kafka_broker, namespace, "us-east-1") as east:
        with east.claim("daily", "2013-01-02") as run:
            assert run.should_run
            raise WorkSkipped("exit code 99: no flights")
        done = east.status("daily", "2013-01-02")
    assert done is not None
    out = cli("status", "-b", kafka_broker, "-n", namespace, "--role", "daily", "--json")
    assert out.code == 0, out.stderr
    last = out.json()["roles"][0]["last_run"]
    assert last.startswith(f"run '2013-01-02': skipped by the task in us-east-1 (token "
                           f"{done.token}, at "), last
    table = cli("status", "-b", kafka_broker, "-n", namespace, "--role", "daily")
    assert "skipped by the task in us-east-1" in " ".join(table.stdout.split()), table.stdout


def test_doctor_passes_on_the_plain_broker_having_tried_every_permission(kafka_broker) -> None:
    namespace = new_namespace()
    with singleton(kafka_broker, namespace, "us-east-1") as east, east.claim("daily", "d1"):
        pass
    out = cli("doctor", "-b", kafka_broker, "-n", namespace, "--json")
    assert out.code == 0, out.stdout + out.stderr
    findings = out.json()["findings"]
    assert all(f["level"] != "error" for f in findings), findings
    text = "\n".join(f["message"] for f in findings if f["level"] == "ok")
    for tried in ("DESCRIBE on leader topic", "DESCRIBE on ledger topic", "DESCRIBE on groups",
                  "READ on groups", "WRITE on leader topic", "init_transactions",
                  "transactional WRITE on ledger topic", "is compacted", "KIP-848",
                  "off the broker's"):
        assert tried in text, f"{tried!r} missing from {text}"
    # the probes leave nothing a reader acts on: the ledger lists only the real run
    runs = cli("ledger", "list", "-b", kafka_broker, "-n", namespace, "--json").json()
    assert [(r["role"], r["run_key"]) for r in runs["runs"]] == [("daily", "d1")]
    assert runs["warnings"] == []


def test_doctor_fails_on_a_ledger_topic_that_retention_would_empty(kafka_broker,
                                                                    kafka_admin) -> None:
    from confluent_kafka.admin import NewTopic

    namespace = new_namespace()
    topic = f"{namespace}.ledger"
    kafka_admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "delete"})])[
        topic].result(timeout=30)
    out = cli("doctor", "-b", kafka_broker, "-n", namespace)
    assert out.code == 1
    assert "cleanup.policy=delete" in out.stdout
    assert "cleanup.policy=compact" in out.stdout  # the fix


def test_doctor_fails_fast_on_an_unreachable_broker_with_the_fix(kafka_broker) -> None:
    out = cli("doctor", "-b", "127.0.0.1:1", "-n", "acme", "--timeout", "2", "--json",
              timeout=60)
    assert out.code == 1
    [finding] = out.json()["findings"]
    assert finding["level"] == "error" and "127.0.0.1:1" in finding["message"]
    assert "security.protocol" in finding["fix"]


def test_doctor_rejects_timeouts_that_break_exclusivity(kafka_broker) -> None:
    out = cli("doctor", "-b", kafka_broker, "-n", "acme", "--session-timeout", "3",
              "--heartbeat-timeout", "2.9", "--json")
    assert out.code == 1
    [finding] = out.json()["findings"]
    assert "heartbeat_timeout=2.9 s is too long for session_timeout=3 s" in finding["message"]


def test_status_and_ledger_on_an_unreachable_broker_end_within_the_timeout() -> None:
    status = cli("status", "-b", "127.0.0.1:1", "-n", "acme", "--timeout", "2", timeout=60)
    assert status.code == 1 and "127.0.0.1:1" in status.stderr
    ledger = cli("ledger", "list", "-b", "127.0.0.1:1", "-n", "acme", "--timeout", "2",
                 timeout=60)
    assert ledger.code == 1 and "cannot reach Kafka at 127.0.0.1:1" in ledger.stderr


def test_bad_options_name_the_option() -> None:
    out = cli("ledger", "list", "-n", "acme", "-X", "no-equals-sign")
    assert out.code == 2 and "-X" in out.stderr and "key=value" in out.stderr
    out = cli("ledger", "list", "-n", "acme", "-X", "transactional.id=x")
    assert out.code == 2 and "transactional.id" in out.stderr
    out = cli("status", "-n", "bad namespace!")
    assert out.code == 2 and "cannot prefix Kafka topic names" in out.stderr


def test_there_is_no_default_namespace(monkeypatch) -> None:
    monkeypatch.delenv("NELI_NAMESPACE", raising=False)
    out = cli("ledger", "list")
    assert out.code == 2 and "--namespace" in out.stderr


def test_version_names_the_installed_release() -> None:
    from neli_orchestrate import __version__

    for flag in ("--version", "-V"):
        out = cli(flag)
        assert out.code == 0 and out.stdout.strip() == f"neli-orchestrate {__version__}", out


def test_help_texts_speak_the_command_line_not_python() -> None:
    for command in (["status"], ["ledger", "list"], ["ledger", "history"], ["doctor"], ["run"],
                    ["kafka", "start"]):
        out = cli(*command, "--help")
        assert out.code == 0 and "None" not in out.stdout, (command, out.stdout)


def test_status_tables_fold_long_cells_to_fit_120_columns(capsys) -> None:
    from neli_orchestrate.cli._output import table
    from neli_orchestrate.cli.status import WHOLE, WIDTH

    role = "nycflights_daily/" + "backfill-" * 8 + "2013-01-03"
    table("roles", ["role", "state", "protocol", "members", "leader", "since (UTC)",
                    "heartbeat", "session", "lag"],
          [(role, "stable", "consumer", 2, "us-east-1", "2026-11-27 20:58:35", "0.4 s ago",
            "10 s (group config)", 0)], width=WIDTH, whole=WHOLE)
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 120, lines
    assert "2026-11-27 20:58:35" in "\n".join(lines)  # short cells stay whole
