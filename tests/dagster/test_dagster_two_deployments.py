"""Two Dagster deployments (separate instances and homes, separate processes) share the work.

Both materialize the same partitions at the same moment against the real broker: each
partition must be computed exactly once (work log and ledger agree), the other deployment's
step must succeed, materializing the partition by proxy (naming where it ran) without running
the work, its downstream asset must run there too, and every run of both deployments must
succeed. One deployment runs through ``execute_job(reconstructable)``
with the multiprocess executor, the other through ``execute_in_process``; the two tests swap
them so each pattern is exercised under both executors.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from dagster_harness import (
    Deployment,
    completed_by_run_key,
    ledger_history,
    make_deployment,
    unique_namespace,
    work_log,
)

pytestmark = [pytest.mark.dagster, pytest.mark.kafka]

PARTITIONS = ["2013-01-01", "2013-01-02", "2013-01-03"]
# The gated job starts three step processes per run under the multiprocess executor; two
# partitions keep it within budget on two cores.
GATED_PARTITIONS = PARTITIONS[:2]
# Generous: on a loaded two-core machine one Dagster run took minutes.
RUN_TIMEOUT = 400.0


def _run_both(
    tmp_path: Path, kafka_broker: str, job: str, executors: dict[str, str], partitions: list[str]
) -> tuple[str, dict[str, dict]]:
    namespace = unique_namespace()
    peers = {"NELI_TEST_PEERS": ",".join(executors)}
    deployments = [
        make_deployment(name, tmp_path, kafka_broker, namespace, extra_env=peers)
        for name in executors
    ]
    try:
        for deployment in deployments:
            deployment.start(job, executors[deployment.name], partitions)
        results = {d.name: d.wait(RUN_TIMEOUT) for d in deployments}
    finally:
        for deployment in deployments:
            deployment.stop()
    return namespace, results


def _runner_per_partition(
    tmp_path: Path, role: str, partitions: list[str]
) -> dict[str, tuple[str, int]]:
    executions = [entry for entry in work_log(tmp_path) if entry[0] == role]
    counts = Counter(run_key for _, run_key, _, _ in executions)
    assert counts == dict.fromkeys(partitions, 1), f"work executions per partition: {counts}"
    return {run_key: (deployment, token) for _, run_key, deployment, token in executions}


def test_each_partition_of_a_singleton_asset_is_materialized_in_exactly_one_deployment(
    kafka_broker: str, tmp_path: Path
) -> None:
    namespace, results = _run_both(
        tmp_path,
        kafka_broker,
        "counted_job",
        {"east": "multiprocess", "west": "in_process"},
        PARTITIONS,
    )
    runner = _runner_per_partition(tmp_path, "daily_counted", PARTITIONS)

    records = ledger_history(kafka_broker, f"{namespace}.ledger")
    assert completed_by_run_key(records, "daily_counted") == dict.fromkeys(PARTITIONS, 1)
    completed = {
        r.run_key: (r.deployment, r.token)
        for r in records
        if r.role == "daily_counted" and r.state == "COMPLETED"
    }
    assert completed == runner

    for name, result in results.items():
        for partition in PARTITIONS:
            run = result["runs"][partition]
            assert run["success"], f"{name} {partition}: {run}"
            materialized = {m["asset"]: m for m in run["materialized"]}
            ran_here, token = runner[partition]
            if ran_here == name:
                assert set(materialized) == {"daily_counted", "daily_counted_report"}
                assert materialized["daily_counted"]["metadata"].items() >= {
                    "token": token,
                    "deployment": name,
                    "role": "daily_counted",
                    "run_key": partition,
                }.items()
                assert run["observations"] == []
                # the claim's metric is in the run's event log (Dagster's logger)
                assert any(
                    message.startswith("neli metric claim ")
                    and "role=daily_counted" in message and f"run_key={partition}" in message
                    for _, _, message in run["logs"]
                ), run["logs"]
            else:
                # Materialized by proxy (the catalog here sees the partition, naming where it
                # ran), and the downstream asset ran here too, on the value the runner stored.
                assert set(materialized) == {"daily_counted", "daily_counted_report"}, name
                proxy = materialized["daily_counted"]
                assert proxy["partition"] == partition
                assert proxy["metadata"].items() >= {
                    "neli_by_proxy": True,
                    "neli_outcome": "SKIP_DONE",
                    "deployment": ran_here,
                    "token": token,
                    "recorded_by": name,
                }.items()
                assert "daily_counted" in run["step_success"]
                assert run["step_skipped"] == []
                assert run["observations"] == []
                assert any(
                    message.startswith("neli metric skip ") and "outcome=SKIP_DONE" in message
                    for _, _, message in run["logs"]
                ), run["logs"]


def test_gate_op_lets_only_the_claiming_deployment_run_the_singleton_op(
    kafka_broker: str, tmp_path: Path
) -> None:
    namespace, results = _run_both(
        tmp_path,
        kafka_broker,
        "gated_job",
        {"east": "in_process", "west": "multiprocess"},
        GATED_PARTITIONS,
    )
    runner = _runner_per_partition(tmp_path, "gated_daily", GATED_PARTITIONS)

    records = ledger_history(kafka_broker, f"{namespace}.ledger")
    assert completed_by_run_key(records, "gated_daily") == dict.fromkeys(GATED_PARTITIONS, 1)
    for partition in GATED_PARTITIONS:
        history = [r for r in records if r.role == "gated_daily" and r.run_key == partition]
        ran_here, token = runner[partition]
        # The gate's CLAIMED record, then the op's own claim with a larger token, then done.
        states = [(r.state.value, r.deployment) for r in history]
        assert states[-1] == ("COMPLETED", ran_here)
        assert history[-1].token == token
        gate_claims = [r for r in history if r.state == "CLAIMED" and r.deployment == ran_here]
        assert gate_claims and all(r.token < token for r in gate_claims)

    for name, result in results.items():
        for partition in GATED_PARTITIONS:
            run = result["runs"][partition]
            assert run["success"], f"{name} {partition}: {run}"
            ran_here, token = runner[partition]
            if ran_here == name:
                assert {"gated_daily_gate", "gated_work", "gated_report"} <= set(
                    run["step_success"]
                )
                gate_output = run["outputs"]["gated_daily_gate.claimed"]
                assert gate_output["deployment"] == name
                assert gate_output["role"] == "gated_daily"
                assert gate_output["run_key"] == partition
                assert gate_output["token"] < token
                assert gate_output["neli_outcome"] == "RUN"
                assert isinstance(gate_output["claimed_at"], float)
                assert run["outputs"]["gated_work.result"]["token"] == token
            else:
                assert run["step_success"] == ["gated_daily_gate"]
                assert sorted(run["step_skipped"]) == ["gated_report", "gated_work"]


def test_failed_step_is_retried_by_dagster_in_the_same_deployment_while_the_other_waits(
    kafka_broker: str, tmp_path: Path
) -> None:
    # flaky_daily fails its first execution anywhere; Dagster's RetryPolicy retries the step.
    # Both deployments contend at the same instant, so either may fail first. The failing
    # deployment retries first (a new claim, larger token); the other waits meanwhile, visibly
    # in its event log, and skips once the run is COMPLETED.
    partition = "2013-02-01"
    namespace, results = _run_both(
        tmp_path,
        kafka_broker,
        "flaky_job",
        {"east": "multiprocess", "west": "in_process"},
        [partition],
    )
    executions = [e for e in work_log(tmp_path) if e[0] == "flaky_daily"]
    assert len(executions) == 2, f"one failed execution and one retry: {executions}"
    (_, _, failed_in, failed_token), (_, _, retried_in, retried_token) = executions
    assert retried_in == failed_in, "the failing deployment retries first"
    assert retried_token > failed_token
    other = "west" if failed_in == "east" else "east"

    records = [
        r
        for r in ledger_history(kafka_broker, f"{namespace}.ledger")
        if r.role == "flaky_daily" and r.run_key == partition
    ]
    assert [(r.state.value, r.deployment, r.token) for r in records] == [
        ("RUNNING", failed_in, failed_token),
        ("FAILED", failed_in, failed_token),
        ("RUNNING", failed_in, retried_token),
        ("COMPLETED", failed_in, retried_token),
    ]
    assert "fails its first execution" in records[1].reason

    ran = results[failed_in]["runs"][partition]
    assert ran["success"], ran
    assert ran["step_retries"] == ["flaky_daily"]
    materialized = {m["asset"]: m["metadata"] for m in ran["materialized"]}
    assert set(materialized) == {"flaky_daily", "flaky_daily_report"}
    assert materialized["flaky_daily"]["token"] == retried_token
    assert materialized["flaky_daily"]["neli_outcome"] == "RETRY"

    waited = results[other]["runs"][partition]
    assert waited["success"], waited
    assert waited["step_retries"] == [] and waited["step_skipped"] == []
    waited_materialized = {m["asset"]: m["metadata"] for m in waited["materialized"]}
    assert set(waited_materialized) == {"flaky_daily", "flaky_daily_report"}
    proxy = waited_materialized["flaky_daily"]
    assert (proxy["neli_by_proxy"], proxy["deployment"], proxy["token"]) == (
        True, failed_in, retried_token)
    # The wait is in the waiting deployment's event log, not a silent sleep.
    waits = [m for _, step, m in waited["logs"] if step == "flaky_daily" and "waiting for" in m]
    assert waits, waited["logs"]


def test_reset_with_the_cli_reruns_a_completed_partition_in_exactly_one_deployment(
    kafka_broker: str, tmp_path: Path
) -> None:
    # east computes the day; `neli-orchestrate ledger reset` makes it new again; west then
    # computes it with a larger token, and east, launching it once more, skips it.
    partition = "2013-04-01"
    namespace = unique_namespace()
    east = make_deployment("east", tmp_path, kafka_broker, namespace)
    west = make_deployment("west", tmp_path, kafka_broker, namespace)

    def run(deployment: Deployment) -> dict:
        deployment.start("counted_job", "in_process", [partition])
        try:
            return deployment.wait(RUN_TIMEOUT)["runs"][partition]
        finally:
            deployment.stop()

    first = run(east)
    assert first["success"] and {m["asset"] for m in first["materialized"]} == {
        "daily_counted", "daily_counted_report"}

    cli = Path(sys.executable).with_name("neli-orchestrate")
    reset = subprocess.run(
        [str(cli), "ledger", "reset", "daily_counted", partition,
         "--bootstrap-servers", kafka_broker, "--namespace", namespace,
         "--deployment", "operator", "--reason", "late data, ticket DATA-1"],
        capture_output=True, text=True, timeout=120,
    )
    assert reset.returncode == 0, reset.stdout + reset.stderr

    second = run(west)
    assert second["success"]
    assert {m["asset"] for m in second["materialized"]} == {"daily_counted", "daily_counted_report"}
    third = run(east)
    assert third["success"] and third["step_skipped"] == []
    by_proxy = {m["asset"]: m["metadata"] for m in third["materialized"]}["daily_counted"]
    assert (by_proxy["neli_by_proxy"], by_proxy["deployment"]) == (True, "west")

    executions = [(d, t) for role, _, d, t in work_log(tmp_path) if role == "daily_counted"]
    assert [d for d, _ in executions] == ["east", "west"]
    records = [
        r for r in ledger_history(kafka_broker, f"{namespace}.ledger")
        if r.role == "daily_counted" and r.run_key == partition
    ]
    assert [(r.state.value, r.deployment) for r in records] == [
        ("RUNNING", "east"), ("COMPLETED", "east"), ("RESET", "operator"),
        ("RUNNING", "west"), ("COMPLETED", "west"),
    ]
    assert records[2].reason == "late data, ticket DATA-1"
    assert executions[1][1] == records[3].token > records[2].token > executions[0][1]
    assert by_proxy["token"] == records[4].token and third["observations"] == []


def test_a_partition_whose_work_skipped_itself_is_materialized_nowhere(
    kafka_broker: str, tmp_path: Path
) -> None:
    """The work raised WorkSkipped in the deployment that ran it: COMPLETED "skipped by the
    task". It produced nothing, so the other deployment materializes nothing by proxy (an
    observation says where and why) and skips the downstream asset, as the runner did."""
    namespace = unique_namespace()
    partition = PARTITIONS[0]
    results = {}
    for name in ("east", "west"):  # east runs first; west comes once the run key is done
        deployment = make_deployment(name, tmp_path, kafka_broker, namespace)
        try:
            deployment.start("skipping_job", "in_process", [partition])
            results[name] = deployment.wait(RUN_TIMEOUT)["runs"][partition]
        finally:
            deployment.stop()

    assert [(role, key, where) for role, key, where, _ in work_log(tmp_path)] == [
        ("skipping_daily", partition, "east")]
    [done] = [r for r in ledger_history(kafka_broker, f"{namespace}.ledger")
              if r.role == "skipping_daily" and r.state == "COMPLETED"]
    assert done.deployment == "east" and done.reason.startswith("skipped by the task")

    for name, run in results.items():
        assert run["success"], f"{name}: {run}"
        # nothing materialized anywhere, by proxy or not; the downstream asset skipped
        assert run["materialized"] == [], f"{name}: {run['materialized']}"
        assert run["step_skipped"] == ["skipping_daily_report"], name
    [observation] = results["west"]["observations"]
    assert observation["partition"] == partition
    assert observation["metadata"].items() >= {
        "neli_by_proxy": True,
        "neli_skipped_by_task": True,
        "deployment": "east",
        "token": done.token,
        "recorded_by": "west",
    }.items()
    assert observation["metadata"]["reason"].startswith("skipped by the task")
    assert any("skipped by the task in east" in message
               for _, _, message in results["west"]["logs"]), results["west"]["logs"]
