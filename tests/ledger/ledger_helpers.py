"""Opening a ledger in the real-broker tests (the ``ledgers`` fixture of conftest closes it)."""

from __future__ import annotations

from typing import Any

from neli_orchestrate.ledger.kafka import KafkaLedger, KafkaLedgerConfig


def open_ledger(ledgers: list[KafkaLedger], bootstrap: str, topic: str,
                **settings: Any) -> KafkaLedger:
    """A :class:`KafkaLedger` on ``topic`` with short test timeouts (10 s unless ``settings``
    say otherwise), closed with the test's ``ledgers``."""
    settings = {"request_timeout": 10.0, "replay_timeout": 10.0, **settings}
    ledger = KafkaLedger(KafkaLedgerConfig(bootstrap_servers=bootstrap, topic=topic, **settings))
    ledgers.append(ledger)
    return ledger
