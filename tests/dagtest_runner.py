"""Run one DAG file with real Airflow 3.3 (`airflow dags test`) in a fresh home, for tests.

``airflow dags test`` runs each task through the Task SDK's task runner in one process (the
same ``_execute_task``, ``execution_timeout`` and SIGTERM handling as a worker), without a
scheduler or api-server: seconds instead of the ~35 s of a full deployment. The metadata
database is a copy of the migrated template the regions harness keeps.

Usage::

    result = run_dag(tmp_path, dag_source, "my_dag", connections={"neli_default": {...}})
    assert result.returncode != 0 and "AirflowTaskTimeout" in result.output
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from integration.regions.regions import AIRFLOW, VENV_BIN, new_fernet_key, template_database


@dataclass
class DagTest:
    returncode: int
    output: str


def dag_command(
    root: Path,
    source: str,
    dag_id: str,
    *,
    connections: Mapping[str, Mapping[str, Any]] | None = None,
    env: Mapping[str, str] | None = None,
    logical_date: str = "2013-01-01",
) -> tuple[list[str], dict[str, str]]:
    """Write ``source`` as ``<root>/dags/<dag_id>.py``; the ``airflow dags test`` command line
    and environment that run it in a fresh home."""
    home = root / "airflow_home"
    dags = root / "dags"
    home.mkdir(parents=True, exist_ok=True)
    dags.mkdir(parents=True, exist_ok=True)
    (dags / f"{dag_id}.py").write_text(source)
    database = home / "airflow.db"
    shutil.copyfile(template_database(), database)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    environ.update({
        "PATH": f"{VENV_BIN}{os.pathsep}{environ.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__FERNET_KEY": new_fernet_key(),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{database}",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
    })
    for conn_id, connection in dict(connections or {}).items():
        environ[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(dict(connection))
    environ.update(env or {})
    return [AIRFLOW, "dags", "test", dag_id, logical_date], environ


def start_dag(root: Path, source: str, dag_id: str, **kwargs: Any) -> subprocess.Popen[str]:
    """:func:`run_dag` in the background (output to ``<root>/dags_test.log``)."""
    cmd, environ = dag_command(root, source, dag_id, **kwargs)
    with open(root / "dags_test.log", "w") as out:
        return subprocess.Popen(cmd, env=environ, stdout=out, stderr=subprocess.STDOUT,
                                text=True)


def run_dag(root: Path, source: str, dag_id: str, *, timeout: float = 300,
            **kwargs: Any) -> DagTest:
    """Write ``source`` as ``<root>/dags/<dag_id>.py`` and run ``airflow dags test`` on it."""
    cmd, environ = dag_command(root, source, dag_id, **kwargs)
    result = subprocess.run(cmd, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=timeout)
    return DagTest(result.returncode, result.stdout)
