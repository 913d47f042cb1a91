"""Spark side of fencing: token conf for spark-submit, a token-checked commit, job cancellation.

- :class:`TokenCommitGuard` / :func:`commit_output`: publish an output directory only if the
  run's fencing token is at least the highest already committed for its run key; a lower token
  raises :class:`~neli_orchestrate.errors.StaleTokenError`.
- :func:`write_parquet_fenced`: the same for a PySpark DataFrame written as Parquet.
- :func:`neli_spark_conf` / :func:`read_neli_conf`: hand the token to the job as
  ``spark.neli.*`` conf and read it back inside the job.
- :func:`cancel_on_fence`: tag a thread's Spark jobs so a fence callback cancels them.

Importing this package does not import pyspark.
"""

from __future__ import annotations

from neli_orchestrate.errors import StaleTokenError
from neli_orchestrate.spark.commit import (
    MARKER_NAME,
    CommitConflictError,
    CommitError,
    CommitLockTimeout,
    CommitMarker,
    CommitMarkerError,
    StagedOutput,
    TokenCommitGuard,
    commit_output,
    escape_run_key,
)
from neli_orchestrate.spark.conf import (
    ATTEMPT_CONF,
    DEPLOYMENT_CONF,
    ROLE_CONF,
    RUN_KEY_CONF,
    TOKEN_CONF,
    NeliSparkConf,
    SparkJobCanceller,
    cancel_on_fence,
    local_spark_conf,
    neli_spark_conf,
    read_neli_conf,
    spark_home,
    spark_submit_env,
)
from neli_orchestrate.spark.dataframe import write_parquet_fenced

__all__ = [
    "ATTEMPT_CONF",
    "DEPLOYMENT_CONF",
    "MARKER_NAME",
    "ROLE_CONF",
    "RUN_KEY_CONF",
    "TOKEN_CONF",
    "CommitConflictError",
    "CommitError",
    "CommitLockTimeout",
    "CommitMarker",
    "CommitMarkerError",
    "NeliSparkConf",
    "SparkJobCanceller",
    "StaleTokenError",
    "StagedOutput",
    "TokenCommitGuard",
    "cancel_on_fence",
    "commit_output",
    "escape_run_key",
    "local_spark_conf",
    "neli_spark_conf",
    "read_neli_conf",
    "spark_home",
    "spark_submit_env",
    "write_parquet_fenced",
]
