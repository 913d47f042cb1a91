"""A Spark job that runs until killed: for fencing tests of FencedSparkSubmitOperator.

    spark-submit slow_job.py --started DIR [--seconds 300]

Reads the run's token from Spark conf (as real fenced jobs do), writes ``DIR/<token>.started``
(JSON: driver pid, token, run key) once a Spark job with Python workers is running, then keeps
that job busy for ``--seconds``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--started", required=True)
    parser.add_argument("--seconds", type=float, default=300.0)
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    from neli_orchestrate.spark import read_neli_conf

    spark = SparkSession.builder.appName("neli slow job").getOrCreate()
    run = read_neli_conf(spark)
    started = Path(args.started)
    started.mkdir(parents=True, exist_ok=True)
    rdd = spark.sparkContext.parallelize(range(2), 2)
    # Announce from inside the first task: the Python workers are up when the file appears.
    info = {"driver_pid": os.getpid(), "token": run.token, "run_key": run.run_key}

    def announce_and_wait(index: int) -> int:
        if index == 0:
            tmp = started / f".{run.token}.tmp"
            tmp.write_text(json.dumps({**info, "worker_pid": os.getpid()}))
            os.replace(tmp, started / f"{run.token}.started")
        time.sleep(args.seconds)
        return index

    rdd.map(announce_and_wait).collect()
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
