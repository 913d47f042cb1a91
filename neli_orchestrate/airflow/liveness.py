"""The scheduler announces its deployment's liveness in Kafka (an Airflow listener).

Registered by the provider's plugin (``NeliPlugin.listeners``), so a user adds nothing: every
Airflow component that runs a job calls ``on_starting``; in the **scheduler** (by default) this
starts an announcer (:mod:`neli_orchestrate.liveness`) for the deployment of the ``neli``
connection ``[neli] liveness_conn_id`` (default ``neli_default``).

Why the scheduler: nothing of a deployment continues a claim without it. A gate's executor, a
failed try's retry and the next gate are all scheduled by it; while no scheduler runs, the
deployment's claims can only wait. Airflow keeps it up (one per deployment, or several in HA:
each announces, the deployment is gone only when all are). ``[neli] liveness_components``
(``scheduler``, ``triggerer``, ``dag-processor``, comma separated) widens the choice.

While the scheduler restarts: its member is static (no LeaveGroup), so it stays in the group
for ``liveness_timeout`` seconds after the last heartbeat; a scheduler back within that time is
never seen as gone, and a longer restart lets other regions take its claims over (safe: tokens
and the fenced ledger refuse its late executor; it costs a re-run at most).

The announcer is a child process, not a thread: the scheduler forks (executors, the DAG file
processor), and librdkafka's threads do not survive a fork. The child exits when its parent is
gone (checked twice a second), so a ``kill -9`` of the scheduler is seen as a death after
``liveness_timeout`` like any other. The announcer is opt-in for now: ``[neli] liveness = True``
turns it on (without it, other regions keep the handoff window for this deployment's claims).
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from typing import Any

from airflow.listeners import hookimpl

log = logging.getLogger(__name__)

_JOB_TYPES = {"scheduler": "SchedulerJob", "triggerer": "TriggererJob",
              "dag-processor": "DagProcessorJob"}
_lock = threading.Lock()
_children: list[subprocess.Popen[bytes]] = []


def _option(name: str, default: str) -> str:
    from airflow.configuration import conf

    return str(conf.get("neli", name, fallback=default))


def _enabled() -> bool:
    # Opt-in for now: the listener's start thread can hold a logging lock at the moment the
    # scheduler forks an executor worker, and a task forked from that worker then hangs at its
    # first log line (seen once in CI, docs/guarantees.md). On by default once the scheduler
    # keeps no thread of ours.
    return _option("liveness", "False").strip().lower() in ("true", "1", "yes", "on")


def _wanted_job_types() -> set[str]:
    names = [n.strip() for n in _option("liveness_components", "scheduler").split(",")]
    unknown = [n for n in names if n and n not in _JOB_TYPES]
    if unknown:
        log.warning("[neli] liveness_components: unknown %s (known: %s)", unknown,
                    ", ".join(_JOB_TYPES))
    return {_JOB_TYPES[n] for n in names if n in _JOB_TYPES}


@hookimpl
def on_starting(component: Any) -> None:
    """A job (scheduler, triggerer, ...) starts: announce liveness if it is a chosen one."""
    if not hasattr(component, "job_type") or not _enabled():
        return  # the task runner, or liveness off
    # The job's type is set by its runner just after this hook: decide on a thread.
    threading.Thread(target=_announce_when_typed, args=(component,), daemon=True,
                     name="neli-liveness-start").start()


@hookimpl
def before_stopping(component: Any) -> None:
    """The job stops: stop announcing (the member expires after the liveness timeout)."""
    with _lock:
        children = list(_children)
        _children.clear()
    for child in children:
        child.terminate()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()


def _announce_when_typed(job: Any) -> None:
    deadline = time.monotonic() + 120
    while not getattr(job, "job_type", None):
        if time.monotonic() > deadline:
            return
        time.sleep(0.1)
    if job.job_type not in _wanted_job_types():
        return
    conn_id = _option("liveness_conn_id", "neli_default")
    delay = 5.0
    while True:
        try:
            config = _announcer_config(conn_id, component=str(job.job_type))
            break
        except Exception as exc:  # noqa: BLE001 - connection not defined yet, bad extras
            log.warning("NELI liveness: cannot read connection %r (%s); retrying in %.0f s",
                        conn_id, exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, 300.0)
    from neli_orchestrate.liveness import spawn_announcer

    child = spawn_announcer(config)
    with _lock:
        _children.append(child)
    log.info("NELI liveness: %s announces deployment %r in group %r (pid %d, timeout %g s)",
             job.job_type, config.deployment, config.group, child.pid, config.timeout)


def _announcer_config(conn_id: str, *, component: str) -> Any:
    from airflow.models.connection import Connection

    from neli_orchestrate.airflow.hooks.neli import NeliHook
    from neli_orchestrate.liveness import AnnouncerConfig
    from neli_orchestrate.singleton import ledger_client_settings

    conn = Connection.get_connection_from_secrets(conn_id)
    config = NeliHook(conn_id, connection=conn).singleton_config()  # type: ignore[arg-type]
    return AnnouncerConfig(bootstrap_servers=config.neli.bootstrap_servers,
                           namespace=config.names.name, deployment=config.deployment,
                           timeout=config.liveness_timeout, component=component,
                           poll_interval=min(0.5, config.liveness_timeout / 5),
                           kafka_config=ledger_client_settings(config.neli.kafka_config))
