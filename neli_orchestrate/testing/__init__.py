"""Test support: a real local Kafka broker and pytest fixtures (an opt-in plugin).

``__all__`` is :class:`LocalKafka`, the broker users start in their own tests; the rest stays in
its module: ``local_kafka`` (``LocalKafkaError``, ``KAFKA_VERSION``, ``ensure_kafka_libs``),
``secured_kafka``, ``spark_cluster``, ``memory_ledger``, ``pytest_plugin``.
"""

from neli_orchestrate.testing.local_kafka import LocalKafka

__all__ = ["LocalKafka"]
