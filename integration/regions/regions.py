"""Run several real Airflow 3.3 deployments ("regions") side by side on one machine.

Usage::

    with AirflowRegions.start(
        root=tmp_path,
        dags=[Path("dags/nycflights_daily.py"), Path("dags/jobs")],
        regions=[RegionConfig("us-east-1", connections=...), RegionConfig("eu-west-1", ...)],
    ) as regions:
        for region in regions:
            region.trigger("nycflights_daily", "2013-01-01")
        states = regions["us-east-1"].wait_for_runs("nycflights_daily", ["..."], timeout=300)

Each region is a separate deployment: its own ``AIRFLOW_HOME``, SQLite database, api-server
port, execution API URL, worker and trigger log-server ports, JWT secret and Fernet key, and its own
components: ``api-server`` (UI, REST and execution API), ``scheduler`` (LocalExecutor: every
task runs under the real task supervisor) and optionally ``triggerer`` and ``dag-processor``.
Regions share only what real regions share: Kafka (through their connections) and whatever
storage their DAGs write to.

Connections are created the way users create them: in the region's metadata database, through
its REST API, once the api-server is up (``RegionConfig.connection_source="database"``, the
default); ``"environment"`` passes them as ``AIRFLOW_CONN_*`` variables instead. Every process
of a region shares one explicit ``AIRFLOW__CORE__FERNET_KEY``: components started at once in a
home without ``airflow.cfg`` race to write it, and only the winner would get a key, so a
connection stored encrypted by one process was unreadable ("conn_id ... isn't defined") by the
others (docs/guide/demo.md).

Cost, measured on 2 cores (see docs/guide/airflow.md): the database is migrated once per Airflow
version into a cached template (~6 s) and copied; ``dags reserialize`` (~5 s) replaces a
running dag-processor; api-server + scheduler + triggerer are healthy ~20-30 s after start.

Every process the harness starts carries ``NELI_HARNESS_REGION=<unique id>`` in its
environment; ``stop()`` kills the components' process groups and then any process that still
carries its id (task processes, spark-submit JVMs), so nothing outlives a region.

The tests, the benchmarks, the chaos suite and the demo (:mod:`integration.regions`, ``./demo``)
import it from here. As a command it starts regions and prints their UIs until Ctrl-C::

    python -m integration.regions.regions --bootstrap 127.0.0.1:9092 us-east-1 eu-west-1
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: Environment marker on every process a region starts (value: the region's unique id).
MARKER_ENV = "NELI_HARNESS_REGION"

VENV_BIN = Path(sys.executable).parent
AIRFLOW = str(VENV_BIN / "airflow")

TERMINAL_RUN_STATES = frozenset({"success", "failed"})
TERMINAL_TI_STATES = frozenset(
    {"success", "failed", "skipped", "upstream_failed", "removed", "upstream_skipped"}
)


class HarnessError(RuntimeError):
    """A region could not be prepared or started, or a wait ran out; the message says why."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    # The component gets SIGKILL if the harness process dies without stop(); its own children
    # are then killed by the sweep of the next stop() or remain in its (killed) process group.
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def cache_dir() -> Path:
    """Where migrated template databases are kept ($NELI_AIRFLOW_CACHE or the XDG cache)."""
    base = os.environ.get("NELI_AIRFLOW_CACHE")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "neli-orchestrate" / "airflow"


def airflow_version() -> str:
    """The installed Airflow's version (without importing Airflow)."""
    from importlib.metadata import version

    return version("apache-airflow-core")


def template_database(timeout: float = 300.0) -> Path:
    """Return a freshly migrated SQLite metadata DB for this Airflow version (built once)."""
    directory = cache_dir() / airflow_version()
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "airflow.db"
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return target
        home = directory / f"home-{uuid.uuid4().hex[:8]}"
        home.mkdir()
        partial = home / "airflow.db"
        env = {
            **_base_env(),
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{partial}",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        }
        result = subprocess.run(
            [AIRFLOW, "db", "migrate"],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise HarnessError(f"airflow db migrate failed:\n{result.stdout[-3000:]}")
        os.replace(partial, target)
        shutil.rmtree(home, ignore_errors=True)
        return target


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    # spark-submit and airflow must come from this virtualenv, whatever PATH the caller has.
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def connection_env(conn_id: str, connection: Mapping[str, Any]) -> tuple[str, str]:
    """The ``AIRFLOW_CONN_<ID>`` variable holding ``connection`` (JSON form)."""
    return f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(dict(connection))


def neli_connection(bootstrap_servers: str, deployment: str, **extra: Any) -> dict[str, Any]:
    """A ``neli`` connection dict for ``AIRFLOW_CONN_NELI_DEFAULT``."""
    return {
        "conn_type": "neli",
        "host": bootstrap_servers,
        "extra": {"deployment": deployment, **extra},
    }


def connection_body(conn_id: str, connection: Mapping[str, Any]) -> dict[str, Any]:
    """The REST API body (``POST /api/v2/connections``) of a connection in JSON form."""
    fields = {"conn_type", "host", "port", "login", "password", "schema", "extra", "description"}
    unknown = set(connection) - fields
    if unknown:
        raise ValueError(f"connection {conn_id!r}: unknown fields {sorted(unknown)}")
    body: dict[str, Any] = {"connection_id": conn_id, **dict(connection)}
    if isinstance(body.get("extra"), Mapping):
        body["extra"] = json.dumps(dict(body["extra"]))
    return body


def new_fernet_key() -> str:
    """A fresh Fernet key (what ``airflow.cfg`` would hold), for one deployment."""
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode()


#: spark_default for the examples: local[*]. Without it SparkSubmitOperator submits to YARN.
SPARK_LOCAL_CONNECTION = {"conn_type": "spark", "host": "local[*]"}


@dataclass
class RegionConfig:
    """One deployment: its name (also its NELI deployment id), connections, variables, env."""

    name: str
    connections: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    variables: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    triggerer: bool = True
    dag_processor: bool = False
    parallelism: int = 8
    #: "database": create ``connections`` through the REST API once the region is up (what
    #: users do); "environment": pass them as ``AIRFLOW_CONN_*`` variables.
    connection_source: str = "database"
    #: run every process of the region in this network namespace (``ip netns``; it must
    #: exist), its api-server reached from outside at ``address``
    netns: str | None = None
    address: str = "127.0.0.1"
    #: False: every request is an admin (``simple_auth_manager_all_admins``, no login). True:
    #: the simple auth manager with one user, ``admin`` (role admin, password
    #: ``AirflowRegion.admin_password``); anonymous requests are refused, and the harness's
    #: own REST calls log in (``POST /auth/token``).
    secured: bool = False

    def __post_init__(self) -> None:
        if self.connection_source not in ("database", "environment"):
            raise ValueError(
                f"RegionConfig.connection_source must be 'database' or 'environment', "
                f"got {self.connection_source!r}"
            )


class AirflowRegion:
    """One real Airflow deployment under ``root/<name>``; see the module docstring."""

    def __init__(self, root: Path, dags_folder: Path, config: RegionConfig) -> None:
        self.config = config
        self.name = config.name
        self.home = Path(root) / config.name
        self.dags_folder = Path(dags_folder)
        self.api_port = free_port()
        self.worker_log_port = free_port()
        self.trigger_log_port = free_port()
        self.marker = f"{config.name}-{uuid.uuid4().hex[:12]}"
        self._jwt_secret = secrets.token_hex(32)  # 64 bytes: the HS512 minimum
        self.fernet_key = new_fernet_key()
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self.admin_password = secrets.token_urlsafe(16)
        self._token: str | None = None

    # -- configuration -------------------------------------------------------------------------

    @property
    def api_url(self) -> str:
        """Base URL of this region's api-server (UI at ``/``)."""
        return f"http://{self.config.address}:{self.api_port}"

    @property
    def database(self) -> Path:
        return self.home / "airflow.db"

    @property
    def logs_folder(self) -> Path:
        return self.home / "logs"

    @property
    def passwords_file(self) -> Path:
        """The simple auth manager's passwords (``secured`` regions)."""
        return self.home / "passwords.json"

    def environ(self) -> dict[str, str]:
        """The complete environment of this region's processes (also for `airflow` CLI calls)."""
        env = _base_env()
        env.update(
            {
                MARKER_ENV: self.marker,
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__PARALLELISM": str(self.config.parallelism),
                "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": str(not self.config.secured),
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.database}",
                "AIRFLOW__API__HOST": "0.0.0.0" if self.config.netns else "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.api_port),
                "AIRFLOW__API__WORKERS": "1",
                "AIRFLOW__API__BASE_URL": self.api_url,
                # tasks reach their own api-server inside the region (its namespace)
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL":
                    f"http://127.0.0.1:{self.api_port}/execution/",
                # Several deployments share a few cores: the default 5 s lets a task's first
                # call time out, its retry is refused (400) and the try fails before it starts.
                "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
                "AIRFLOW__API_AUTH__JWT_SECRET": self._jwt_secret,
                # One key for every process of the region (see the module docstring).
                "AIRFLOW__CORE__FERNET_KEY": self.fernet_key,
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.worker_log_port),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(self.trigger_log_port),
                "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.logs_folder),
                "AIRFLOW__NELI__DEPLOYMENT": self.name,
            }
        )
        if self.config.secured:
            env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] = "admin:admin"
            env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] = str(self.passwords_file)
        if self.config.connection_source == "environment":
            for conn_id, connection in self.config.connections.items():
                key, value = connection_env(conn_id, connection)
                env[key] = value
        for key, value in self.config.variables.items():
            env[f"AIRFLOW_VAR_{key.upper()}"] = value
        env.update(self.config.env)
        return env

    # -- lifecycle -----------------------------------------------------------------------------

    def prepare(self, seed: Path | None = None) -> None:
        """Create the home and its database: a copy of ``seed`` (migrated, DAGs serialized), or
        of the migrated template followed by ``airflow dags reserialize``."""
        self.home.mkdir(parents=True, exist_ok=True)
        if self.config.secured:
            self.passwords_file.write_text(json.dumps({"admin": self.admin_password}))
        shutil.copyfile(seed or template_database(), self.database)
        if seed is not None:
            return
        result = self.cli("dags", "reserialize", timeout=240)
        if result.returncode != 0:
            raise HarnessError(f"{self.name}: dags reserialize failed:\n{result.stdout[-3000:]}")

    def cli(
        self, *args: str, timeout: float = 120, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``airflow <args>`` in this region's environment (stdout and stderr merged);
        ``env`` overrides variables of that environment."""
        return subprocess.run(
            [AIRFLOW, *args],
            env={**self.environ(), **dict(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )

    def components(self) -> list[str]:
        names = ["api-server", "scheduler"]
        if self.config.triggerer:
            names.append("triggerer")
        if self.config.dag_processor:
            names.append("dag-processor")
        return names

    def launch(self) -> None:
        """Start the components (returns at once; see :meth:`wait_healthy`)."""
        env = self.environ()
        for name in self.components():
            log = open(self.home / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
            netns = ["ip", "netns", "exec", self.config.netns] if self.config.netns else []
            self._procs[name] = subprocess.Popen(
                [*netns, AIRFLOW, name],
                env=env,
                cwd=self.home,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
            log.close()

    def wait_healthy(self, timeout: float = 180.0) -> None:
        """Return once the api-server answers and every started component reports healthy."""
        deadline = time.monotonic() + timeout
        wanted = {"scheduler"}
        if self.config.triggerer:
            wanted.add("triggerer")
        if self.config.dag_processor:
            wanted.add("dag_processor")
        last: Any = None
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise HarnessError(
                        f"{self.name}: {name} exited with {proc.returncode}:\n"
                        f"{self.component_log(name)}"
                    )
            try:
                last = self.api("GET", "/api/v2/monitor/health")
            except (OSError, HarnessError) as exc:
                last = exc
            else:
                if all(
                    (last.get(component) or {}).get("status") == "healthy" for component in wanted
                ):
                    self._check_import_errors()
                    return
            time.sleep(0.5)
        raise HarnessError(f"{self.name}: not healthy within {timeout:g} s (last: {last})")

    def _check_import_errors(self) -> None:
        errors = self.api("GET", "/api/v2/importErrors")
        if errors.get("total_entries"):
            details = "\n".join(
                f"{e.get('filename')}: {e.get('stack_trace', '')[-1500:]}"
                for e in errors.get("import_errors", [])
            )
            raise HarnessError(f"{self.name}: DAG import errors:\n{details}")

    def stop(self, timeout: float = 20.0) -> None:
        """Stop every component and every process of this region (nothing is left behind)."""
        for proc in self._procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self._procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc in self._procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self._procs.clear()
        self.sweep()

    def kill(self) -> list[int]:
        """kill -9 every process of this region at once (a region lost), leaving its home and
        database for :meth:`launch`; return the pids."""
        for proc in self._procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        pids = [p.pid for p in self._procs.values()]
        for proc in self._procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self._procs.clear()
        return pids + self.sweep()

    def sweep(self) -> list[int]:
        """Kill every process still carrying this region's marker; return their pids."""
        import psutil

        leftovers = []
        home = str(self.home.resolve())
        for proc in psutil.process_iter(["pid"]):
            if proc.pid == os.getpid():
                continue
            try:
                # LocalExecutor workers set their process title over their environment: the
                # marker is gone there, but they run in the region's home.
                cwd = proc.cwd()
                if proc.environ().get(MARKER_ENV) == self.marker or (
                    cwd == home or cwd.startswith(home + os.sep)
                ):
                    leftovers.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        for proc in leftovers:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(leftovers, timeout=10)
        return [p.pid for p in leftovers]

    def add_connection(self, conn_id: str, connection: Mapping[str, Any]) -> None:
        """Create (or replace) a connection in this region's metadata database, through the
        REST API as a user or a deployment pipeline would; ``connection`` is the JSON form
        (``conn_type``, ``host``, ``port``, ``login``, ``password``, ``schema``, ``extra``)."""
        body = connection_body(conn_id, connection)
        path = f"/api/v2/connections/{_q(conn_id)}"
        try:
            self.api("GET", path)
        except HarnessError as exc:
            if "-> 404" not in str(exc):
                raise
            self.api("POST", "/api/v2/connections", body)
        else:
            self.api("PATCH", path, body)

    def add_connection_cli(self, conn_id: str, connection: Mapping[str, Any]) -> None:
        """Create a connection with ``airflow connections add`` (the CLI way; ~5 s each)."""
        value = json.dumps(dict(connection))
        result = self.cli("connections", "add", conn_id, "--conn-json", value)
        if result.returncode != 0:
            raise HarnessError(
                f"{self.name}: airflow connections add {conn_id} failed:\n{result.stdout[-2000:]}"
            )

    def create_connections(self) -> None:
        """Create ``RegionConfig.connections`` in the database (connection_source "database")."""
        if self.config.connection_source != "database":
            return
        for conn_id, connection in self.config.connections.items():
            self.add_connection(conn_id, connection)

    def component_log(self, name: str, lines: int = 60) -> str:
        path = self.home / f"{name}.log"
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # -- REST API ------------------------------------------------------------------------------

    def token(self) -> str:
        """A JWT of the ``admin`` user of a ``secured`` region (``POST /auth/token``)."""
        if self._token is None:
            body = json.dumps({"username": "admin", "password": self.admin_password}).encode()
            request = urllib.request.Request(
                f"{self.api_url}/auth/token", data=body, method="POST",
                headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    self._token = str(json.loads(response.read())["access_token"])
            except urllib.error.HTTPError as exc:
                raise HarnessError(f"{self.name}: login as admin -> {exc.code}") from None
        return self._token

    def api(self, method: str, path: str, body: Any = None, timeout: float = 30.0) -> Any:
        """Call this region's REST API (as ``admin`` when ``secured``); return the JSON."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.config.secured and not path.startswith("/api/v2/monitor/"):
            headers["Authorization"] = f"Bearer {self.token()}"
        request = urllib.request.Request(
            self.api_url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise HarnessError(f"{self.name}: {method} {path} -> {exc.code}: {detail}") from None
        return json.loads(text) if text else None

    def trigger(
        self,
        dag_id: str,
        logical_date: str,
        run_id: str | None = None,
        conf: Mapping[str, Any] | None = None,
    ) -> str:
        """Create a DAG run for ``logical_date`` (``YYYY-MM-DD`` or ISO); return its run id."""
        when = logical_date if "T" in logical_date else f"{logical_date}T00:00:00Z"
        run_id = run_id or f"neli__{when.replace(':', '-')}"
        # The regions run Airflow on SQLite: under load a write can wait out SQLite's busy
        # timeout (the API answers 500 "Database error" and rolls back). Ask again for a while;
        # a run that exists by then (409) was created by an earlier attempt.
        deadline = time.monotonic() + 60.0
        retried = False
        while True:
            try:
                self.api(
                    "POST",
                    f"/api/v2/dags/{_q(dag_id)}/dagRuns",
                    {"dag_run_id": run_id, "logical_date": when, "conf": dict(conf or {})},
                )
                return run_id
            except HarnessError as exc:
                text = str(exc)
                if "-> 409" in text and retried and self._run_exists(dag_id, run_id):
                    return run_id
                if "-> 500" not in text or "Database error" not in text or \
                        time.monotonic() > deadline:
                    raise
                logger.warning("%s: creating DAG run %s met a database error; asking again",
                               self.name, run_id)
                retried = True
                time.sleep(1.0)

    def _run_exists(self, dag_id: str, run_id: str) -> bool:
        try:
            self.dag_run(dag_id, run_id)
        except HarnessError:
            return False
        return True

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self.api("GET", f"/api/v2/dags/{_q(dag_id)}/dagRuns/{_q(run_id)}")

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        """Task instances of a run by task id (state, try_number, start/end dates, ...)."""
        data = self.api("GET", f"/api/v2/dags/{_q(dag_id)}/dagRuns/{_q(run_id)}/taskInstances")
        return {ti["task_id"]: ti for ti in data["task_instances"]}

    def wait_for_runs(
        self, dag_id: str, run_ids: Iterable[str], timeout: float = 300.0
    ) -> dict[str, str]:
        """Wait until every run is success/failed; return their states (HarnessError on timeout)."""
        pending = list(run_ids)
        states: dict[str, str] = {}
        deadline = time.monotonic() + timeout
        while pending:
            for run_id in list(pending):
                try:
                    state = self.dag_run(dag_id, run_id)["state"]
                except TimeoutError:  # an api-server slow under load: ask again
                    continue
                if state in TERMINAL_RUN_STATES:
                    states[run_id] = state
                    pending.remove(run_id)
            if not pending:
                break
            if time.monotonic() > deadline:
                detail = {r: self.task_instances(dag_id, r) for r in pending}
                summary = {
                    r: {t: ti["state"] for t, ti in tis.items()} for r, tis in detail.items()
                }
                raise HarnessError(
                    f"{self.name}: runs {pending} not finished within {timeout:g} s: {summary}"
                )
            time.sleep(1.0)
        return states

    def wait_for_task(
        self,
        dag_id: str,
        run_id: str,
        task_id: str,
        states: Sequence[str],
        timeout: float = 120.0,
    ) -> dict[str, Any]:
        """Wait until a task instance reaches one of ``states``; return it."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = self.task_instances(dag_id, run_id).get(task_id)
            except TimeoutError:  # an api-server slow under load: ask again
                continue
            if last is not None and last["state"] in states:
                return last
            time.sleep(0.5)
        raise HarnessError(
            f"{self.name}: {dag_id}/{run_id}/{task_id} not in {list(states)} within "
            f"{timeout:g} s (last: {last and last['state']})"
        )

    def log_path(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> Path:
        return (
            self.logs_folder
            / f"dag_id={dag_id}"
            / f"run_id={run_id}"
            / f"task_id={task_id}"
            / f"attempt={try_number}.log"
        )

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """The task's log as text: one ``level event`` line per JSON record ('' if none)."""
        path = self.log_path(dag_id, run_id, task_id, try_number)
        if not path.exists():
            return ""
        lines = []
        for raw in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(raw)
            except ValueError:
                lines.append(raw)
                continue
            extra = {
                k: v
                for k, v in record.items()
                if k not in {"timestamp", "level", "event", "logger", "filename", "lineno"}
                and k not in {"map_index", "task_id", "ti_id", "run_id", "try_number", "dag_id"}
            }
            suffix = f" {extra}" if extra else ""
            lines.append(f"{record.get('level', '')} {record.get('event', '')}{suffix}")
        return "\n".join(lines)

    def all_logs(self) -> str:
        """Every task log and component log of this region, concatenated (for secret scans)."""
        texts = []
        for path in sorted(self.home.rglob("*.log")):
            texts.append(path.read_text(errors="replace"))
        return "\n".join(texts)


def ledger_history(
    bootstrap_servers: str,
    topic: str,
    kafka_config: Mapping[str, Any] | None = None,
    timeout: float = 30.0,
) -> list[Any]:
    """Every committed record of a ledger topic, in order (LedgerRecord; unreadable ones skipped).

    Evidence for tests and chaos runs: compaction keeps only the latest record per run key,
    but until it runs the topic holds the whole story (CLAIMED, RUNNING, COMPLETED, ...).
    """
    from confluent_kafka import Consumer, TopicPartition

    from neli_orchestrate.ledger.record import LedgerRecord

    consumer = Consumer(
        {
            **dict(kafka_config or {}),
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"neli-harness-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "logger": logger,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=timeout)
        partitions = sorted(metadata.topics[topic].partitions)
        ends = {}
        for p in partitions:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            ends[p] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records: list[Any] = []
        positions = {p: 0 for p in partitions}
        deadline = time.monotonic() + timeout
        while any(positions[p] < ends[p] for p in partitions):
            if time.monotonic() > deadline:
                raise HarnessError(f"ledger {topic!r} not read to its end within {timeout:g} s")
            for message in consumer.consume(500, timeout=1.0):
                if message.error():
                    continue
                offset = message.offset()
                value = message.value()
                if offset is None or value is None:
                    continue
                positions[message.partition()] = offset + 1
                record = LedgerRecord.decode(value, key=message.key(), offset=offset)
                if record is not None:
                    records.append(record)
            # Transaction markers occupy offsets too: the position can stop short of the end.
            for p in partitions:
                position = consumer.position([TopicPartition(topic, p)])[0].offset
                if position >= 0:
                    positions[p] = max(positions[p], position)
        return records
    finally:
        consumer.close()


def _q(text: str) -> str:
    return urllib.parse.quote(text, safe="")


class AirflowRegions:
    """Several AirflowRegion started together; a context manager that stops them all."""

    def __init__(self, regions: Sequence[AirflowRegion]) -> None:
        self.regions = list(regions)

    def __iter__(self) -> Iterator[AirflowRegion]:
        return iter(self.regions)

    def __getitem__(self, name: str) -> AirflowRegion:
        for region in self.regions:
            if region.name == name:
                return region
        raise KeyError(name)

    def __enter__(self) -> AirflowRegions:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @classmethod
    def start(
        cls,
        root: Path,
        dags: Sequence[Path],
        regions: Sequence[RegionConfig],
        *,
        timeout: float = 240.0,
        region_urls: bool = False,
    ) -> AirflowRegions:
        """Copy ``dags`` (files or directories) into one DAGs folder and start every region.

        ``region_urls``: add every region's UI base URL to the extra ``region_urls`` of each
        region's ``neli`` connections (entries the connection already has stay), as a user
        lists the regions' UIs there."""
        root = Path(root)
        dags_folder = root / "dags"
        dags_folder.mkdir(parents=True, exist_ok=True)
        for source in dags:
            source = Path(source)
            target = dags_folder / source.name
            if source.is_dir():
                shutil.copytree(
                    source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
                )
            else:
                shutil.copy2(source, target)
        group = cls([AirflowRegion(root, dags_folder, config) for config in regions])
        if region_urls:
            urls = {region.name: region.api_url for region in group.regions}
            for region in group.regions:
                region.config.connections = {
                    conn_id: _with_region_urls(connection, urls)
                    for conn_id, connection in region.config.connections.items()
                }
        try:
            # Serialize the DAGs once: the serialized rows depend only on the DAG files, which
            # all regions share (same folder), so every region starts from a copy.
            seed_region = AirflowRegion(root / "seed", dags_folder, RegionConfig("seed"))
            seed_region.prepare()
            for region in group.regions:
                region.prepare(seed=seed_region.database)
            for region in group.regions:
                region.launch()
            _in_parallel([lambda r=r: r.wait_healthy(timeout) for r in group.regions])
            for region in group.regions:
                region.create_connections()
        except BaseException:
            group.stop()
            raise
        return group

    def stop(self, timeout: float = 20.0) -> None:
        """Stop every region at once, each with ``timeout`` seconds of SIGTERM grace."""
        _in_parallel([functools.partial(r.stop, timeout) for r in self.regions])


def _with_region_urls(connection: Mapping[str, Any], urls: Mapping[str, str]) -> dict[str, Any]:
    """``connection`` (JSON form) with ``urls`` added to a ``neli`` connection's region_urls."""
    if connection.get("conn_type") != "neli":
        return dict(connection)
    extra = dict(connection.get("extra") or {})
    extra["region_urls"] = {**urls, **(extra.get("region_urls") or {})}
    return {**connection, "extra": extra}


def _in_parallel(calls: Sequence[Any]) -> None:
    errors: list[BaseException] = []

    def run(call: Any) -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def main(argv: Sequence[str] | None = None) -> int:
    """Start regions on one machine and print their UIs until Ctrl-C."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("regions", nargs="+", help="region (deployment) names")
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    parser.add_argument("--namespace", default="neli", help="NELI namespace (shared)")
    parser.add_argument("--root", default=None, help="directory for the homes (default: temp)")
    parser.add_argument("--output", default="/tmp/neli/nycflights_daily", help="shared output")
    parser.add_argument("--dags", default=str(Path(__file__).resolve().parents[2] / "dags"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    root = Path(args.root or tempfile.mkdtemp(prefix="neli-airflow-"))
    dags_dir = Path(args.dags)
    sources = [p for p in dags_dir.iterdir() if p.name != "__pycache__"]
    configs = [
        RegionConfig(
            name,
            connections={
                "neli_default": neli_connection(args.bootstrap, name, namespace=args.namespace),
                "spark_default": SPARK_LOCAL_CONNECTION,
            },
            variables={"nycflights_output": args.output},
            dag_processor=True,
        )
        for name in args.regions
    ]
    with AirflowRegions.start(root, sources, configs) as regions:
        for region in regions:
            logger.info("%s: UI %s (home %s)", region.name, region.api_url, region.home)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
