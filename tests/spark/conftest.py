"""Shared helpers for the Spark-side tests: the example jobs are importable as ``jobs.*``."""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"

# spark-submit runs dags/jobs/*.py as scripts; tests import the same code as the ``jobs``
# package, the way Airflow's dags folder and the Dagster example do.
if str(DAGS) not in sys.path:
    sys.path.insert(0, str(DAGS))


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """A local S3-compatible server (moto's server mode) for one test module; its endpoint."""
    # moto's request recorder writes its file where it is told when moto is imported (default:
    # the working directory, which is the repository's)
    os.environ.setdefault("MOTO_RECORDER_FILEPATH",
                          os.path.join(tempfile.mkdtemp(prefix="neli-moto-"), "recording"))
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
