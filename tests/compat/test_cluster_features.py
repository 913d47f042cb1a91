"""A cluster lacking what the ledger and the member need is refused at start, naming the feature.

One real broker (the pinned release) configured to deny all three: KIP-848 groups
(``group.coordinator.rebalance.protocols=classic``), log compaction (``log.cleaner.enable=false``)
and transactions (``transaction.state.log.replication.factor=3`` on one node, so the
transaction coordinator can never create ``__transaction_state``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from neli_orchestrate import NeliConfig, Singleton, SingletonConfig
from neli_orchestrate.core.neli import Neli
from neli_orchestrate.errors import ConfigError
from neli_orchestrate.ledger.kafka import KafkaLedger, KafkaLedgerConfig
from neli_orchestrate.testing.local_kafka import LocalKafka, LocalKafkaError

pytestmark = pytest.mark.kafka

DENY = {"group.coordinator.rebalance.protocols": "classic", "log.cleaner.enable": "false",
        "transaction.state.log.replication.factor": "3"}


class _BrokerWithoutTransactions(LocalKafka):
    def _warm_up(self, conf: dict[str, object], consumer: object, deadline: float) -> None:
        # the stock warm-up loads the transaction coordinator, which this broker cannot
        consumer.commit(asynchronous=False)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def denying_broker() -> Iterator[str]:
    kafka = _BrokerWithoutTransactions(properties=DENY)
    try:
        kafka.start()
    except LocalKafkaError as exc:
        kafka.stop()
        pytest.fail(f"Kafka broker could not start: {exc}", pytrace=False)
    try:
        yield kafka.bootstrap_servers
    finally:
        kafka.stop()


def test_a_kip_848_member_on_a_classic_only_broker_is_refused_naming_kip_848(
        denying_broker: str) -> None:
    config = NeliConfig(bootstrap_servers=denying_broker, group_id=f"g{uuid.uuid4().hex[:8]}",
                        profile="fast", group_protocol="consumer")
    with pytest.raises(ConfigError, match=r"lacks the KIP-848 consumer group protocol.*"
                                          r"group.coordinator.rebalance.protocols=classic"):
        Neli(config)
    # auto takes classic there, and leads
    with Neli(NeliConfig(bootstrap_servers=denying_broker, profile="fast",
                         group_id=f"g{uuid.uuid4().hex[:8]}")) as member:
        assert member.pulse(timeout=30)


def test_a_cluster_without_log_compaction_is_refused_by_the_ledger(denying_broker: str) -> None:
    ledger = KafkaLedger(KafkaLedgerConfig(bootstrap_servers=denying_broker,
                                           topic=f"l{uuid.uuid4().hex[:8]}.ledger"))
    with ledger, pytest.raises(ConfigError, match=r"lacks what the run ledger needs: log compaction"
                                                  r".*log.cleaner.enable=false"):
        ledger.replay("role")


def test_a_cluster_whose_transactions_cannot_work_is_refused_before_any_claim(
        denying_broker: str) -> None:
    ledger = KafkaLedger(KafkaLedgerConfig(bootstrap_servers=denying_broker,
                                           topic=f"l{uuid.uuid4().hex[:8]}.ledger"))
    with ledger, pytest.raises(ConfigError, match=r"; and working transactions.*"
                                                  r"transaction.state.log.replication.factor=3"):
        ledger.replay("role")
    # the singleton, as a user meets it: the claim fails at once with the same reason
    single = Singleton(SingletonConfig(
        neli=NeliConfig(bootstrap_servers=denying_broker, profile="fast"),
        namespace=f"ns{uuid.uuid4().hex[:8]}", deployment="us-east-1", acquire_timeout=30))
    with single, pytest.raises(ConfigError, match="working transactions"):
        with single.claim("role", "2013-01-05"):
            pass
