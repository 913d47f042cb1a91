"""Token-checked Delta commits without Spark (neli_orchestrate.dagster.delta, on delta-rs):
the same outcomes as the Spark sink, on a real Delta table on disk."""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from neli_orchestrate.errors import ConfigError, StaleTokenError
from neli_orchestrate.sinks import delta as sink
from neli_orchestrate.spark.delta import delta_app_id

ROLE, DATE, OTHER_DATE = "daily_flights", "2013-01-05", "2013-01-06"
ZOMBIE, OWNER = 5, 7


def rows(writer, n, date=DATE):
    return pa.table({"date": [date] * n, "carrier": [f"C{i}" for i in range(n)],
                     "writer": [writer] * n})


def content(uri, date=DATE):
    table = DeltaTable(uri).to_pyarrow_table().to_pylist()
    return sorted((r["date"], r["carrier"], r["writer"]) for r in table if r["date"] == date)


def expected(writer, n, date=DATE):
    return sorted((r["date"], r["carrier"], r["writer"]) for r in rows(writer, n, date).to_pylist())


def write(uri, data, token, run_key=DATE):
    return sink.write_deltalake_fenced(data, uri, run_key, token, role=ROLE)


def test_zombie_commits_first_then_owner_replaces_its_rows(tmp_path):
    uri = str(tmp_path / "daily")
    write(uri, rows("other-day", 2, OTHER_DATE), 3, run_key=OTHER_DATE)
    write(uri, rows("zombie", 3), ZOMBIE)
    commit = write(uri, rows("owner", 2), OWNER)

    assert commit.committed
    assert content(uri) == expected("owner", 2)
    assert content(uri, OTHER_DATE) == expected("other-day", 2, OTHER_DATE)
    assert DeltaTable(uri).transaction_version(delta_app_id(ROLE, DATE)) == OWNER


def test_owner_commits_first_then_zombie_raises_and_table_is_unchanged(tmp_path):
    uri = str(tmp_path / "daily")
    write(uri, rows("owner", 2), OWNER)
    version = DeltaTable(uri).version()

    with pytest.raises(StaleTokenError) as raised:
        write(uri, rows("zombie", 3), ZOMBIE)

    assert (raised.value.token, raised.value.committed) == (ZOMBIE, OWNER)
    assert content(uri) == expected("owner", 2)
    assert DeltaTable(uri).version() == version


def test_zombie_that_read_before_the_owner_committed_is_refused(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="neli_orchestrate.sinks.delta")
    uri = str(tmp_path / "daily")
    write(uri, rows("other-day", 1, OTHER_DATE), 1, run_key=OTHER_DATE)
    # The zombie loads the table (no token recorded for the date yet) ...
    seen_by_zombie = DeltaTable(uri)
    # ... the owner commits ...
    write(uri, rows("owner", 2), OWNER)
    # ... and the zombie writes through what it had loaded: delta-rs' conflict check refuses
    # it, and the retry sees the owner's token.
    real_load, calls = sink._load, []

    def load_once_stale(u, options):
        calls.append(u)
        return seen_by_zombie if len(calls) == 1 else real_load(u, options)

    monkeypatch.setattr(sink, "_load", load_once_stale)
    with pytest.raises(StaleTokenError) as raised:
        write(uri, rows("zombie", 3), ZOMBIE)

    assert (raised.value.token, raised.value.committed) == (ZOMBIE, OWNER)
    assert sum("lost a race" in r.getMessage() for r in caplog.records) == 1
    assert content(uri) == expected("owner", 2)
    assert DeltaTable(uri).transaction_version(delta_app_id(ROLE, DATE)) == OWNER


def test_takeover_after_kill_after_job_does_not_duplicate_rows(tmp_path):
    uri = str(tmp_path / "daily")
    write(uri, rows("run", 4), ZOMBIE)
    commit = write(uri, rows("run", 4), OWNER)

    assert commit.committed
    assert content(uri) == expected("run", 4)


def test_same_token_twice_is_a_no_op_and_empty_output_is_refused(tmp_path):
    uri = str(tmp_path / "daily")
    first = write(uri, rows("owner", 2).to_pandas(), OWNER)
    again = write(uri, rows("owner-retry", 5), OWNER)
    assert first.committed and not again.committed and again.version == first.version
    assert content(uri) == expected("owner", 2)
    with pytest.raises(ConfigError, match="empty"):
        write(uri, rows("owner", 0), 9)


# -- first write, races held just before a commit, several partitions, maintenance ------------

OTHER_ROLE = "hourly_flights"


def other_role_writes(uri, token=3):
    """Another role's run writes its own partition (it must survive everything below)."""
    sink.write_deltalake_fenced(rows("other-role", 2, OTHER_DATE), uri, OTHER_DATE, token,
                                role=OTHER_ROLE)


def hold_once(monkeypatch, stage, run_first):
    """The first writer that reaches ``stage`` runs ``run_first()`` there, just before its own
    commit: a deterministic race, no threads, no sleeps."""
    fired = []
    real = sink._before_commit

    def hook(reached, uri):
        if reached == stage and not fired:
            fired.append(reached)
            run_first()
        real(reached, uri)

    monkeypatch.setattr(sink, "_before_commit", hook)
    return fired


def assert_owner_kept_the_table(uri):
    assert content(uri) == expected("owner", 2)
    assert content(uri, OTHER_DATE) == expected("other-role", 2, OTHER_DATE)
    assert DeltaTable(uri).transaction_version(delta_app_id(ROLE, DATE)) == OWNER


@pytest.mark.parametrize("stage", ["create", "write"])
def test_zombie_that_checked_before_the_table_existed_is_refused(tmp_path, monkeypatch, stage):
    # The zombie finds no table. Held just before it creates the table (or, having created the
    # empty version 0, just before its data commit), the owner creates/writes the table with
    # its token and another role writes its partition. The zombie must then be refused.
    uri = str(tmp_path / "daily")

    def owner_and_other_role():
        write(uri, rows("owner", 2), OWNER)
        other_role_writes(uri)

    fired = hold_once(monkeypatch, stage, owner_and_other_role)
    with pytest.raises(StaleTokenError) as raised:
        write(uri, rows("zombie", 3), ZOMBIE)

    assert fired == [stage]
    assert (raised.value.token, raised.value.committed) == (ZOMBIE, OWNER)
    assert_owner_kept_the_table(uri)


@pytest.mark.parametrize("first", ["owner", "zombie"])
def test_first_write_in_both_orders_ends_with_the_owners_rows(tmp_path, first):
    uri = str(tmp_path / "daily")
    if first == "zombie":
        assert write(uri, rows("zombie", 3), ZOMBIE).committed
        other_role_writes(uri)
        assert write(uri, rows("owner", 2), OWNER).committed
    else:
        assert write(uri, rows("owner", 2), OWNER).committed
        other_role_writes(uri)
        with pytest.raises(StaleTokenError):
            write(uri, rows("zombie", 3), ZOMBIE)
    assert_owner_kept_the_table(uri)


def test_one_token_writes_several_partitions_under_one_run_key(tmp_path):
    uri = str(tmp_path / "daily")
    first = sink.write_deltalake_fenced(rows("owner", 2), uri, DATE, OWNER, role=ROLE)
    second = sink.write_deltalake_fenced(rows("owner", 3, OTHER_DATE), uri, DATE, OWNER,
                                         role=ROLE, partition_value=OTHER_DATE)

    assert first.committed and second.committed and first.app_id != second.app_id
    assert content(uri) == expected("owner", 2)
    assert content(uri, OTHER_DATE) == expected("owner", 3, OTHER_DATE)
    with pytest.raises(StaleTokenError):
        sink.write_deltalake_fenced(rows("zombie", 1, OTHER_DATE), uri, DATE, ZOMBIE, role=ROLE,
                                    partition_value=OTHER_DATE)
    assert content(uri, OTHER_DATE) == expected("owner", 3, OTHER_DATE)


def test_a_role_is_required(tmp_path):
    with pytest.raises(ConfigError, match="role"):
        sink.write_deltalake_fenced(rows("x", 1), str(tmp_path / "t"), DATE, 1, role=None)
    assert not (tmp_path / "t").exists()


def test_a_table_written_by_the_previous_release_keeps_refusing_its_stale_writers(tmp_path):
    from deltalake import CommitProperties, Transaction, write_deltalake

    uri = str(tmp_path / "daily")
    old_key = f"neli-orchestrate/{ROLE}/{DATE}"  # the previous release's app id
    write_deltalake(uri, rows("owner", 2), mode="overwrite", partition_by=["date"],
                    commit_properties=CommitProperties(app_transactions=[Transaction(old_key,
                                                                                     OWNER)]))
    with pytest.raises(StaleTokenError) as raised:
        write(uri, rows("zombie", 3), ZOMBIE)
    assert raised.value.committed == OWNER
    assert not write(uri, rows("owner-retry", 1), OWNER).committed
    assert content(uri) == expected("owner", 2)


def test_a_table_with_transaction_retention_is_refused_up_front(tmp_path):
    uri = str(tmp_path / "daily")
    DeltaTable.create(uri, rows("x", 1).schema, partition_by=["date"],
                      configuration={"delta.setTransactionRetentionDuration": "interval 1 days"})
    with pytest.raises(ConfigError, match="delta.setTransactionRetentionDuration") as raised:
        write(uri, rows("owner", 2), OWNER)
    assert "UNSET TBLPROPERTIES" in str(raised.value)
    assert DeltaTable(uri).version() == 0


def test_stale_writer_stays_refused_after_optimize_vacuum_checkpoint_and_log_cleanup(tmp_path):
    uri = str(tmp_path / "daily")
    DeltaTable.create(uri, rows("x", 1).schema, partition_by=["date"],
                      configuration={"delta.logRetentionDuration": "interval 0 seconds"})
    write(uri, rows("zombie", 3), ZOMBIE)
    write(uri, rows("owner", 2), OWNER)
    other_role_writes(uri)
    table = DeltaTable(uri)
    table.optimize.compact()
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    table.create_checkpoint()
    table.cleanup_metadata()
    logs = sorted(p.name for p in (tmp_path / "daily" / "_delta_log").glob("*.json"))
    assert "00000000000000000002.json" not in logs  # the owner's commit entry is gone ...

    with pytest.raises(StaleTokenError) as raised:  # ... and its token is still recorded
        write(uri, rows("zombie", 3), ZOMBIE)
    assert raised.value.committed == OWNER
    assert_owner_kept_the_table(uri)
