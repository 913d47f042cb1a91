"""A real Spark standalone cluster (one master, one worker) on loopback, from the pyspark wheel.

Usage::

    with LocalSparkCluster() as cluster:
        cluster.master_url          # "spark://127.0.0.1:<rpc>": what workers and executors use
        cluster.rest_url            # "spark://127.0.0.1:<rest>": cluster-mode spark-submit
        cluster.state()             # the master's JSON status (workers, drivers, apps)
        cluster.driver_state("driver-20251125200103-0000")   # "RUNNING", "KILLED", ...

Both daemons are started with ``$SPARK_HOME/bin/spark-class`` (``SPARK_HOME`` = the installed
``pyspark`` package) on free loopback ports, with the master's REST submission server on
(``spark.master.rest.enabled=true``): cluster deploy mode submits through it, and the Apache
Spark provider polls and kills drivers through it. :meth:`start` returns once the master's
JSON status shows it ALIVE with one ALIVE worker; a cluster that cannot start raises
:class:`LocalSparkError` with the tails of both logs. The JVMs die with the process that
started them (``PR_SET_PDEATHSIG``); :meth:`stop` sends SIGTERM (the worker then kills its
drivers and executors), then SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from neli_orchestrate.errors import NeliError
from neli_orchestrate.testing.local_kafka import _die_with_parent, free_port

__all__ = ["LocalSparkCluster", "LocalSparkError"]

log = logging.getLogger(__name__)

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class LocalSparkError(NeliError):
    """The local Spark cluster could not start (the message holds the log tails)."""


class LocalSparkCluster:
    """One Spark standalone master and one worker on free 127.0.0.1 ports."""

    def __init__(self, *, workdir: str | os.PathLike[str] | None = None, cores: int = 2,
                 memory: str = "1g") -> None:
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="neli-spark-"))
        self.cores = cores
        self.memory = memory
        self.port = free_port()
        self.rest_port = free_port()
        self.webui_port = free_port()
        self.worker_webui_port = free_port()
        self.master: subprocess.Popen[bytes] | None = None
        self.worker: subprocess.Popen[bytes] | None = None

    @property
    def master_url(self) -> str:
        """The master's RPC URL (workers, client-mode applications)."""
        return f"spark://127.0.0.1:{self.port}"

    @property
    def rest_url(self) -> str:
        """The master's REST submission server as a Spark master URL (cluster deploy mode)."""
        return f"spark://127.0.0.1:{self.rest_port}"

    @property
    def json_url(self) -> str:
        return f"http://127.0.0.1:{self.webui_port}/json"

    def environ(self) -> dict[str, str]:
        """Environment for spark-class and spark-submit against this cluster."""
        from neli_orchestrate.spark.conf import spark_home

        conf_dir = self.workdir / "conf"
        conf_dir.mkdir(parents=True, exist_ok=True)
        return {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_CONF_DIR": str(conf_dir),  # no stray spark-defaults.conf from elsewhere
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.workdir / "logs"),
            "SPARK_WORKER_DIR": str(self.workdir / "work"),
            "SPARK_NO_DAEMONIZE": "1",
        }

    def start(self, timeout: float = 120.0) -> LocalSparkCluster:
        """Start master and worker; return once the master sees the worker ALIVE."""
        from neli_orchestrate.errors import ConfigError
        from neli_orchestrate.spark.conf import spark_home

        try:
            spark_class = spark_home() / "bin" / "spark-class"
        except ConfigError as exc:
            raise LocalSparkError(str(exc)) from exc
        properties = self.workdir / "master.properties"
        self.workdir.mkdir(parents=True, exist_ok=True)
        properties.write_text(
            "spark.master.rest.enabled true\n"
            f"spark.master.rest.port {self.rest_port}\n"
            "spark.master.rest.host 127.0.0.1\n"
        )
        deadline = time.monotonic() + timeout
        self.master = self._launch("master", [
            str(spark_class), MASTER_CLASS, "--host", "127.0.0.1", "--port", str(self.port),
            "--webui-port", str(self.webui_port), "--properties-file", str(properties)])
        self._wait(lambda s: s.get("status") == "ALIVE", "the master to be ALIVE", deadline)
        self.worker = self._launch("worker", [
            str(spark_class), WORKER_CLASS, self.master_url, "--host", "127.0.0.1",
            "--webui-port", str(self.worker_webui_port), "--cores", str(self.cores),
            "--memory", self.memory, "--work-dir", str(self.workdir / "work")])
        self._wait(lambda s: any(w.get("state") == "ALIVE" for w in s.get("workers", [])),
                   "a worker to register", deadline)
        log.info("Spark standalone cluster up: %s (REST %s, UI %s)", self.master_url,
                 self.rest_url, self.json_url)
        return self

    def _launch(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        with open(self.workdir / f"{name}.log", "ab") as out:
            return subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.workdir, env=self.environ(), start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    def _wait(self, ready: Any, what: str, deadline: float) -> None:
        last = "no answer"
        while time.monotonic() < deadline:
            for name, proc in (("master", self.master), ("worker", self.worker)):
                if proc is not None and proc.poll() is not None:
                    raise LocalSparkError(
                        f"the Spark {name} exited with code {proc.returncode} while waiting for "
                        f"{what}\n{self.log_tail()}")
            try:
                if ready(self.state(timeout=2)):
                    return
                last = "not yet"
            except (OSError, ValueError) as exc:
                last = repr(exc)
            time.sleep(0.3)
        raise LocalSparkError(f"timed out waiting for {what} ({last})\n{self.log_tail()}")

    def state(self, timeout: float = 5.0) -> dict[str, Any]:
        """The master's JSON status (``/json`` of its web UI)."""
        with urllib.request.urlopen(self.json_url, timeout=timeout) as response:
            data: dict[str, Any] = json.loads(response.read().decode())
        return data

    def driver_state(self, driver_id: str) -> str | None:
        """The state the master shows for ``driver_id`` (None if it does not know it)."""
        state = self.state()
        for driver in [*state.get("activedrivers", []), *state.get("completeddrivers", [])]:
            if driver.get("id") == driver_id:
                return str(driver.get("state"))
        return None

    def kill_driver(self, driver_id: str) -> None:
        """Ask the master (REST) to kill ``driver_id`` (clean-up of what a test left)."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.rest_port}/v1/submissions/kill/{driver_id}", method="POST")
        with contextlib.suppress(urllib.error.URLError, OSError):
            urllib.request.urlopen(request, timeout=10).close()

    def log_tail(self, lines: int = 30) -> str:
        parts = []
        for name in ("master", "worker"):
            path = self.workdir / f"{name}.log"
            text = path.read_text(errors="replace").splitlines() if path.exists() else []
            parts.append(f"--- {name} log ({path}) ---\n" + "\n".join(text[-lines:]))
        return "\n".join(parts)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop worker (which kills its drivers and executors), then master."""
        for attr in ("worker", "master"):
            proc = getattr(self, attr)
            setattr(self, attr, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("Spark %s did not stop within %.0f s of SIGTERM; killing it", attr,
                            timeout)
                proc.kill()
                proc.wait(10)

    def __enter__(self) -> LocalSparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
