"""Carry a singleton run's fencing token into a Spark job, and cancel its Spark work on fence.

Submit side (e.g. ``SparkSubmitOperator(conf=...)``)::

    conf = neli_spark_conf(run.claim)     # or neli_spark_conf(**gate_xcom)
    # {"spark.neli.token": "42", "spark.neli.run_key": "2013-01-05", ...}

Job side::

    run = read_neli_conf(spark)           # Claim(token=42, run_key="2013-01-05", ...)

In-process Spark (Dagster, notebooks)::

    with cancel_on_fence(spark, f"{role}/{run_key}") as cancel:
        run.on_fence(cancel)              # the watchdog thread cancels our Spark jobs
        df.write.parquet(...)

Nothing here imports pyspark; it is duck-typed on the session, context or conf you pass.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from neli_orchestrate.claim import (  # noqa: F401 - the Spark conf names, re-exported
    ATTEMPT_CONF,
    DEPLOYMENT_CONF,
    ROLE_CONF,
    RUN_KEY_CONF,
    TOKEN_CONF,
    Claim,
    as_claim,
)
from neli_orchestrate.errors import ConfigError

logger = logging.getLogger(__name__)


def neli_spark_conf(
    claim: Claim | int | None = None,
    /,
    run_key: str | None = None,
    role: str | None = None,
    deployment: str | None = None,
    *,
    token: int | None = None,
    attempt: int | None = None,
) -> dict[str, str]:
    """Build the Spark conf entries that hand a run's claim to the job (``spark.neli.*``).

    Pass the claim whole: ``neli_spark_conf(run.claim)``; ``attempt`` (the orchestrator's try
    number) may be added to it. The loose form ``neli_spark_conf(token, run_key, role,
    deployment)`` (or as keywords, so the gate's XCom dict works: ``neli_spark_conf(**xcom)``)
    builds the Claim first.
    """
    if not isinstance(claim, Claim):  # the loose form
        if claim is not None and token is not None:
            raise ConfigError(f"neli_spark_conf() got the token twice ({claim!r}, {token!r})")
        if run_key is None:
            raise ConfigError("neli_spark_conf() needs a Claim, or a token and a run_key")
        loose = as_claim(run_key, token if claim is None else claim, role=role,
                         deployment=deployment)
        return neli_spark_conf(loose, attempt=attempt)
    if any(value is not None for value in (token, run_key, role, deployment)):
        raise ConfigError(
            "neli_spark_conf() takes a Claim, or token, run_key, role, deployment, not both")
    if attempt is not None:
        claim = dataclasses.replace(claim, attempt=attempt)
    return claim.spark_conf()


def read_neli_conf(source: Any) -> Claim:
    """Read the run's token and run key from Spark conf; ConfigError names what is missing.

    ``source`` is a SparkSession, SparkContext, SparkConf (``SparkConf()`` works in a
    spark-submit driver before any context exists) or a plain mapping.
    """
    return Claim.from_spark_conf(source)


def spark_home() -> Path:
    """Return the SPARK_HOME of the installed ``pyspark`` package (without importing it)."""
    spec = importlib.util.find_spec("pyspark")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        home = Path(location)
        if (home / "bin" / "spark-submit").exists() and (home / "jars").is_dir():
            return home
    raise ConfigError(
        "no full PySpark installation found (pyspark/bin/spark-submit and pyspark/jars): "
        "`pip install pyspark` (the pyspark-client package has no spark-submit)"
    )


def spark_submit_env(python: str | None = None) -> dict[str, str]:
    """Return env vars that make ``spark-submit`` run this interpreter's PySpark.

    pip's ``spark-submit`` finds SPARK_HOME by running ``python3`` from PATH, which outside an
    activated virtualenv is the wrong interpreter; the job's driver also defaults to
    ``python3``. Pass these to ``SparkSubmitOperator(env_vars=...)`` or ``subprocess``.
    """
    python = python or sys.executable
    return {
        "SPARK_HOME": str(spark_home()),
        "PYSPARK_PYTHON": python,
        "PYSPARK_DRIVER_PYTHON": python,
    }


def local_spark_conf(shuffle_partitions: int = 2) -> dict[str, str]:
    """Return Spark conf for small local runs (tests, examples): few shuffle partitions, no UI."""
    return {
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.default.parallelism": str(shuffle_partitions),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
    }


def _job_tag(group_id: str) -> str:
    # Spark rejects empty tags and commas in tags.
    tag = group_id.replace(",", "_")
    return tag or "neli"


class SparkJobCanceller:
    """Cancels the Spark jobs started by one thread under a job group and job tag.

    Call it (from any thread, with any arguments, so it fits any fence callback signature) to
    cancel; use it as a context manager in the thread that runs the Spark actions so the group
    and tag are set for that block and cleared after it.
    """

    def __init__(
        self,
        spark: Any,
        group_id: str,
        *,
        description: str | None = None,
        interrupt_on_cancel: bool = True,
    ) -> None:
        if not isinstance(group_id, str) or not group_id:
            raise ConfigError(f"group_id must be a non-empty string, got {group_id!r}")
        self.group_id = group_id
        self.tag = _job_tag(group_id)
        self.description = description or f"neli_orchestrate run {group_id}"
        self.interrupt_on_cancel = interrupt_on_cancel
        self._spark = spark
        self._context = self._spark_context(spark)
        self._cancelled = threading.Event()
        self._active = False

    @staticmethod
    def _spark_context(spark: Any) -> Any | None:
        """Return the SparkContext of a classic session or context; None for Spark Connect."""
        if hasattr(spark, "setJobGroup"):
            return spark
        if type(spark).__module__.startswith("pyspark.sql.connect"):
            return None
        try:
            return spark.sparkContext
        except Exception:  # noqa: BLE001 - Spark Connect raises a PySpark error here
            return None

    @property
    def cancelled(self) -> bool:
        """True once ``cancel()`` has been called."""
        return self._cancelled.is_set()

    def activate(self) -> None:
        """Tag the Spark jobs this thread starts from now on with the group and tag."""
        if self._context is not None:
            self._context.setJobGroup(self.group_id, self.description, self.interrupt_on_cancel)
            self._context.addJobTag(self.tag)
        else:
            self._spark.addTag(self.tag)
        self._active = True

    def deactivate(self) -> None:
        """Stop tagging this thread's jobs (the group and tag set by ``activate``)."""
        if not self._active:
            return
        self._active = False
        if self._context is not None:
            self._context.removeJobTag(self.tag)
            # PySpark has no clearJobGroup(); these are the properties Scala's version clears.
            for key in (
                "spark.jobGroup.id",
                "spark.job.description",
                "spark.job.interruptOnCancel",
            ):
                self._context.setLocalProperty(key, None)
        else:
            self._spark.removeTag(self.tag)

    def cancel(self, *_args: object, **_kwargs: object) -> None:
        """Cancel every running and future-submitted job of the group and tag; never raises."""
        self._cancelled.set()
        try:
            if self._context is not None:
                self._context.cancelJobGroup(self.group_id)
                self._context.cancelJobsWithTag(self.tag)
            else:
                self._spark.interruptTag(self.tag)
            logger.warning("cancelled Spark jobs of group %r (fenced)", self.group_id)
        except Exception:  # a fence callback must not fail the watchdog
            logger.exception("could not cancel Spark jobs of group %r", self.group_id)

    __call__ = cancel

    def __enter__(self) -> SparkJobCanceller:
        self.activate()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.deactivate()
        except Exception:  # noqa: BLE001 - e.g. the session was stopped inside the block
            logger.debug("could not clear Spark job group %r", self.group_id, exc_info=True)


def cancel_on_fence(
    spark: Any,
    group_id: str,
    *,
    description: str | None = None,
    interrupt_on_cancel: bool = True,
) -> SparkJobCanceller:
    """Tag this thread's Spark jobs so a fence callback can cancel them.

    ``spark`` is a SparkSession (classic or Spark Connect) or SparkContext. Use the result as a
    context manager around the Spark actions and register it as the fence callback::

        with cancel_on_fence(spark, f"{role}/{run_key}") as cancel:
            run.on_fence(cancel)
            ...

    Classic sessions use ``setJobGroup``/``addJobTag`` and ``cancelJobGroup``/
    ``cancelJobsWithTag`` (``interrupt_on_cancel`` also interrupts running task threads);
    Spark Connect uses ``addTag``/``interruptTag``.

    .. note:: The group and tag are thread-local: jobs started from other threads are not
       covered unless they enter their own ``cancel_on_fence`` block.
    """
    return SparkJobCanceller(
        spark, group_id, description=description, interrupt_on_cancel=interrupt_on_cancel
    )
