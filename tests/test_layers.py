"""The layer contracts of pyproject.toml ([tool.importlinter]) hold, and each one catches a
deliberate bad import (the check can fail)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the package found under ``root``, with the repository's contracts."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "import-linter is not installed (it is in the test extra)"
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([exe, "--config", str(REPO / "pyproject.toml"), "--no-cache"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_the_package_keeps_every_layer_contract() -> None:
    out = lint_imports(REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


def test_no_contract_ignores_an_import() -> None:
    """Issue #32 emptied the ratchet: the contracts hold with no exception listed."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert [c["id"] for c in config["contracts"] if c.get("ignore_imports")] == []


# (module that gets the bad import, the import, the contract's name as lint-imports prints it)
BAD_IMPORTS = [
    ("core/state.py", "import neli_orchestrate.ledger.record", "Layers point one way"),
    ("singleton/busy.py", "import neli_orchestrate.observe", "Layers point one way"),
    ("airflow/metrics.py", "import neli_orchestrate.dagster.run", "never import each other"),
    ("cli/_output.py", "import neli_orchestrate.airflow.claims", "never import each other"),
    ("core/clock.py", "import neli_orchestrate.claim", "core imports nothing of ours above it"),
    ("dagster/gates.py", "import neli_orchestrate.ledger.replay",
     "Front doors reach the ledger"),
    # one per front door, as the ratchet's entries were: a function's import, a type-only one
    ("airflow/operators/fenced.py",
     "def _state() -> None:\n    from neli_orchestrate.ledger.record import RunState",
     "Front doors reach the ledger"),
    ("cli/ledger.py",
     "if TYPE_CHECKING:\n    from neli_orchestrate.ledger.history import LedgerHistory",
     "Front doors reach the ledger"),
    ("airflow/hooks/neli.py", "from neli_orchestrate.core.config import NeliConfig",
     "Front doors reach the ledger"),
    # the circle of issue #32 coming back, as it was: inside a function of the fenced try
    ("airflow/operators/fenced.py",
     "def _circle() -> None:\n    import neli_orchestrate.airflow.operators.gate",
     "gate, policy, fenced try and graph point one way"),
    ("airflow/graph.py", "import neli_orchestrate.airflow.policy",
     "gate, policy, fenced try and graph point one way"),
]


@pytest.mark.parametrize(("module", "line", "contract"), BAD_IMPORTS,
                         ids=[f"{m}:{c.split()[0]}" for m, _, c in BAD_IMPORTS])
def test_each_contract_fails_on_a_deliberate_bad_import(tmp_path: Path, module: str,
                                                        line: str, contract: str) -> None:
    copy = tmp_path / "neli_orchestrate"
    shutil.copytree(REPO / "neli_orchestrate", copy,
                    ignore=shutil.ignore_patterns("__pycache__", "kafka", "table_formats"))
    target = copy / module
    target.write_text(target.read_text() + f"\n{line}  # deliberately bad\n")
    out = lint_imports(tmp_path)
    assert out.returncode != 0, out.stdout
    broken = [row for row in out.stdout.replace("\n", " ").split("KEPT") if "BROKEN" in row]
    assert any(" ".join(contract.split()) in " ".join(row.split()) for row in broken), out.stdout
