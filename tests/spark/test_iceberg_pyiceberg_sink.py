"""Token-checked Iceberg commits without Spark (neli_orchestrate.dagster.iceberg, on pyiceberg
with a SQLite catalog): the same outcomes as the Spark sink."""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from neli_orchestrate.dagster import iceberg as sink
from neli_orchestrate.errors import StaleTokenError

ROLE, DATE, OTHER_DATE = "daily_flights", "2013-01-05", "2013-01-06"
ZOMBIE, OWNER = 5, 7
IDENT = "flights.daily"


def rows(writer, n, date=DATE):
    return pa.table({"date": [date] * n, "carrier": [f"C{i}" for i in range(n)],
                     "writer": [writer] * n})


@pytest.fixture
def catalog(tmp_path):
    cat = SqlCatalog("neli", uri=f"sqlite:///{tmp_path}/catalog.db",
                     warehouse=(tmp_path / "wh").as_uri())
    cat.create_namespace("flights")
    cat.create_table(IDENT, schema=rows("x", 1).schema)
    return cat


def content(catalog, date=DATE):
    data = catalog.load_table(IDENT).scan().to_arrow().to_pylist()
    return sorted((r["date"], r["carrier"], r["writer"]) for r in data if r["date"] == date)


def expected(writer, n, date=DATE):
    return sorted((r["date"], r["carrier"], r["writer"]) for r in rows(writer, n, date).to_pylist())


def write(catalog, data, token, run_key=DATE):
    return sink.write_pyiceberg_fenced(data, catalog, IDENT, run_key, token, role=ROLE)


def test_zombie_commits_first_then_owner_replaces_its_rows(catalog):
    write(catalog, rows("other-day", 2, OTHER_DATE), 3, run_key=OTHER_DATE)
    write(catalog, rows("zombie", 3), ZOMBIE)
    assert write(catalog, rows("owner", 2), OWNER).committed
    assert content(catalog) == expected("owner", 2)
    assert content(catalog, OTHER_DATE) == expected("other-day", 2, OTHER_DATE)


def test_owner_commits_first_then_zombie_raises_and_table_is_unchanged(catalog):
    write(catalog, rows("owner", 2), OWNER)
    snapshots = [s.snapshot_id for s in catalog.load_table(IDENT).snapshots()]
    with pytest.raises(StaleTokenError) as raised:
        write(catalog, rows("zombie", 3), ZOMBIE)
    assert (raised.value.token, raised.value.committed) == (ZOMBIE, OWNER)
    assert content(catalog) == expected("owner", 2)
    assert [s.snapshot_id for s in catalog.load_table(IDENT).snapshots()] == snapshots


def test_zombie_that_loaded_before_the_owner_committed_is_refused(catalog, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="neli_orchestrate.dagster.iceberg")
    write(catalog, rows("other-day", 1, OTHER_DATE), 1, run_key=OTHER_DATE)
    seen_by_zombie = catalog.load_table(IDENT)  # no token for the date yet
    write(catalog, rows("owner", 2), OWNER)

    class StaleOnce:
        calls = 0

        def load_table(self, identifier):
            StaleOnce.calls += 1
            return seen_by_zombie if StaleOnce.calls == 1 else catalog.load_table(identifier)

    with pytest.raises(StaleTokenError) as raised:
        sink.write_pyiceberg_fenced(rows("zombie", 3), StaleOnce(), IDENT, DATE, ZOMBIE,
                                    role=ROLE)
    assert (raised.value.token, raised.value.committed) == (ZOMBIE, OWNER)
    assert sum("lost a race" in r.getMessage() for r in caplog.records) == 1
    assert content(catalog) == expected("owner", 2)


def test_takeover_after_kill_after_job_does_not_duplicate_rows(catalog):
    write(catalog, rows("run", 4), ZOMBIE)
    assert write(catalog, rows("run", 4), OWNER).committed
    assert content(catalog) == expected("run", 4)
