"""Gate decisions through the per-host replay cache, one Singleton per task as in Airflow.

Each step builds a new ``Singleton`` (a new ledger client with an empty memory: what a new
Airflow task process on the same host is) that shares the host's cache directory, and
asserts on the decisions and tokens that came out.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from neli_orchestrate import NeliConfig, Outcome, Singleton, SingletonConfig
from neli_orchestrate.ledger.record import LedgerError

pytestmark = pytest.mark.kafka

ROLE = "daily_flights"


def task(bootstrap: str, namespace: str, cache: Path | None, deployment: str = "us") -> Singleton:
    # A 2 s lease: the shared test machine stalls processes for over a second at times.
    neli = NeliConfig(bootstrap_servers=bootstrap, profile="fast", session_timeout=6.0,
                      heartbeat_timeout=2.0)
    return Singleton(SingletonConfig(
        neli=neli, namespace=namespace, deployment=deployment, acquire_timeout=30,
        ledger_replay_cache=cache is not None,
        ledger_replay_cache_dir=None if cache is None else str(cache)))


def run_once(bootstrap: str, namespace: str, cache: Path, run_key: str) -> int:
    """Gate, then executor, in two tasks; returns the token the work ran under."""
    with task(bootstrap, namespace, cache) as gate:
        reservation = gate.reserve(ROLE, run_key)
    assert reservation.outcome is Outcome.RUN, reservation
    assert reservation.token is not None
    with task(bootstrap, namespace, cache) as executor:
        return executor.execute(ROLE, run_key, reservation.token, lambda run: run.token)


def test_tasks_on_one_host_decide_from_the_checkpoint_and_honour_a_later_expiry(
    kafka_broker: str, tmp_path: Path,
) -> None:
    namespace = f"cache{uuid.uuid4().hex[:8]}"
    host = tmp_path / "host-a"
    first = run_once(kafka_broker, namespace, host, "2013-01-01")
    assert list(host.glob("*.json")), "the host wrote no checkpoint"

    with task(kafka_broker, namespace, host) as gate:
        assert gate.reserve(ROLE, "2013-01-01").outcome is Outcome.SKIP_DONE

    # Another host (no cache) expires the finished run key: a tombstone after the checkpoint.
    with task(kafka_broker, namespace, None, deployment="eu") as other:
        assert other.expire(ROLE, retention=0.0) == ["2013-01-01"]

    again = run_once(kafka_broker, namespace, host, "2013-01-01")
    assert again > first


def test_a_gate_refuses_to_claim_after_the_ledger_topic_was_recreated(
    kafka_broker: str, kafka_admin: Any, tmp_path: Path,
) -> None:
    namespace = f"cache{uuid.uuid4().hex[:8]}"
    host = tmp_path / "host-a"
    for day in ("01", "02", "03"):
        run_once(kafka_broker, namespace, host, f"2013-01-{day}")
    topic = f"{namespace}.ledger"
    kafka_admin.delete_topics([topic], operation_timeout=15)[topic].result(timeout=30)
    deadline = time.monotonic() + 30
    while topic in kafka_admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, "the deleted topic never went away"
        time.sleep(0.1)

    with task(kafka_broker, namespace, host) as gate:   # recreates the topic, empty
        with pytest.raises(LedgerError, match="backwards"):
            gate.reserve(ROLE, "2013-01-04")
    # The refusal wrote nothing: the recreated ledger holds no claim.
    with task(kafka_broker, namespace, None) as observer:
        assert observer.status(ROLE, "2013-01-04") is None


def test_a_first_replay_from_offset_zero_happens_before_joining_not_while_leading(
    kafka_broker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from neli_orchestrate.ledger.kafka import KafkaLedger
    from neli_orchestrate.singleton import leadership as singleton_module

    namespace = f"cache{uuid.uuid4().hex[:8]}"
    run_once(kafka_broker, namespace, tmp_path / "host-a", "2013-01-01")
    events: list[str] = []
    fold, leadership = KafkaLedger._fold, singleton_module._Leadership.__init__

    def spy_fold(self: KafkaLedger, builder: Any, role: str, tp: Any, start: int, *rest: Any
                 ) -> int:
        events.append("fold from 0" if start == 0 else "fold tail")
        return fold(self, builder, role, tp, start, *rest)

    def spy_join(self: Any, *args: Any) -> None:
        events.append("join")
        leadership(self, *args)

    monkeypatch.setattr(KafkaLedger, "_fold", spy_fold)
    monkeypatch.setattr(singleton_module._Leadership, "__init__", spy_join)
    with task(kafka_broker, namespace, tmp_path / "host-b") as gate:   # a host without cache
        reservation = gate.reserve(ROLE, "2013-01-02")
    assert reservation.outcome is Outcome.RUN, reservation
    assert events.index("fold from 0") < events.index("join")
    assert "fold from 0" not in events[events.index("join"):]
