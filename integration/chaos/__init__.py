"""Chaos suite: faults against real Airflow regions and a real Kafka broker.

See docs/internals/chaos.md.
"""
