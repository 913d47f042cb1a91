"""Sensors of the neli-orchestrate Airflow provider."""
