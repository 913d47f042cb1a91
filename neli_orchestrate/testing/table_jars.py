"""Fetch the Delta Lake and Apache Iceberg jars for PySpark once, from Maven Central, into a cache.

Usage::

    jars = ensure_table_format_jars()            # ~/.cache/neli-orchestrate/table-formats-.../jars
    spark = (SparkSession.builder.config("spark.jars", spark_jars(jars))
             .config(map=delta_session_conf()) ...)

Spark itself never downloads anything (no ``spark.jars.packages``, no ivy at run time): the jars
are assembled by ``mvn`` from ``table_formats/pom.xml`` the way :mod:`.local_kafka` assembles the
broker, and handed to Spark with ``--jars`` / ``spark.jars``. ``NELI_TABLE_JARS`` points at a
directory that already holds them (an air-gapped machine, a cluster image);
``NELI_KAFKA_CACHE`` moves the cache root, shared with the Kafka jars.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from neli_orchestrate.errors import NeliError

log = logging.getLogger(__name__)

#: The Spark minor the jars are built for; equal to the pyspark pin's (pyproject.toml).
SPARK_MINOR = "4.1"
DELTA_VERSION = "4.4.0"
ICEBERG_VERSION = "1.12.0"

DELTA_JARS = (
    f"delta-spark_{SPARK_MINOR}_2.13-{DELTA_VERSION}.jar",
    f"delta-storage-{DELTA_VERSION}.jar",
)
ICEBERG_JARS = (f"iceberg-spark-runtime-{SPARK_MINOR}_2.13-{ICEBERG_VERSION}.jar",)

#: The optional S3 set (``table_formats/s3a-pom.xml``, ~24 MB): S3A for ``s3a://`` at the Hadoop
#: version pyspark ships, only the AWS SDK v2 modules it loads (not the 642 MB SDK bundle), and
#: the SQLite JDBC driver of an Iceberg JDBC catalog.
HADOOP_VERSION = "3.4.2"
AWS_SDK_VERSION = "2.29.52"
SQLITE_JDBC_VERSION = "3.51.1.0"
S3A_JARS = (
    f"hadoop-aws-{HADOOP_VERSION}.jar",
    f"s3-{AWS_SDK_VERSION}.jar",
    f"sts-{AWS_SDK_VERSION}.jar",
    f"s3-transfer-manager-{AWS_SDK_VERSION}.jar",
    f"sqlite-jdbc-{SQLITE_JDBC_VERSION}.jar",
)
#: What pyspark's own jars already provide; a second copy would shadow Spark's.
_S3A_EXCLUDED_GROUPS = "io.netty,org.apache.httpcomponents,commons-codec,commons-logging,org.slf4j"


class TableJarsError(NeliError):
    """The table-format jars could not be found or fetched; the message says what to do."""


def table_jars_cache_dir() -> Path:
    """Return the directory that holds (or will hold) the jars of the pinned versions."""
    root = os.environ.get("NELI_KAFKA_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "neli-orchestrate"
    return base / f"table-formats-spark{SPARK_MINOR}-delta{DELTA_VERSION}-iceberg{ICEBERG_VERSION}"


def _pom(name: str = "pom.xml") -> Path:
    return Path(str(resources.files("neli_orchestrate.testing") / "table_formats" / name))


def _missing(jars: Path, names: Sequence[str]) -> list[str]:
    return [name for name in names if not (jars / name).is_file()]


def _ensure(*, what: str, env: str, names: Sequence[str], cache: Path, pom: str,
            maven_args: Sequence[str], marker: str, timeout: float) -> Path:
    """The directory holding ``names``: ``$env`` if set, else ``cache``/jars, fetched with
    Maven from ``pom`` once. Safe from several processes at once: the fetch holds a file lock
    and publishes the directory with a rename, like
    :func:`~neli_orchestrate.testing.local_kafka.ensure_kafka_libs`."""
    given = os.environ.get(env)
    if given:
        missing = _missing(Path(given), names)
        if missing:
            raise TableJarsError(f"{env}={given} lacks {', '.join(missing)}")
        return Path(given)
    jars = cache / "jars"
    if (jars / ".complete").exists():
        return jars
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (jars / ".complete").exists():
            return jars
        mvn = shutil.which("mvn")
        if mvn is None:
            raise TableJarsError(
                f"the {what} jars are not cached: install Maven (`mvn`) so they can be fetched "
                f"from Maven Central, or set {env} to a directory holding " + ", ".join(names)
            )
        staging = Path(tempfile.mkdtemp(prefix="jars-", dir=cache))
        cmd = [mvn, "-q", "-B", "-f", str(_pom(pom)), "dependency:copy-dependencies",
               "-DincludeScope=runtime", *maven_args, f"-DoutputDirectory={staging}"]
        log.info("fetching the %s jars (%s) with Maven into %s", what, marker, jars)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise TableJarsError(
                f"Maven did not fetch the {what} jars within {timeout:.0f} s") from exc
        missing = _missing(staging, names)
        if proc.returncode != 0 or missing:
            shutil.rmtree(staging, ignore_errors=True)
            tail = (proc.stdout + proc.stderr)[-4000:]
            raise TableJarsError(
                f"Maven could not fetch {', '.join(missing) or f'the {what} jars'} (exit "
                f"{proc.returncode}); is Maven Central reachable? Output:\n{tail}"
            )
        (staging / ".complete").write_text(marker + "\n")
        shutil.rmtree(jars, ignore_errors=True)
        staging.rename(jars)
    return jars


def ensure_table_format_jars(*, timeout: float = 600.0) -> Path:
    """Return a directory holding the Delta and Iceberg jars, fetching them with Maven once
    (``NELI_TABLE_JARS`` points at a directory that already holds them)."""
    return _ensure(what="Delta/Iceberg", env="NELI_TABLE_JARS", names=DELTA_JARS + ICEBERG_JARS,
                   cache=table_jars_cache_dir(), pom="pom.xml",
                   maven_args=["-DexcludeTransitive=true"],
                   marker=f"delta {DELTA_VERSION} iceberg {ICEBERG_VERSION}", timeout=timeout)


def s3a_jars_cache_dir() -> Path:
    """Return the directory that holds (or will hold) the optional S3 jar set."""
    return table_jars_cache_dir().with_name(
        f"s3a-hadoop{HADOOP_VERSION}-awssdk{AWS_SDK_VERSION}-sqlite{SQLITE_JDBC_VERSION}")


def ensure_s3a_jars(*, timeout: float = 600.0) -> list[Path]:
    """Return the jars of the optional S3 set, fetching them with Maven once.

    The set is ``hadoop-aws`` with the AWS SDK v2 modules S3A needs and their dependencies
    (all of them: the SDK is split into some thirty small jars), plus ``sqlite-jdbc``.
    ``NELI_S3A_JARS`` points at a directory that already holds them. Same locking and
    publishing as :func:`ensure_table_format_jars`.
    """
    jars = _ensure(what="S3", env="NELI_S3A_JARS", names=S3A_JARS, cache=s3a_jars_cache_dir(),
                   pom="s3a-pom.xml", maven_args=[f"-DexcludeGroupIds={_S3A_EXCLUDED_GROUPS}"],
                   marker=f"hadoop-aws {HADOOP_VERSION} awssdk {AWS_SDK_VERSION}",
                   timeout=timeout)
    return sorted(jars.glob("*.jar"))


def spark_jars(jars: Path, *, delta: bool = True, iceberg: bool = True) -> str:
    """Return the comma-separated ``spark.jars`` / ``--jars`` value for the chosen formats."""
    names = (DELTA_JARS if delta else ()) + (ICEBERG_JARS if iceberg else ())
    return ",".join(str(jars / name) for name in names)


def _has_table_classes(gateway: Any) -> bool:
    """Whether a running driver JVM can load the Delta and Iceberg Spark classes (False when
    the JVM no longer answers)."""
    from py4j.java_gateway import JavaClass  # type: ignore[import-untyped]
    from py4j.protocol import Py4JError  # type: ignore[import-untyped]

    try:
        jvm = gateway.jvm
        return isinstance(jvm.io.delta.sql.DeltaSparkSessionExtension, JavaClass) and (
            isinstance(jvm.org.apache.iceberg.spark.SparkCatalog, JavaClass))
    except (Py4JError, OSError) as exc:
        log.warning("the driver JVM of an earlier session does not answer (%s): replacing it",
                    exc)
        return False


def _end_gateway(context: Any) -> None:
    """End this process's driver JVM (``context``: pyspark's SparkContext class) and forget it.

    It exits when its stdin closes; one that has not exited a minute later (its shutdown
    hooks stuck) is killed, so that one stuck JVM does not fail every later session.
    """
    gateway = context._gateway
    with contextlib.suppress(Exception):
        gateway.shutdown()
    proc = getattr(gateway, "proc", None)
    if proc is not None:
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            log.warning("the driver JVM (pid %d) did not exit within 60 s of its stdin closing;"
                        " killing it", proc.pid)
            proc.kill()
            proc.wait(timeout=30)
    context._gateway = None
    context._jvm = None


def local_table_session(warehouse: str | os.PathLike[str], *, catalog: str = "neli",
                        app_name: str = "neli_orchestrate tables", cores: int = 2,
                        extra_jars: Sequence[Path] = (),
                        extra_conf: Mapping[str, str] | None = None) -> Any:
    """Return a local SparkSession with Delta and an Iceberg Hadoop catalog on ``warehouse``.

    For tests, demos and notebooks on one machine: the jars come from
    :func:`ensure_table_format_jars`, the settings from
    :func:`~neli_orchestrate.spark.delta.delta_session_conf` and
    :func:`~neli_orchestrate.spark.iceberg.iceberg_catalog_conf`, tuned small (few shuffle and
    Delta snapshot partitions, no UI). Jars can only reach the driver when its JVM starts, so a
    driver JVM left over from an earlier, stopped session in this process that cannot load
    them is shut down first (one that can is reused); a session still running is an error.
    ``extra_jars`` (e.g. :func:`ensure_s3a_jars`) join ``spark.jars`` and always get a fresh
    driver JVM; ``extra_conf`` is applied last (e.g. ``spark.hadoop.fs.s3a.*``, another
    catalog).
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from neli_orchestrate.spark.delta import delta_session_conf
    from neli_orchestrate.spark.iceberg import iceberg_catalog_conf

    if SparkContext._active_spark_context is not None:
        raise TableJarsError(
            "a SparkSession is already running in this process; stop it first (the table-format "
            "jars can only be added when the driver JVM starts)"
        )
    gateway = SparkContext._gateway
    if gateway is not None and (extra_jars or not _has_table_classes(gateway)):
        # The JVM of an earlier session lacks our jars on the driver's classpath (or is gone):
        # end it so the next session launches a fresh one with them.
        _end_gateway(SparkContext)
    jars = ensure_table_format_jars()
    conf = {
        **iceberg_catalog_conf(catalog, str(warehouse), extensions=False),
        **delta_session_conf(),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension,"
        "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        "spark.jars": ",".join([spark_jars(jars), *map(str, extra_jars)]),
        "spark.sql.shuffle.partitions": str(cores),
        "spark.default.parallelism": str(cores),
        # Delta replays its log with this many partitions (50 by default: ~20 s per new table)
        "spark.databricks.delta.snapshotPartitions": str(cores),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        **(extra_conf or {}),
    }
    builder = SparkSession.builder.master(f"local[{cores}]").appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
