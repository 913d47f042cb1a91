"""Run ``neli-orchestrate`` as users do (a subprocess) and fill a namespace's ledger."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass
from typing import Any

RAW_LIBRDKAFKA = re.compile(r"^%\d\|\d+\.\d+\|", re.MULTILINE)


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def cli(*args: str, timeout: float = 120) -> Result:
    """Run the CLI; fail the test if librdkafka printed raw lines or logging broke."""
    env = {**os.environ, "COLUMNS": "250"}
    proc = subprocess.run([sys.executable, "-m", "neli_orchestrate.cli", *args],
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert not RAW_LIBRDKAFKA.search(proc.stderr), proc.stderr
    assert "--- Logging error ---" not in proc.stderr, proc.stderr
    return Result(proc.returncode, proc.stdout, proc.stderr)


def new_namespace() -> str:
    return f"ns{uuid.uuid4().hex[:10]}"


def singleton(bootstrap: str, namespace: str, deployment: str):  # type: ignore[no-untyped-def]
    """A Singleton configured the way the Airflow hook and Dagster resource configure it."""
    from neli_orchestrate import NeliConfig, Singleton, SingletonConfig

    return Singleton(SingletonConfig(neli=NeliConfig(bootstrap_servers=bootstrap),
                                     namespace=namespace, deployment=deployment,
                                     acquire_timeout=60))
