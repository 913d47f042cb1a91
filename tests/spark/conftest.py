"""Shared helpers for the Spark-side tests: the example jobs are importable as ``jobs.*``."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"

# spark-submit runs dags/jobs/*.py as scripts; tests import the same code as the ``jobs``
# package, the way Airflow's dags folder and the Dagster example do.
if str(DAGS) not in sys.path:
    sys.path.insert(0, str(DAGS))
