"""One Dagster deployment ("region") for the tests: its own instance, runs partitions of a job.

    python dagster_region.py --home DIR --job counted_job --executor multiprocess \\
        --partitions 2013-01-01,2013-01-02 --result out.json

Environment: what ``dagster_test_defs`` reads (NELI_BOOTSTRAP_SERVERS, NELI_DEPLOYMENT, ...).

``--executor multiprocess`` goes through ``execute_job(reconstructable(...))`` (every step in
its own process, as Dagster runs production jobs); ``in_process`` through
``execute_in_process``. The result file lists, per partition, what this instance recorded: run
success, materializations, observations, skipped steps and step failures with their metadata
and error chain.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any


def _error_chain(error: Any) -> list[str]:
    # Explicit causes first, else the exception being handled when it was raised.
    messages = []
    while error is not None:
        messages.append(error.message)
        error = error.cause or error.context
    return messages


def _metadata(entries: Any) -> dict[str, Any]:
    return {key: getattr(value, "value", value) for key, value in (entries or {}).items()}


def summarize(result: Any, instance: Any) -> dict[str, Any]:
    """What one run did, from its events and its event log, as JSON-friendly data."""
    from dagster import DagsterEventType

    out: dict[str, Any] = {
        "success": result.success,
        "materialized": [],
        "observations": [],
        "step_success": [],
        "step_skipped": [],
        "step_failures": [],
        "step_retries": [],
        "outputs": {},
        # What steps logged through context.log: (level name, step key, message).
        "logs": [
            (logging.getLevelName(entry.level), entry.step_key, entry.user_message)
            for entry in instance.all_logs(result.run_id)
            if not entry.is_dagster_event
        ],
    }
    for event in result.all_events:
        kind = event.event_type
        if kind == DagsterEventType.ASSET_MATERIALIZATION:
            materialization = event.step_materialization_data.materialization
            out["materialized"].append(
                {
                    "asset": materialization.asset_key.to_user_string(),
                    "partition": materialization.partition,
                    "metadata": _metadata(materialization.metadata),
                }
            )
        elif kind == DagsterEventType.ASSET_OBSERVATION:
            observation = event.asset_observation_data.asset_observation
            out["observations"].append(
                {
                    "asset": observation.asset_key.to_user_string(),
                    "partition": observation.partition,
                    "metadata": _metadata(observation.metadata),
                }
            )
        elif kind == DagsterEventType.STEP_SUCCESS:
            out["step_success"].append(event.step_key)
        elif kind == DagsterEventType.STEP_UP_FOR_RETRY:
            out["step_retries"].append(event.step_key)
        elif kind == DagsterEventType.STEP_SKIPPED:
            out["step_skipped"].append(event.step_key)
        elif kind == DagsterEventType.STEP_OUTPUT:
            data = event.step_output_data
            out["outputs"][f"{event.step_key}.{data.output_name}"] = _metadata(data.metadata)
        elif kind == DagsterEventType.STEP_FAILURE:
            failure = event.step_failure_data
            user = failure.user_failure_data
            out["step_failures"].append(
                {
                    "step": event.step_key,
                    "metadata": _metadata(user.metadata) if user else None,
                    "description": user.description if user else None,
                    "errors": _error_chain(failure.error),
                    "error_class": failure.error.cls_name if failure.error else None,
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--home", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--executor", choices=["multiprocess", "in_process"], required=True)
    parser.add_argument("--partitions", required=True)
    parser.add_argument("--result", required=True)
    args = parser.parse_args(argv)

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import dagster_test_defs
    from dagster import DagsterInstance, execute_job, reconstructable

    me = os.environ["NELI_DEPLOYMENT"]
    results: dict[str, Any] = {"deployment": me, "pid": os.getpid(), "runs": {}}
    Path(args.home).mkdir(parents=True, exist_ok=True)
    with DagsterInstance.local_temp(args.home) as instance:
        for partition in args.partitions.split(","):
            started = time.monotonic()
            if args.executor == "multiprocess":
                job = reconstructable(dagster_test_defs.JOB_GETTERS[args.job])
                with execute_job(
                    job, instance, tags={"dagster/partition": partition}
                ) as result:
                    summary = summarize(result, instance)
            else:
                job_def = dagster_test_defs.JOB_GETTERS[args.job]()
                result = job_def.execute_in_process(
                    instance=instance, partition_key=partition, raise_on_error=False
                )
                summary = summarize(result, instance)
            summary["seconds"] = round(time.monotonic() - started, 2)
            results["runs"][partition] = summary
    Path(args.result).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
