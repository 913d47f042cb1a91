"""Test support: a real local Kafka broker and pytest fixtures (auto-loaded plugin)."""

from neli_orchestrate.testing.local_kafka import (
    KAFKA_VERSION,
    LocalKafka,
    LocalKafkaError,
    ensure_kafka_libs,
)

__all__ = ["KAFKA_VERSION", "LocalKafka", "LocalKafkaError", "ensure_kafka_libs"]
