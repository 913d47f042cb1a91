"""Connections created in a region's metadata database are readable by its tasks, in every region.

Regression for the harness race (docs/guide/demo.md): components started at once in a fresh home
without ``airflow.cfg`` raced to write it, and only the winner got a Fernet key; a connection
added later through the CLI or REST API (extra stored encrypted) was then "not defined" for the
others. Every region now has one explicit key for all its processes.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from integration.regions.regions import (
    AirflowRegions,
    RegionConfig,
    neli_connection,
    new_fernet_key,
)

pytestmark = [pytest.mark.airflow]

HERE = Path(__file__).resolve().parent
NAMES = ("us-east-1", "eu-west-1")


@pytest.mark.timeout(600)
def test_connections_created_in_the_database_are_readable_by_tasks_in_every_region(
    tmp_path: Path,
) -> None:
    secret = f"s-{uuid.uuid4().hex}"
    configs = [
        RegionConfig(
            name,
            connections={
                # an encrypted extra with a secret, as the neli connection carries SASL settings
                "neli_default": neli_connection(
                    "127.0.0.1:9", name, kafka_config={"sasl.password": secret}
                ),
            },
            triggerer=False,
        )
        for name in NAMES
    ]
    with AirflowRegions.start(tmp_path, [HERE / "dags" / "conn_probe.py"], configs) as regions:
        keys = {region.fernet_key for region in regions}
        assert len(keys) == len(NAMES), "every region has its own Fernet key"
        runs = {}
        for region in regions:
            # also the CLI way, after the components are up (what the new user did)
            region.add_connection_cli(
                "probe_cli", {"conn_type": "generic", "host": "h", "extra": {"k": region.name}}
            )
            # and a connection stored under a key the region's processes do not have: the probe
            # must fail on it, or the check below could not tell a broken key from a working one
            wrong = region.cli(
                "connections", "add", "probe_wrong_key", "--conn-json",
                json.dumps({"conn_type": "generic", "extra": {"k": "v"}}),
                env={"AIRFLOW__CORE__FERNET_KEY": new_fernet_key()},
            )
            assert wrong.returncode == 0, wrong.stdout[-2000:]
            for day, conn_id in enumerate(("neli_default", "probe_cli", "probe_wrong_key"), 1):
                out = tmp_path / f"{region.name}-{conn_id}.json"
                run_id = region.trigger(
                    "conn_probe",
                    f"2013-01-0{day}",
                    run_id=f"probe_{conn_id}",
                    conf={"conn_id": conn_id, "out": str(out)},
                )
                runs[(region.name, conn_id)] = (run_id, out)
        for (name, conn_id), (run_id, out) in runs.items():
            region = regions[name]
            state = region.wait_for_runs("conn_probe", [run_id], timeout=300)[run_id]
            if conn_id == "probe_wrong_key":
                assert state == "failed", (name, "a connection it cannot decrypt was read")
                log = region.task_log("conn_probe", run_id, "read_connection")
                assert "isn't defined" in log, log[-2000:]
                continue
            assert state == "success", (name, conn_id, region.task_log(
                "conn_probe", run_id, "read_connection")[-3000:])
            seen = json.loads(out.read_text())
            if conn_id == "neli_default":
                assert seen["conn_type"] == "neli"
                assert seen["extra"]["deployment"] == name
                assert seen["extra"]["kafka_config"]["sasl.password"] == secret
            else:
                assert seen["extra"] == {"k": name}
