"""Chaos suite: faults against real Airflow regions and a real Kafka broker (docs/chaos.md)."""
