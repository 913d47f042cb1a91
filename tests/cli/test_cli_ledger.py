"""`neli-orchestrate ledger list|show|history` against a real broker and a real ledger."""

from __future__ import annotations

import json

import pytest
from cli_helpers import cli, new_namespace, singleton
from confluent_kafka import Producer

from neli_orchestrate.ledger.record import encode_key

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def ledger_ns(kafka_broker: str) -> str:
    """daily: 01..03 COMPLETED in us-east-1, 04 FAILED once then COMPLETED; hourly: 05 FAILED."""
    namespace = new_namespace()
    with singleton(kafka_broker, namespace, "us-east-1") as east:
        for key in ("2013-01-01", "2013-01-02", "2013-01-03"):
            with east.claim("daily", key) as run:
                assert run.should_run
        with pytest.raises(RuntimeError), east.claim("daily", "2013-01-04"):
            raise RuntimeError("spark job failed: out of memory")
        with pytest.raises(RuntimeError), east.claim("hourly", "2013-01-01T05"):
            raise RuntimeError("executor lost")
    with singleton(kafka_broker, namespace, "us-east-1") as east:
        with east.claim("daily", "2013-01-04") as run:
            assert run.should_run
    return namespace


def _args(kafka_broker: str, namespace: str) -> list[str]:
    return ["-b", kafka_broker, "-n", namespace]


def test_list_shows_the_latest_state_of_every_run_key(kafka_broker, ledger_ns) -> None:
    out = cli("ledger", "list", *_args(kafka_broker, ledger_ns), "--json")
    assert out.code == 0, out.stderr
    runs = {(r["role"], r["run_key"]): r for r in out.json()["runs"]}
    assert set(runs) == {("daily", "2013-01-01"), ("daily", "2013-01-02"),
                         ("daily", "2013-01-03"), ("daily", "2013-01-04"),
                         ("hourly", "2013-01-01T05")}
    assert runs[("daily", "2013-01-04")]["state"] == "COMPLETED"
    assert runs[("daily", "2013-01-04")]["attempt"] == 2
    assert runs[("hourly", "2013-01-01T05")]["state"] == "FAILED"
    assert runs[("hourly", "2013-01-01T05")]["reason"].startswith("RuntimeError: executor lost")
    assert {r["deployment"] for r in runs.values()} == {"us-east-1"}


def test_list_filters_by_role_state_and_run_key_range(kafka_broker, ledger_ns) -> None:
    args = _args(kafka_broker, ledger_ns)
    failed = cli("ledger", "list", *args, "--state", "failed", "--json").json()["runs"]
    assert [(r["role"], r["run_key"]) for r in failed] == [("hourly", "2013-01-01T05")]
    ranged = cli("ledger", "list", *args, "--role", "daily", "--from", "2013-01-02",
                 "--to", "2013-01-03", "--json").json()["runs"]
    assert [r["run_key"] for r in ranged] == ["2013-01-02", "2013-01-03"]
    table = cli("ledger", "list", *args, "--role", "hourly")
    assert table.code == 0 and "executor lost" in table.stdout and "2013-01-02" not in table.stdout


def test_history_shows_every_record_with_token_deployment_times_and_reason(
        kafka_broker, ledger_ns) -> None:
    out = cli("ledger", "history", *_args(kafka_broker, ledger_ns), "daily", "2013-01-04",
              "--json")
    assert out.code == 0, out.stderr
    records = out.json()["records"]
    states = [r["state"] for r in records]
    assert states == ["CLAIMED", "RUNNING", "FAILED", "CLAIMED", "RUNNING", "COMPLETED"] or \
        states == ["RUNNING", "FAILED", "RUNNING", "COMPLETED"]
    failed = next(r for r in records if r["state"] == "FAILED")
    done = records[-1]
    assert "out of memory" in failed["reason"]
    assert done["token"] > failed["token"], "the retry's claim has a larger token"
    assert all(r["deployment"] == "us-east-1" and r["at"] and r["member"] for r in records)
    offsets = [r["offset"] for r in records]
    assert offsets == sorted(offsets)


def test_show_of_an_unknown_run_key_fails_with_a_clear_message(kafka_broker, ledger_ns) -> None:
    out = cli("ledger", "show", *_args(kafka_broker, ledger_ns), "daily", "1999-01-01")
    assert out.code == 1
    assert "no record of role 'daily' run key '1999-01-01'" in out.stderr
    shown = cli("ledger", "show", *_args(kafka_broker, ledger_ns), "daily", "2013-01-02",
                "--json")
    assert shown.code == 0 and shown.json()["state"] == "COMPLETED"


def test_a_namespace_without_ledger_says_what_to_check(kafka_broker) -> None:
    out = cli("ledger", "list", "-b", kafka_broker, "-n", new_namespace())
    assert out.code == 1
    assert "cannot be read" in out.stderr and "namespace" in out.stderr


def test_a_malformed_record_is_reported_and_the_readable_runs_still_listed(kafka_broker) -> None:
    namespace = new_namespace()
    with singleton(kafka_broker, namespace, "us-east-1") as east, \
            east.claim("daily", "2013-02-01") as run:
        assert run.should_run
    producer = Producer({"bootstrap.servers": kafka_broker})
    producer.produce(f"{namespace}.ledger", key=encode_key("daily", "2013-02-02"),
                     value=b'{"v": 1, "state": "DONE"}')
    assert producer.flush(15) == 0
    out = cli("ledger", "list", "-b", kafka_broker, "-n", namespace, "--json")
    assert out.code == 0, out.stderr
    data = out.json()
    assert [r["run_key"] for r in data["runs"]] == ["2013-02-01"]
    assert len(data["warnings"]) == 1 and "unknown state 'DONE'" in data["warnings"][0]
    table = cli("ledger", "list", "-b", kafka_broker, "-n", namespace)
    assert "unreadable record" in table.stderr and "2013-02-02" in table.stderr
    history = cli("ledger", "history", "-b", kafka_broker, "-n", namespace, "daily",
                  "2013-02-02", "--json").json()
    assert "unknown state" in history["records"][0]["error"]


def test_a_recreated_ledger_whose_tokens_would_go_backwards_is_flagged(
        kafka_broker, kafka_admin) -> None:
    """A record carrying token 500 in a partition that ends at offset 1: the topic was
    recreated under the deployments' feet."""
    from confluent_kafka.admin import NewTopic

    namespace = new_namespace()
    topic = f"{namespace}.ledger"
    kafka_admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})])[
        topic].result(timeout=30)
    record = {"v": 1, "role": "daily", "run_key": "2013-03-01", "state": "COMPLETED",
              "token": 500, "deployment": "us-east-1", "member": "m#1", "attempt": 1,
              "at": 1.0e9, "reason": "", "handoff_deadline": None}
    producer = Producer({"bootstrap.servers": kafka_broker})
    producer.produce(topic, key=encode_key("daily", "2013-03-01"),
                     value=json.dumps(record).encode())
    assert producer.flush(15) == 0
    out = cli("ledger", "list", "-b", kafka_broker, "-n", namespace, "--json")
    assert out.code == 0
    warnings = out.json()["warnings"]
    assert len(warnings) == 1
    assert "holds token 500" in warnings[0] and "recreated" in warnings[0]


def test_reset_writes_an_audited_reset_with_a_larger_token(kafka_broker) -> None:
    namespace = new_namespace()
    with singleton(kafka_broker, namespace, "us-east-1") as east, \
            east.claim("daily", "2013-04-01") as run:
        assert run.should_run
    args = ["-b", kafka_broker, "-n", namespace]
    before = cli("ledger", "show", *args, "daily", "2013-04-01", "--json").json()
    out = cli("ledger", "reset", *args, "daily", "2013-04-01", "--deployment", "eu-west-1",
              "--reason", "alice: bad input data, rerun", "--json")
    assert out.code == 0, out.stderr
    after = cli("ledger", "show", *args, "daily", "2013-04-01", "--json").json()
    assert after["state"] == "RESET" and after["deployment"] == "eu-west-1"
    assert after["reason"] == "alice: bad input data, rerun"
    assert after["token"] > before["token"]
    history = cli("ledger", "history", *args, "daily", "2013-04-01", "--json").json()
    assert [r["state"] for r in history["records"]][-2:] == ["COMPLETED", "RESET"]
    # an unknown run key has nothing to reset; a reset needs a reason
    missing = cli("ledger", "reset", *args, "daily", "1999-01-01", "--deployment", "eu-west-1",
                  "--reason", "x")
    assert missing.code == 1 and "1999-01-01" in missing.stderr
    no_reason = cli("ledger", "reset", *args, "daily", "2013-04-01", "--deployment", "x")
    assert no_reason.code == 2 and "--reason" in no_reason.stderr
    # twice: nothing left to reset. As the gates' and steps' messages print the command (no
    # --deployment), the operator's host is recorded.
    again = cli("ledger", "reset", *args, "daily", "2013-04-01", "--reason", "bob: again")
    assert again.code == 1 and "already reset" in again.stderr
    with singleton(kafka_broker, namespace, "us-east-1") as east, \
            east.claim("daily", "2013-04-02") as run:
        assert run.should_run
    plain = cli("ledger", "reset", *args, "daily", "2013-04-02", "--reason", "bob: rerun",
                "--json")
    assert plain.code == 0, plain.stderr
    assert plain.json()["deployment"].startswith("cli@")


def test_an_application_a_failed_try_could_not_stop_shows_in_ledger_and_status(
        kafka_broker) -> None:
    # What a fenced Spark task records when it could not confirm its cluster-mode driver stopped
    # (tests/spark/test_spark_cluster.py runs it on a real cluster).
    from neli_orchestrate.errors import WorkNotStopped

    namespace = new_namespace()
    app = "standalone application driver-20130101000000-0007 on spark://10.0.0.5:6066"
    with singleton(kafka_broker, namespace, "us-east-1") as east:
        with pytest.raises(WorkNotStopped), east.claim("cluster", "2013-01-01"):
            raise WorkNotStopped("AirflowTaskTimeout: timed out; could not confirm",
                                 application=app)
        with east.claim("cluster", "2013-01-02") as run:
            assert run.should_run
    args = _args(kafka_broker, namespace)
    shown = cli("ledger", "show", *args, "cluster", "2013-01-01", "--json")
    assert shown.code == 0, shown.stderr
    data = shown.json()
    assert data["state"] == "FAILED" and data["unstopped"] == [app]
    assert [w for w in data["warnings"] if f"{app} may still be running" in w]
    assert cli("ledger", "show", *args, "cluster", "2013-01-02", "--json").json()["unstopped"] \
        is None
    listed = cli("ledger", "list", *args)
    assert listed.code == 0 and f"run '2013-01-01': {app} may still be running" in \
        " ".join(listed.stderr.split()), listed.stderr
    status = cli("status", *args, "--role", "cluster", "--json")
    assert status.code == 0, status.stderr
    (role,) = status.json()["roles"]
    assert [n for n in role["notes"] if f"{app} may still be running" in n], role["notes"]
