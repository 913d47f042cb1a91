"""The compatibility job inside the test command: the release-dependent broker tests
(``selection.py``) against the oldest supported 3.x and the newest 4.x.

Each release runs in its own pytest process, because the session's broker is one release
(all releases at once: they mostly wait on broker timeouts);
``bash .ci/compat VERSION`` runs the same selection by hand. A release whose jars cannot be
fetched or whose broker cannot start fails here, like every other broker test.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import compat_runs  # noqa: E402
import selection  # noqa: E402


@pytest.fixture(scope="module")
def release_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, tuple[Any, Path]]]:
    """Every release's nested run, started at once: they mostly wait on the brokers' timeouts,
    so side by side they take the time of one (the CI budget) and each still has its own
    broker. In the whole test command they were started with the simulation's tests
    (``compat_runs.py``); here they are only waited for."""
    yield compat_runs.start(request.config, tmp_path_factory)
    compat_runs.stop()


@pytest.mark.kafka
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("version", selection.VERSIONS)
def test_release_dependent_tests_pass_on(
    version: str, release_runs: dict[str, tuple[Any, Path]]
) -> None:
    proc, log = release_runs[version]
    returncode = proc.wait(1400)
    text = log.read_text()
    assert returncode == 0, f"Kafka {version}: exit {returncode}\n{text[-6000:]}"
    assert " passed" in text.splitlines()[-1], text[-2000:]
