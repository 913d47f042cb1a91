"""The simulation lives in the repository, not the package: import it as ``integration.sim``.

Its tests are pure Python on one core: the release matrix's nested runs
(``tests/compat/compat_runs.py``) start with them and use the other core, so the test command
does not wait on the matrix alone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "compat"))
import compat_runs  # noqa: E402


@pytest.fixture(scope="package", autouse=True)
def _release_matrix_alongside(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    if compat_runs.wanted(request.session):
        compat_runs.start(request.config, tmp_path_factory)
