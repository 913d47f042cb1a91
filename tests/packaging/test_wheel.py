"""The wheel a user installs: built with ``python -m build``, checked by twine, and installed (not
editable) with only one extra into a fresh virtualenv, where the integration works.

The fresh virtualenvs are made and filled by uv (PyPI or its cache): a full Airflow install
takes seconds there, minutes with pip. Each install's wall time is printed (``-s``) and kept
in ``tests/packaging`` output for the CI budget.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run(*args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None,
        timeout: float = 900) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def uv() -> str:
    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    assert found, "uv is not installed (it is in the test extra: pip install -e '.[test]')"
    return found


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    started = time.monotonic()
    # a copy of the tree: the build must not depend on (or leave) files in the checkout
    source = out / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"))
    run(sys.executable, "-m", "build", "--installer", "uv", "--outdir", out, source,
        env={**os.environ, "PATH": f"{Path(uv()).parent}:{os.environ['PATH']}"})
    print(f"\nbuild: {time.monotonic() - started:.1f} s")
    wheels, sdists = list(out.glob("*.whl")), list(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(out.iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0]}


def test_build_makes_a_wheel_and_an_sdist_that_twine_accepts(dist: dict[str, Path]) -> None:
    from neli_orchestrate import __version__

    assert dist["wheel"].name == f"neli_orchestrate-{__version__}-py3-none-any.whl"
    assert dist["sdist"].name == f"neli_orchestrate-{__version__}.tar.gz"
    run(sys.executable, "-m", "twine", "check", "--strict", dist["wheel"], dist["sdist"])
    sdist_names = tarfile.open(dist["sdist"]).getnames()
    for name in ("CHANGELOG.md", "README.md", "LICENSE", "pyproject.toml",
                 "neli_orchestrate/cli/run.py"):
        assert f"neli_orchestrate-{__version__}/{name}" in sdist_names, name
    names = zipfile.ZipFile(dist["wheel"]).namelist()
    assert "neli_orchestrate/py.typed" in names
    assert "neli_orchestrate/testing/kafka/pom.xml" in names  # LocalKafka's Maven recipe
    assert "neli_orchestrate/testing/table_formats/pom.xml" in names  # the sinks' jars
    # the `neli` OpenLineage facet's schema, where its _schemaURL points
    from neli_orchestrate.lineage.facet import SCHEMA_PATH, SCHEMA_URL

    assert SCHEMA_URL.endswith(f"#{SCHEMA_PATH}") and SCHEMA_PATH in names
    assert f"neli_orchestrate-{__version__}.dist-info/licenses/LICENSE" in names
    assert not [n for n in names if n.startswith(("tests/", "dags/", "integration/"))]
    # the harnesses live in integration/, not in the package (docs/internals/development.md)
    moved = ("neli_orchestrate/demo/", "neli_orchestrate/sim/")
    assert not [n for n in names if n.startswith(moved)]
    assert not [n for n in sdist_names
                if n.split("/", 1)[-1].startswith(("integration/", *moved))]
    metadata = zipfile.ZipFile(dist["wheel"]).read(
        f"neli_orchestrate-{__version__}.dist-info/METADATA").decode()
    assert f"Version: {__version__}" in metadata
    assert "Provides-Extra: airflow" in metadata and "Provides-Extra: dagster" in metadata
    assert "Provides-Extra: lineage" in metadata
    # The description is the wheel's own (DESCRIPTION.md), not the repository's front page:
    # no repository commands, no relative links, and the install line names this release.
    description = metadata.partition("\n\n")[2]
    assert description.startswith("# neli-orchestrate"), description[:200]
    assert "./demo" not in description and ".ci/run" not in description
    assert not re.findall(r"\]\((?!https?://)", description), "relative link in the description"
    assert f"neli_orchestrate-{__version__}-py3-none-any.whl" in description
    entry_points = zipfile.ZipFile(dist["wheel"]).read(
        f"neli_orchestrate-{__version__}.dist-info/entry_points.txt").decode()
    assert "neli-orchestrate = neli_orchestrate.cli:main" in entry_points
    assert "provider_info = neli_orchestrate.airflow.provider:get_provider_info" in entry_points
    # the pytest plugin is opt-in: installing the wheel changes no one's pytest
    assert "pytest11" not in entry_points, entry_points


def fresh_venv(tmp_path: Path, wheel: Path, extra: str) -> tuple[Path, dict[str, str]]:
    """A new virtualenv with ``wheel[extra]`` installed; its bin dir and a clean environment."""
    venv = tmp_path / f"venv-{extra}"
    started = time.monotonic()
    run(uv(), "venv", "-q", "--python", sys.executable, venv)
    run(uv(), "pip", "install", "-q", "--python", venv / "bin" / "python", f"{wheel}[{extra}]")
    print(f"\ninstall {wheel.name}[{extra}] into a fresh venv: {time.monotonic() - started:.1f} s")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") and not k.startswith("AIRFLOW")}
    env.update(PATH=f"{venv / 'bin'}:{env['PATH']}", AIRFLOW_HOME=str(tmp_path / "airflow"),
               DAGSTER_HOME=str(tmp_path / "dagster"))
    (tmp_path / "dagster").mkdir(exist_ok=True)
    return venv / "bin", env


def installed_from_wheel(bin_dir: Path, env: dict[str, str], cwd: Path) -> None:
    """The package is the wheel's copy in site-packages, not an editable install or the tree."""
    out = run(bin_dir / "python", "-c", "import neli_orchestrate, importlib.metadata as m;"
              "print(neli_orchestrate.__file__);"
              "print(m.distribution('neli-orchestrate').read_text('direct_url.json') or '')",
              cwd=cwd, env=env).stdout
    location, _, direct_url = out.partition("\n")
    assert "/site-packages/neli_orchestrate/" in location, location
    assert '"editable": true' not in direct_url.replace(" ", "").replace(":", ": ")


def test_the_wheel_with_only_the_airflow_extra(dist: dict[str, Path], tmp_path: Path) -> None:
    bin_dir, env = fresh_venv(tmp_path, dist["wheel"], "airflow")
    installed_from_wheel(bin_dir, env, tmp_path)
    help_text = run(bin_dir / "neli-orchestrate", "--help", cwd=tmp_path, env=env).stdout
    assert "run --hold" in help_text and "ledger list" in help_text
    # Airflow discovers the provider through the wheel's entry point
    out = run(bin_dir / "python", "-c", "from airflow.providers_manager import ProvidersManager;"
              "pm = ProvidersManager(); print(sorted(pm.providers));"
              "print(sorted(pm.hooks))", cwd=tmp_path, env=env).stdout
    assert "neli-orchestrate" in out and "'neli'" in out, out
    # the example DAG parses, cluster policy included, from a DAG folder outside the checkout
    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(REPO / "dags" / "nycflights_daily.py", dags)
    shutil.copytree(REPO / "dags" / "jobs", dags / "jobs")
    out = run(bin_dir / "python", "-c", "from airflow.dag_processing.dagbag import DagBag;"
              f"bag = DagBag(dag_folder={str(dags / 'nycflights_daily.py')!r});"
              "print(bag.import_errors); print(sorted(bag.dag_ids))",
              cwd=tmp_path, env=env).stdout
    assert out.splitlines()[-2:] == ["{}", "['nycflights_daily']"], out  # after its log lines
    # the extra's pandas cap: PySpark (pyspark-client here) warns on pandas 3, not on what we pin
    run(bin_dir / "python", "-W", "error::FutureWarning", "-c",
        "from pyspark.sql.pandas.utils import require_minimum_pandas_version as check; check()",
        cwd=tmp_path, env=env)
    # the `neli` facet's _schemaURL resolves to the schema file of the installed wheel
    out = run(bin_dir / "python", "-c", "from neli_orchestrate.lineage.facet import schema_file;"
              "print(schema_file())", cwd=tmp_path, env=env).stdout.strip()
    assert out.endswith("site-packages/neli_orchestrate/lineage/NeliRunFacet.json"), out
    # only the airflow extra: no Dagster
    probe = subprocess.run([bin_dir / "python", "-c", "import dagster"], env=env,
                           capture_output=True, timeout=60)
    assert probe.returncode != 0


def test_the_wheel_with_only_the_dagster_extra(dist: dict[str, Path], tmp_path: Path) -> None:
    bin_dir, env = fresh_venv(tmp_path, dist["wheel"], "dagster")
    installed_from_wheel(bin_dir, env, tmp_path)
    help_text = run(bin_dir / "neli-orchestrate", "--help", cwd=tmp_path, env=env).stdout
    assert "run --hold" in help_text
    out = run(bin_dir / "python", "-c", "from neli_orchestrate.dagster import NeliResource;"
              "import dagster as dg;"
              "r = NeliResource(bootstrap_servers='127.0.0.1:9092', namespace='acme',"
              " deployment='us-east-1');"
              "print(type(r).__name__, isinstance(r, dg.ConfigurableResource))",
              cwd=tmp_path, env=env).stdout
    assert out.strip() == "NeliResource True", out
    probe = subprocess.run([bin_dir / "python", "-c", "import airflow"], env=env,
                           capture_output=True, timeout=60)
    assert probe.returncode != 0
