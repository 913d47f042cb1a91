"""LocalKafkaCluster: three real KRaft nodes, RF 3 / min ISR 2; a killed leader is replaced."""

from __future__ import annotations

import logging
import time
import uuid

import pytest

from neli_orchestrate.testing.local_kafka import LocalKafkaCluster

pytestmark = [pytest.mark.kafka]


@pytest.mark.timeout(600)
def test_cluster_replicates_three_ways_and_survives_its_partition_leader_kill_9() -> None:
    from confluent_kafka import KafkaError, KafkaException, Producer
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

    with LocalKafkaCluster() as cluster:
        quiet = {"bootstrap.servers": cluster.bootstrap_servers,
                 "logger": logging.getLogger("test.librdkafka")}
        admin = AdminClient(quiet)
        topic = f"ledger-{uuid.uuid4().hex[:8]}"
        # replication factor -1: the broker default, as the ledger and leader topics do
        admin.create_topics([NewTopic(topic, 1, -1)])[topic].result(30)
        deadline = time.monotonic() + 60
        while True:
            # the answering broker may not list the new topic's partition yet (seen in CI)
            listed = admin.list_topics(topic, timeout=10).topics.get(topic)
            partition = listed.partitions.get(0) if listed is not None else None
            seen = (partition.replicas, partition.isrs) if partition is not None else None
            if seen is not None and len(seen[0]) == 3 and len(seen[1]) == 3:
                break
            assert time.monotonic() < deadline, f"partition 0 of {topic}: {seen}"
            time.sleep(0.5)
        while True:
            # the broker asked may not know the new topic yet either (UNKNOWN_TOPIC_OR_PART,
            # seen in CI): ask again until the deadline
            (result,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
            try:
                described = result.result(30)
                break
            except KafkaException as exc:
                assert exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART, exc
                assert time.monotonic() < deadline, f"{topic}: {exc}"
                time.sleep(0.5)
        assert described["min.insync.replicas"].value == "2"
        # Kafka's own failure handling and spread coordinators, unless a test asks for fast=True
        (broker,) = admin.describe_configs([ConfigResource("broker", "1")]).values()
        settings = broker.result(30)
        assert settings["broker.session.timeout.ms"].value == "9000"
        assert settings["replica.lag.time.max.ms"].value == "30000"
        assert settings["offsets.topic.num.partitions"].value == "6"
        assert settings["transaction.state.log.num.partitions"].value == "6"

        leader = cluster.leader_of(topic)
        cluster.kill(leader)
        producer = Producer({**quiet, "acks": "all", "message.timeout.ms": 60000})
        producer.produce(topic, b"after the kill")
        assert producer.flush(90) == 0
        deadline = time.monotonic() + 60
        while cluster.leader_of(topic) in (leader, -1):
            assert time.monotonic() < deadline, "no new leader"
            time.sleep(0.5)
        cluster.restart(leader)
