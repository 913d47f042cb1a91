"""docs/guide/security.md shows the ACLs the code requires, for its example namespace, no more."""

from __future__ import annotations

import re
from pathlib import Path

from neli_orchestrate import NeliConfig, SingletonConfig
from neli_orchestrate.acls import required_acls

DOC = Path(__file__).resolve().parents[2] / "docs" / "guide" / "security.md"


def test_the_kafka_acls_commands_in_the_docs_are_what_required_acls_gives() -> None:
    config = SingletonConfig(
        neli=NeliConfig(bootstrap_servers="broker:9093", group_protocol="consumer"),
        deployment="us-east-1", namespace="acme")
    principal = "User:airflow-us-east-1"
    expected = [" ".join(acl.kafka_acls_args()).replace(f"--allow-principal {principal} ", "")
                for acl in required_acls(config, principal)]
    documented = [line.removeprefix("$ADMIN $P ").strip()
                  for line in DOC.read_text().splitlines() if line.startswith("$ADMIN $P ")]
    assert documented == expected
    assert re.search(rf'P="--allow-principal {principal}"', DOC.read_text())
