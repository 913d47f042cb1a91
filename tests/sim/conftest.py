"""The simulation's tests are pure Python on one core: the release matrix's nested runs
(``tests/compat/compat_runs.py``) start with them and use the other core, so the test command
does not wait on the matrix alone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compat"))
import compat_runs  # noqa: E402


@pytest.fixture(scope="package", autouse=True)
def _release_matrix_alongside(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    if compat_runs.wanted(request.session):
        compat_runs.start(request.config, tmp_path_factory)
