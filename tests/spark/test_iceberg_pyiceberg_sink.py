"""Token-checked Iceberg commits without Spark (neli_orchestrate.dagster.iceberg, on pyiceberg
with a SQLite catalog): the same outcomes as the Spark sink."""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from neli_orchestrate.errors import ConfigError, StaleTokenError
from neli_orchestrate.sinks import iceberg as sink

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
    caplog.set_level(logging.INFO, logger="neli_orchestrate.sinks.iceberg")
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


# -- races held just before the commit, several partitions, snapshot expiry -------------------

OTHER_ROLE = "hourly_flights"


def hold_once(monkeypatch, run_first):
    """The first writer to reach its commit runs ``run_first()`` just before it (no threads)."""
    fired = []
    real = sink._before_commit

    def hook(stage, identifier):
        if not fired:
            fired.append(stage)
            run_first()
        real(stage, identifier)

    monkeypatch.setattr(sink, "_before_commit", hook)
    return fired


def test_zombie_held_just_before_its_commit_is_refused(catalog, monkeypatch):
    def owner_and_other_role():
        write(catalog, rows("owner", 2), OWNER)
        sink.write_pyiceberg_fenced(rows("other-role", 2, OTHER_DATE), catalog, IDENT,
                                    OTHER_DATE, 3, role=OTHER_ROLE)

    fired = hold_once(monkeypatch, owner_and_other_role)
    with pytest.raises(StaleTokenError) as raised:
        write(catalog, rows("zombie", 3), ZOMBIE)
    assert fired == ["write"]
    assert (raised.value.token, raised.value.committed) == (ZOMBIE, OWNER)
    assert content(catalog) == expected("owner", 2)
    assert content(catalog, OTHER_DATE) == expected("other-role", 2, OTHER_DATE)


def test_one_token_writes_several_partitions_under_one_run_key(catalog):
    first = write(catalog, rows("owner", 2), OWNER)
    second = sink.write_pyiceberg_fenced(rows("owner", 3, OTHER_DATE), catalog, IDENT, DATE,
                                         OWNER, role=ROLE, partition_value=OTHER_DATE)
    assert first.committed and second.committed
    assert content(catalog) == expected("owner", 2)
    assert content(catalog, OTHER_DATE) == expected("owner", 3, OTHER_DATE)
    with pytest.raises(StaleTokenError):
        sink.write_pyiceberg_fenced(rows("zombie", 1, OTHER_DATE), catalog, IDENT, DATE, ZOMBIE,
                                    role=ROLE, partition_value=OTHER_DATE)


def test_rows_outside_the_partition_and_a_missing_role_are_refused(catalog):
    mixed = pa.concat_tables([rows("owner", 1), rows("owner", 1, OTHER_DATE)])
    with pytest.raises(ConfigError, match="other than"):
        write(catalog, mixed, OWNER)
    with pytest.raises(ConfigError, match="role"):
        sink.write_pyiceberg_fenced(rows("x", 1), catalog, IDENT, DATE, OWNER, role=None)
    assert list(catalog.load_table(IDENT).snapshots()) == []


def test_stale_writer_stays_refused_after_expire_snapshots(catalog):
    write(catalog, rows("owner", 2), OWNER)
    sink.write_pyiceberg_fenced(rows("other-role", 2, OTHER_DATE), catalog, IDENT, OTHER_DATE, 3,
                                role=OTHER_ROLE)  # an unrelated commit, then expire the rest
    table = catalog.load_table(IDENT)
    current = table.current_snapshot().snapshot_id
    old = [s.snapshot_id for s in table.snapshots() if s.snapshot_id != current]
    table.maintenance.expire_snapshots().by_ids(old).commit()
    table = catalog.load_table(IDENT)
    assert [s.snapshot_id for s in table.snapshots()] == [current]  # no summary names OWNER

    with pytest.raises(StaleTokenError) as raised:
        write(catalog, rows("zombie", 3), ZOMBIE)
    assert raised.value.committed == OWNER and "table property" in str(raised.value)
    assert content(catalog) == expected("owner", 2)
    assert not write(catalog, rows("owner-retry", 1), OWNER).committed


def test_a_table_written_by_the_previous_release_keeps_refusing_its_stale_writers(catalog):
    table = catalog.load_table(IDENT)
    table.overwrite(rows("owner", 2), snapshot_properties={
        "neli.token": str(OWNER), "neli.role": ROLE, "neli.run-key": DATE,
        "neli.deployment": ""})  # what the previous release recorded (no neli.key)
    with pytest.raises(StaleTokenError):
        write(catalog, rows("zombie", 3), ZOMBIE)
    assert content(catalog) == expected("owner", 2)
