"""Fixtures of the region tests: real Airflow deployments on the session's Kafka broker."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# integration/ (harness, chaos suite) is imported as a namespace package from the repository.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# In-process Airflow imports read $AIRFLOW_HOME: keep them out of the user's ~/airflow.
if "AIRFLOW_HOME" not in os.environ:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="neli-airflow-tests-")
