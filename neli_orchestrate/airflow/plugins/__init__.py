"""Airflow plugins of the provider (loaded through the ``airflow.plugins`` entry point)."""
