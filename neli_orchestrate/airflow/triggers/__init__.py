"""Triggers of the neli-orchestrate Airflow provider."""
