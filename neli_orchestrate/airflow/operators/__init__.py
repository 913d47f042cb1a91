"""Operators of the neli-orchestrate Airflow provider."""
