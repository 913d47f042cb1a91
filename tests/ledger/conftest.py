"""Fixtures shared by the ledger's real-broker tests: a fresh topic, and ledgers closed after."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from neli_orchestrate.ledger.kafka import KafkaLedger


@pytest.fixture
def topic() -> str:
    return f"ledger.{uuid.uuid4().hex[:10]}"


@pytest.fixture
def ledgers() -> Iterator[list[KafkaLedger]]:
    """The ledgers a test opened (``ledger_helpers.open_ledger``), closed when it ends."""
    opened: list[KafkaLedger] = []
    yield opened
    for ledger in opened:
        ledger.close()
