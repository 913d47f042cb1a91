"""The Spark provider adapter against the oldest and the newest release of the range we state.

`neli_orchestrate/airflow/spark_provider.py` reads private members of the Apache Spark
provider's operator and hook. pyproject.toml states the provider releases it is known to work
with; this test fetches the oldest (the range's lower bound) and the newest release in the
range from PyPI, loads each in place of the installed one in a fresh interpreter, and runs the
adapter's tests (`tests/airflow/test_spark_provider.py`) against it. A provider release that
renames a member the adapter reads fails here, before users meet it.

No network, no provider: the test fails (it never skips), saying which download failed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PROVIDER = "apache-airflow-providers-apache-spark"

# Loads the provider package found under argv[1] as `airflow.providers.apache.spark` (the
# installed one stays on disk, unused), prints its version, then runs pytest on argv[2:].
BOOT = """
import importlib.util, pathlib, sys
root = pathlib.Path(sys.argv[1]) / "airflow/providers/apache/spark"
import airflow.providers.apache
spec = importlib.util.spec_from_file_location(
    "airflow.providers.apache.spark", root / "__init__.py",
    submodule_search_locations=[str(root)])
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
print("provider", module.__version__, module.__file__, flush=True)
import pytest
sys.exit(pytest.main(sys.argv[2:]))
"""


def stated_range() -> Requirement:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["airflow"]
    (line,) = [r for r in extras if Requirement(r).name == PROVIDER]
    return Requirement(line)


def lower_bound(requirement: Requirement) -> str:
    (bound,) = [s.version for s in requirement.specifier if s.operator == ">="]
    return bound


def fetch(spec: str, target: Path) -> Version:
    """Install ``spec`` (the provider alone) into ``target``; the version pip chose."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
         "--target", str(target), spec],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"could not fetch {spec} from PyPI: {done.stderr[-2000:]}"
    (info,) = target.glob("apache_airflow_providers_apache_spark-*.dist-info")
    return Version(info.name.removesuffix(".dist-info").split("-")[1])


def test_the_range_is_upper_bounded_and_the_installed_release_is_in_it() -> None:
    from importlib.metadata import version

    requirement = stated_range()
    assert any(s.operator == "<" for s in requirement.specifier), (
        f"{requirement}: state an upper bound; a major release may rename what the adapter reads")
    assert requirement.specifier.contains(version(PROVIDER)), (requirement, version(PROVIDER))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("which", ["oldest", "newest"])
def test_the_adapter_works_with_the_oldest_and_newest_provider_in_the_range(
        which: str, tmp_path: Path) -> None:
    requirement = stated_range()
    spec = (f"{PROVIDER}=={lower_bound(requirement)}" if which == "oldest"
            else f"{PROVIDER}{requirement.specifier}")
    got = fetch(spec, tmp_path / "provider")
    assert requirement.specifier.contains(got), (spec, got)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    done = subprocess.run(
        [sys.executable, "-c", BOOT, str(tmp_path / "provider"),
         str(ROOT / "tests/airflow/test_spark_provider.py"), "-q", "-p", "no:cacheprovider",
         "-o", "addopts="],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540)
    assert f"provider {got} " in done.stdout, done.stdout[-3000:]
    assert done.returncode == 0, f"{spec} ({got}):\n{done.stdout[-6000:]}\n{done.stderr[-2000:]}"
