"""FencedSparkSubmitOperator: the explicit form of a fenced SparkSubmitOperator.

Usage::

    gate = LeaderGateOperator(task_id="gate", role="nycflights_daily")
    job = FencedSparkSubmitOperator(task_id="job", application="jobs/nycflights_daily.py",
                                    acquire_timeout=1800)
    gate >> job

A stock ``SparkSubmitOperator`` directly after the gate runs fenced as well (see
:mod:`neli_orchestrate.airflow.policy`): that is the one way to fence, and this class is its
explicit alias. It adds the fencing arguments (``gate_task_id``, ``neli_conn_id``,
``acquire_timeout``) and an ``on_kill`` that also stops the Python driver spark-submit
started, whoever kills the task. This is the only module of the provider that imports the
Spark provider.
"""

from __future__ import annotations

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from neli_orchestrate.airflow.operators.fenced import FencedExecutionMixin
from neli_orchestrate.airflow.spark_provider import submit_process


def _kill_process_tree(root_pid: int, *, timeout: float = 10.0) -> list[int]:
    """Kill every process below ``root_pid`` (and it); return the pids that had to be killed."""
    import psutil

    try:
        root = psutil.Process(root_pid)
        procs = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return []
    killed = []
    for proc in procs:
        try:
            proc.kill()
            killed.append(proc.pid)
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(procs, timeout=timeout)
    return killed


class FencedSparkSubmitOperator(FencedExecutionMixin, SparkSubmitOperator):
    """SparkSubmitOperator that runs only under the gate's claim and fails when fenced.

    The claim reaches the job as Spark conf (``spark.neli.token``, ``spark.neli.run_key``,
    ``spark.neli.role``, ``spark.neli.deployment``, ``spark.neli.attempt``); read it in the job
    with :func:`neli_orchestrate.spark.read_neli_conf` and publish through the token-checked
    commit. ``on_kill`` kills spark-submit and every process it started (JVM, Python driver).
    """

    ui_color = "#f7d9b8"

    def on_kill(self) -> None:
        process = submit_process(self)
        pid = process.pid if process is not None and process.poll() is None else None
        descendants: list[int] = []
        if pid is not None:
            import psutil

            try:
                descendants = [p.pid for p in psutil.Process(pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                descendants = []
        super().on_kill()
        # spark-submit's kill() reaches the JVM only; its Python driver and workers are its
        # children and must not outlive a killed task.
        leftovers = [p for d in descendants for p in _kill_process_tree(d)]
        if pid is not None:
            leftovers += _kill_process_tree(pid)
        if leftovers:
            self.log.warning("killed leftover Spark processes %s", leftovers)
