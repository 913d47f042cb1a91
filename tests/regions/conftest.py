"""Fixtures of the region tests: real Airflow deployments on the session's Kafka broker."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# integration/ (harness, chaos suite) is imported as a namespace package from the repository.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# In-process Airflow imports read $AIRFLOW_HOME: keep them out of the user's ~/airflow.
if "AIRFLOW_HOME" not in os.environ:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="neli-airflow-tests-")


@pytest.fixture(scope="module")
def patient_broker(tmp_path_factory: pytest.TempPathFactory):
    """A broker of this module's own, given five minutes to start: the region tests run two
    Airflow deployments and Spark beside it on a small shared machine. Fails (never skips)
    when Kafka cannot start."""
    from neli_orchestrate.testing.local_kafka import LocalKafka

    kafka = LocalKafka(workdir=tmp_path_factory.mktemp("kafka")).start(timeout=300)
    try:
        yield kafka.bootstrap_servers
    finally:
        kafka.stop()
