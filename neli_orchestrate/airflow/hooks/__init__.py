"""Hooks of the neli-orchestrate Airflow provider."""
