"""Spark side of fencing: token conf for spark-submit, token-checked sinks, job cancellation.

- :func:`neli_spark_conf` / :func:`read_neli_conf`: hand the run's claim to the job as
  ``spark.neli.*`` conf and read it back inside the job.
- The sinks, each refusing a stale token with :class:`~neli_orchestrate.errors.StaleTokenError`:
  :func:`write_delta_fenced` (Delta Lake), :func:`write_iceberg_fenced` (Apache Iceberg),
  :func:`write_parquet_fenced` (a Parquet directory) and :class:`TokenCommitGuard` (any
  directory of files).
- :func:`cancel_on_fence`: tag a thread's Spark jobs so a fence callback cancels them.

Those seven are ``__all__``; helpers stay in their modules: ``conf`` (``spark_submit_env``,
``local_spark_conf``, ``spark_home``), ``commit`` (``commit_output``, ``CommitMarker``, the commit
errors), ``delta`` (``delta_history``), ``iceberg`` (``iceberg_catalog_conf``),
``applications`` (what a fenced spark-submit stops). The ``spark.neli.*`` key names live with
the claim, in :mod:`neli_orchestrate.claim`. See docs/guide/spark.md.

Importing this package does not import pyspark.
"""

from __future__ import annotations

from neli_orchestrate.sinks.delta import write_delta_fenced
from neli_orchestrate.sinks.directory import TokenCommitGuard
from neli_orchestrate.sinks.iceberg import write_iceberg_fenced
from neli_orchestrate.sinks.parquet import write_parquet_fenced
from neli_orchestrate.spark.conf import cancel_on_fence, neli_spark_conf, read_neli_conf

__all__ = [
    "TokenCommitGuard",
    "cancel_on_fence",
    "neli_spark_conf",
    "read_neli_conf",
    "write_delta_fenced",
    "write_iceberg_fenced",
    "write_parquet_fenced",
]
