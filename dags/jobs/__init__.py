"""PySpark applications of the example DAGs, shared with the Dagster example."""
