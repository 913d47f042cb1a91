"""Bad input the other suites do not cover: each gives a clear, actionable error and loses nothing.

Covered elsewhere: invalid NeliConfig values and relationships (tests/core/test_core_config.py),
invalid connections and a connection of the wrong type (tests/airflow/test_hook.py), a
misconfigured Dagster resource (tests/dagster/test_dagster_resource.py), a malformed ledger
record (tests/ledger/, tests/cli/test_cli_ledger.py), the CLI's options (tests/cli/).
"""

from __future__ import annotations

import time
import uuid

import pytest

from neli_orchestrate import KafkaUnavailableError, NeliConfig, Singleton, SingletonConfig


def _singleton(bootstrap: str, namespace: str, cache: object = "", **neli: object) -> Singleton:
    """``cache``: a replay-cache directory, "" for memory only (the default here), None: off."""
    return Singleton(SingletonConfig(neli=NeliConfig(bootstrap_servers=bootstrap, **neli),
                                     namespace=namespace, deployment="us-east-1",
                                     acquire_timeout=30, ledger_replay_cache=cache is not None,
                                     ledger_replay_cache_dir=None if cache is None
                                     else str(cache)))


def test_an_unreachable_broker_fails_the_claim_within_its_request_timeout() -> None:
    started = time.monotonic()
    with _singleton("127.0.0.1:1", "acme", request_timeout=2.0) as single, \
            pytest.raises(KafkaUnavailableError) as info:
        with single.claim("daily", "2013-01-01"):
            pytest.fail("the work must not run without the cluster")
    assert "127.0.0.1:1" in str(info.value)
    # a bounded wait: a few request timeouts, never the 30 s acquire timeout or forever
    assert time.monotonic() - started < 25


@pytest.mark.kafka
def test_a_recreated_ledger_is_refused_here_and_cannot_overwrite_output_from_elsewhere(
        kafka_broker, kafka_admin, tmp_path) -> None:
    """The ledger topic was deleted and recreated: it forgot the run, and its offsets (the
    tokens) restart at 0. A host that holds a replay checkpoint of the old topic refuses to
    claim (tokens would go backwards) and says what to do; a host without one (cache off, a
    new container) runs the run key again, but the token-checked sink refuses the smaller
    token, so the published output is not lost either way."""
    from neli_orchestrate import StaleTokenError
    from neli_orchestrate.ledger.record import LedgerError
    from neli_orchestrate.spark import TokenCommitGuard

    namespace = f"bad{uuid.uuid4().hex[:8]}"
    cache = tmp_path / "replay-cache"
    guard = TokenCommitGuard(tmp_path / "daily_table")
    with _singleton(kafka_broker, namespace, cache=cache) as single:
        topic = single.config.names.ledger_topic
        for key in ("2013-01-01", "2013-01-02", "2013-01-03"):
            with single.claim("daily", key):
                pass
        with single.claim("daily", "2013-01-04") as run:
            assert run.token is not None and run.token > 0
            first = run.token
            with guard.stage("2013-01-04", token=run.token, role="daily") as staged:
                (staged.path / "part-0").write_text("first run")
    kafka_admin.delete_topics([topic], operation_timeout=30)[topic].result(timeout=60)
    deadline = time.monotonic() + 60
    while topic in kafka_admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"{topic} was not deleted"
        time.sleep(0.2)

    # This host's checkpoint remembers the old topic's tokens: no claim, a clear error.
    with _singleton(kafka_broker, namespace, cache=cache) as single, \
            pytest.raises(LedgerError, match="recreated or rewritten"):
        with single.claim("daily", "2013-01-04"):
            pytest.fail("a recreated ledger must not hand out a smaller token")

    # A host with no checkpoint of the old topic: the sink is the last line.
    with _singleton(kafka_broker, namespace, cache=None) as single, \
            single.claim("daily", "2013-01-04") as run:
        assert run.should_run, "the recreated ledger forgot the run"
        assert run.token is not None and run.token < first, "tokens went backwards"
        with pytest.raises(StaleTokenError), \
                guard.stage("2013-01-04", token=run.token, role="daily"):
            pytest.fail("a stale token must not get a staging directory")
    published = guard.committed("2013-01-04")
    assert published is not None and published.token == first
    assert (guard.output_path("2013-01-04") / "part-0").read_text() == "first run"


def test_a_missing_airflow_connection_says_how_to_create_it(monkeypatch, tmp_path) -> None:
    pytest.importorskip("airflow")
    from neli_orchestrate.airflow.hooks.neli import NeliHook
    from neli_orchestrate.errors import ConfigError

    monkeypatch.delenv("AIRFLOW_CONN_NELI_MISSING", raising=False)
    with pytest.raises(ConfigError) as info:
        NeliHook(neli_conn_id="neli_missing").settings  # noqa: B018
    text = str(info.value)
    assert "'neli_missing' is not defined" in text
    assert "airflow connections add neli_missing --conn-type neli" in text
    assert "AIRFLOW_CONN_NELI_MISSING" in text
