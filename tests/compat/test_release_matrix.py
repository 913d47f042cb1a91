"""The compatibility job inside the test command: the release-dependent broker tests
(``selection.py``) against the oldest supported 3.x and the newest 4.x.

Each release runs in its own pytest process, because the session's broker is one release;
``bash .ci/compat VERSION`` runs the same selection by hand. A release whose jars cannot be
fetched or whose broker cannot start fails here, like every other broker test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import selection  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.kafka
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("version", selection.VERSIONS)
def test_release_dependent_tests_pass_on(version: str, tmp_path: Path) -> None:
    env = {**os.environ, "NELI_TEST_KAFKA_VERSION": version}
    env.pop("NELI_TEST_BOOTSTRAP_SERVERS", None)  # this release's own broker, never a given one
    log = tmp_path / f"kafka-{version}.log"
    with log.open("w") as out:
        done = subprocess.run(
            # its own basetemp: the nested session must not rotate this session's tmp dirs
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             f"--basetemp={tmp_path / 'nested'}", *selection.node_ids(version)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    text = log.read_text()
    assert done.returncode == 0, f"Kafka {version}: exit {done.returncode}\n{text[-6000:]}"
    assert " passed" in text.splitlines()[-1], text[-2000:]
