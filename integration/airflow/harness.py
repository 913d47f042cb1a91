"""Several real Airflow 3.3 deployments ("regions") on one machine: the tests' entry point.

The library is :mod:`neli_orchestrate.demo.regions` (``neli-orchestrate demo`` uses it too);
this module re-exports it for the tests and benchmarks and adds a command line that starts
regions and prints their UIs until Ctrl-C::

    python integration/airflow/harness.py --bootstrap 127.0.0.1:9092 us-east-1 eu-west-1
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from neli_orchestrate.demo.regions import (  # noqa: F401 - re-exported
    AIRFLOW,
    MARKER_ENV,
    SPARK_LOCAL_CONNECTION,
    TERMINAL_RUN_STATES,
    TERMINAL_TI_STATES,
    VENV_BIN,
    AirflowRegion,
    AirflowRegions,
    HarnessError,
    RegionConfig,
    airflow_version,
    cache_dir,
    connection_body,
    connection_env,
    free_port,
    ledger_history,
    neli_connection,
    new_fernet_key,
    template_database,
)

logger = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    """Start regions on one machine and print their UIs until Ctrl-C."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("regions", nargs="+", help="region (deployment) names")
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    parser.add_argument("--namespace", default="neli", help="NELI namespace (shared)")
    parser.add_argument("--root", default=None, help="directory for the homes (default: temp)")
    parser.add_argument("--output", default="/tmp/neli/nycflights_daily", help="shared output")
    parser.add_argument("--dags", default=str(Path(__file__).resolve().parents[2] / "dags"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    root = Path(args.root or tempfile.mkdtemp(prefix="neli-airflow-"))
    dags_dir = Path(args.dags)
    sources = [p for p in dags_dir.iterdir() if p.name != "__pycache__"]
    configs = [
        RegionConfig(
            name,
            connections={
                "neli_default": neli_connection(args.bootstrap, name, namespace=args.namespace),
                "spark_default": SPARK_LOCAL_CONNECTION,
            },
            variables={"nycflights_output": args.output},
            dag_processor=True,
        )
        for name in args.regions
    ]
    with AirflowRegions.start(root, sources, configs) as regions:
        for region in regions:
            logger.info("%s: UI %s (home %s)", region.name, region.api_url, region.home)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
