"""The scheduler announces its deployment's liveness in Kafka (an Airflow listener).

Registered by the provider's plugin (``NeliPlugin.listeners``), so a user adds nothing: every
Airflow component that runs a job calls ``on_starting``; in the **scheduler** (by default) this
starts an announcer (:mod:`neli_orchestrate.liveness`) for the deployment of the ``neli``
connection ``[neli] liveness_conn_id`` (default ``neli_default``). On by default;
``[neli] liveness = False`` turns it off (other regions then keep the handoff window for this
deployment's claims).

Why the scheduler: nothing of a deployment continues a claim without it. A gate's executor, a
failed try's retry and the next gate are all scheduled by it; while no scheduler runs, the
deployment's claims can only wait. Airflow keeps it up (one per deployment, or several in HA:
each announces, the deployment is gone only when all are). ``[neli] liveness_components``
(``scheduler``, ``triggerer``, ``dag-processor``, comma separated) widens the choice.

While the scheduler restarts: its member is static (no LeaveGroup), so it stays in the group
for ``liveness_timeout`` seconds after the last heartbeat; a scheduler back within that time is
never seen as gone, and a longer restart lets other regions take its claims over (safe: tokens
and the fenced ledger refuse its late executor; it costs a re-run at most).

**Nothing of ours runs in the scheduler.** The scheduler forks (LocalExecutor workers, the log
server), and a fork copies only the forking thread: a lock (a logging handler's, librdkafka's)
held by any other thread at that moment stays held for ever in the child, and the task forked
from it hangs at its first log line (seen in CI with an earlier version that decided on a
thread). So ``on_starting`` decides synchronously, at once, and starts one child process
(``subprocess``, ``close_fds``: an exec, not a fork of the Python state); it starts no thread,
takes no lock of ours and logs nothing. How it tells the scheduler: Airflow 3 constructs its
``Job`` (whose ``job_type`` its runner sets only after this hook) in exactly three places,
``airflow.cli.commands.{scheduler,triggerer,dag_processor}_command``; the hook's call stack
names the one that called it. A task process also calls ``on_starting`` (with a
``TaskRunnerMarker``, no job): ignored.

The child (``python -m neli_orchestrate.airflow.liveness``) reads the connection (it may not
exist yet: the harness and many deployments create it after the scheduler starts), retrying
with backoff (1 s doubling to 30 s, each failure logged), then **supervises** the plain
announcer ``python -m neli_orchestrate.liveness`` (its own child, without Airflow in memory):
an announcer that dies while the scheduler lives is started again, with backoff (1 s doubling
to 30 s; back to 1 s once one ran for a minute). While no announcer runs, other regions read
the deployment as GONE and take its claims over (safe, but wasted work), so the supervisor
logs an ERROR at once and then each minute, and sets Airflow's gauge
``neli.liveness_announcer_up`` (:data:`~neli_orchestrate.airflow.metrics.LIVENESS_ANNOUNCER_UP`,
tags ``deployment`` and ``component``) to 0; 1 while it runs (sent every 10 s and on each
change). The supervisor keeps Airflow's ``Stats`` in memory for that gauge (about 100 MB); the
announcer does not. It exits when the scheduler is gone (its parent pid checked twice a
second, also while retrying), stopping the announcer first, so a ``kill -9`` of the scheduler
is seen as a death after ``liveness_timeout`` like any other (the announcer also exits when the
supervisor is gone); ``before_stopping`` stops it (SIGTERM). All its logging goes to the
scheduler's stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from airflow.listeners import hookimpl

log = logging.getLogger(__name__)

_JOB_TYPES = {"scheduler": "SchedulerJob", "triggerer": "TriggererJob",
              "dag-processor": "DagProcessorJob"}
#: The modules of Airflow's CLI that construct a ``Job`` (the only ones in Airflow 3.3), by
#: the component they start.
_COMMAND_MODULES = {"airflow.cli.commands.scheduler_command": "scheduler",
                    "airflow.cli.commands.triggerer_command": "triggerer",
                    "airflow.cli.commands.dag_processor_command": "dag-processor"}
#: Announcer children of this process (touched only by the thread running the job's hooks).
_children: list[subprocess.Popen[bytes]] = []
_TRUE = ("true", "1", "yes", "on")


def _option(name: str, default: str) -> str:
    from airflow.configuration import conf

    return str(conf.get("neli", name, fallback=default))


def enabled() -> bool:
    """``[neli] liveness``: on unless set false (``False``, ``0``, ``no``, ``off``)."""
    return _option("liveness", "True").strip().lower() in _TRUE


def wanted_components() -> tuple[set[str], list[str]]:
    """``[neli] liveness_components``: the chosen components, and the unknown names."""
    names = [n.strip() for n in _option("liveness_components", "scheduler").split(",")]
    return ({n for n in names if n in _JOB_TYPES},
            [n for n in names if n and n not in _JOB_TYPES])


def starting_component(depth: int = 64) -> str | None:
    """The Airflow component whose ``Job()`` is being constructed: the nearest CLI command
    module on the call stack (``scheduler``, ``triggerer``, ``dag-processor``), or None."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return None
        name = _COMMAND_MODULES.get(frame.f_globals.get("__name__", ""))
        if name is not None:
            return name
        frame = frame.f_back
    return None


@hookimpl
def on_starting(component: Any) -> None:
    """A job (scheduler, triggerer, ...) starts: spawn the announcer if it is a chosen one.

    Synchronous and silent (see the module docstring): no thread, no lock, no log call.
    """
    if not hasattr(component, "job_type"):
        return  # the task runner's marker, not a job
    name = starting_component()
    if name is None or not enabled():
        return
    chosen, _unknown = wanted_components()
    if name not in chosen:
        return
    _children.append(spawn(name, _option("liveness_conn_id", "neli_default")))


@hookimpl
def before_stopping(component: Any) -> None:
    """The job stops: stop announcing (the member expires after the liveness timeout)."""
    children = list(_children)
    _children.clear()
    for child in children:
        _stop_child(child)


def spawn(component: str, conn_id: str) -> subprocess.Popen[bytes]:
    """Start the announcer child of this process (it reads the connection itself)."""
    return subprocess.Popen(
        [sys.executable, "-m", "neli_orchestrate.airflow.liveness", "--component", component,
         "--conn-id", conn_id, "--parent-pid", str(os.getpid())],
        stdin=subprocess.DEVNULL, close_fds=True)


def _announcer_config(conn_id: str, *, component: str) -> Any:
    from airflow.models.connection import Connection

    from neli_orchestrate.airflow.hooks.neli import NeliHook
    from neli_orchestrate.singleton.announce import announcer_config

    conn = Connection.get_connection_from_secrets(conn_id)
    config = NeliHook(conn_id, connection=conn).singleton_config()  # type: ignore[arg-type]
    return announcer_config(config, component=component)


def _wait_parent(seconds: float, parent: int) -> bool:
    """Sleep ``seconds``; False as soon as ``parent`` is no longer our parent."""
    end = time.monotonic() + seconds
    while True:
        if os.getppid() != parent:
            return False
        left = end - time.monotonic()
        if left <= 0:
            return True
        time.sleep(min(0.5, left))


def main(argv: Sequence[str] | None = None) -> int:
    """The announcer child: read the connection (with backoff), then exec the announcer."""
    parser = argparse.ArgumentParser(prog="python -m neli_orchestrate.airflow.liveness")
    parser.add_argument("--component", required=True, choices=sorted(_JOB_TYPES))
    parser.add_argument("--conn-id", required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _chosen, unknown = wanted_components()
    if unknown:
        log.warning("[neli] liveness_components: unknown %s (known: %s)", unknown,
                    ", ".join(_JOB_TYPES))
    delay = 1.0
    while True:
        if os.getppid() != args.parent_pid:
            return 0  # the component is gone already
        try:
            config = _announcer_config(args.conn_id, component=args.component)
            break
        except Exception as exc:  # noqa: BLE001 - connection not defined yet, bad extras
            log.warning("NELI liveness (%s): cannot read connection %r (%s); retrying in"
                        " %.0f s", args.component, args.conn_id, exc, delay)
            if not _wait_parent(delay, args.parent_pid):
                return 0
            delay = min(delay * 2, 30.0)
    log.info("NELI liveness: the %s announces deployment %r in group %r (supervisor pid %d, "
             "timeout %g s)", args.component, config.deployment, config.group, os.getpid(),
             config.timeout)
    import signal

    supervisor = AnnouncerSupervisor(config, parent=args.parent_pid)
    signal.signal(signal.SIGTERM, lambda *_: supervisor.stop())
    signal.signal(signal.SIGINT, lambda *_: supervisor.stop())
    supervisor.run()
    return 0


class AnnouncerSupervisor:
    """Keep the liveness announcer (a child process) running while ``parent`` lives.

    ``start()`` starts an announcer (default:
    :func:`~neli_orchestrate.singleton.announce.start_announcer`,
    which exits when this process is gone), ``gauge(value)`` reports whether one runs (default:
    Airflow's ``Stats`` gauge :data:`~neli_orchestrate.airflow.metrics.LIVENESS_ANNOUNCER_UP`).
    The clock and the pause are injectable for deterministic tests.
    """

    #: Pause before the first restart, doubled after each quick death, up to MAX_BACKOFF.
    FIRST_BACKOFF = 1.0
    MAX_BACKOFF = 30.0
    #: An announcer that ran this long resets the backoff.
    HEALTHY_AFTER = 60.0
    #: While no announcer runs, an ERROR this often.
    ERROR_EVERY = 60.0
    #: The gauge is sent again this often (StatsD gauges are not kept by every backend).
    GAUGE_EVERY = 10.0
    POLL = 0.5

    def __init__(self, config: Any, *, parent: int,
                 start: Callable[[], Any] | None = None,
                 gauge: Callable[[float], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 parent_alive: Callable[[], bool] | None = None) -> None:
        self.config = config
        self.parent = parent
        self._start = start or self._spawn
        self._gauge = gauge or self._airflow_gauge
        self.clock = clock
        self.sleep = sleep
        self.parent_alive = parent_alive or (lambda: os.getppid() == parent)
        self.stopping = False
        #: Announcers started so far (the first included) and restarts after a death.
        self.starts = 0
        self.restarts = 0
        self.child: Any = None
        self._stats_ready = False

    def stop(self) -> None:
        self.stopping = True

    def run(self) -> None:
        backoff = self.FIRST_BACKOFF
        next_start = self.clock()
        started_at = 0.0
        last_error: float | None = None
        last_gauge: tuple[float, float] | None = None  # (time, value)
        down_since: float | None = None
        why = "not started yet"
        try:
            while not self.stopping and self.parent_alive():
                now = self.clock()
                if self.child is not None and self.child.poll() is not None:
                    code, ran = self.child.returncode, now - started_at
                    self.child = None
                    next_start = now + backoff
                    why = f"exited with code {code} after {ran:.1f} s"
                    log.warning("NELI liveness: the announcer of deployment %r %s; starting it "
                                "again in %.0f s", self.config.deployment, why, backoff)
                    backoff = min(backoff * 2, self.MAX_BACKOFF)
                    down_since = now if down_since is None else down_since
                elif self.child is not None and now - started_at >= self.HEALTHY_AFTER:
                    # it runs: the next death starts from the first pause and errors at once
                    backoff, down_since, last_error = self.FIRST_BACKOFF, None, None
                if self.child is None and now >= next_start:
                    try:
                        self.child = self._start()
                    except Exception as exc:  # noqa: BLE001 - no python, no fork: try again
                        why = f"could not be started: {exc}"
                        next_start = now + backoff
                        backoff = min(backoff * 2, self.MAX_BACKOFF)
                        down_since = now if down_since is None else down_since
                    else:
                        started_at = now
                        self.starts += 1
                        if self.starts > 1:
                            self.restarts += 1
                            log.info("NELI liveness: announcer of deployment %r started again "
                                     "(pid %s, restart %d)", self.config.deployment,
                                     getattr(self.child, "pid", "?"), self.restarts)
                up = 1.0 if self.child is not None else 0.0
                if not up and down_since is not None and (
                        last_error is None or now - last_error >= self.ERROR_EVERY):
                    last_error = now
                    log.error(
                        "NELI liveness: no announcer runs for deployment %r (last: %s; down "
                        "since %.0f s, %d restarts): other regions read it as GONE and take its "
                        "claims over. Check Kafka from the scheduler's host and the connection "
                        "(neli.liveness_announcer_up = 0)",
                        self.config.deployment, why, now - down_since, self.restarts)
                if last_gauge is None or last_gauge[1] != up or \
                        now - last_gauge[0] >= self.GAUGE_EVERY:
                    self._send(up)
                    last_gauge = (now, up)
                self.sleep(self.POLL)
        finally:
            self._end()

    def _end(self) -> None:
        child, self.child = self.child, None
        if child is not None and child.poll() is None:
            _stop_child(child)
        self._send(0.0)

    def _send(self, value: float) -> None:
        try:
            self._gauge(value)
        except Exception:  # noqa: BLE001 - a metrics backend never stops the announcer
            log.warning("NELI liveness: could not send %s", "neli.liveness_announcer_up",
                        exc_info=True)

    def _spawn(self) -> Any:
        from neli_orchestrate.singleton.announce import start_announcer

        return start_announcer(self.config)

    def _airflow_gauge(self, value: float) -> None:
        from neli_orchestrate.airflow.metrics import LIVENESS_ANNOUNCER_UP, gauge, init_stats

        if not self._stats_ready:
            init_stats()
            self._stats_ready = True
        gauge(LIVENESS_ANNOUNCER_UP, value, {"deployment": self.config.deployment,
                                             "component": self.config.component})


if __name__ == "__main__":
    sys.exit(main())


def _stop_child(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM, up to 10 s, then SIGKILL: the announcer is ours and holds nothing to finish."""
    child.terminate()
    try:
        child.wait(10)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(10)
