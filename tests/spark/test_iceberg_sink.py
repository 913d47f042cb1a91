"""Token-checked Iceberg commits (neli_orchestrate.spark.iceberg) against real Spark and the real
Iceberg runtime, with a Hadoop catalog on a local warehouse: the token rides in the snapshot
summary and a commit that raced with a newer token's is refused by Iceberg's own validation."""

from __future__ import annotations

import logging
import uuid

import pytest
from sink_cases import DATE, OTHER_DATE, Background, Gate, frame, rows

from neli_orchestrate.errors import ConfigError, StaleTokenError
from neli_orchestrate.spark.iceberg import committed_tokens, write_iceberg_fenced
from neli_orchestrate.testing.table_jars import local_table_session

ROLE = "daily_flights"
ZOMBIE, OWNER = 5, 7


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    session = local_table_session(tmp_path_factory.mktemp("warehouse"), app_name="iceberg sink")
    yield session
    session.stop()


@pytest.fixture
def table(spark):
    name = f"neli.flights.daily_{uuid.uuid4().hex[:8]}"
    spark.sql(
        f"CREATE TABLE {name} (date string, carrier string, flights bigint, writer string) "
        "USING iceberg PARTITIONED BY (date)"
    )
    return name


def table_rows(spark, table, date=DATE):
    df = spark.table(table).where(f"date = '{date}'")
    return sorted(tuple(r) for r in df.select("date", "carrier", "flights", "writer").collect())


def write(spark, table, data, token, gate=None, run_key=DATE, **kwargs):
    df = frame(spark, data)
    return write_iceberg_fenced(gate.hold(df) if gate else df, table, run_key, token, role=ROLE,
                                **kwargs)


def snapshot_ids(spark, table):
    return [r[0] for r in spark.sql(f"SELECT snapshot_id FROM {table}.snapshots").collect()]


def tokens(spark, table):
    return [token for token, _ in committed_tokens(spark, table, DATE, role=ROLE)]


def lost_races(caplog):
    return [r.getMessage() for r in caplog.records if "lost a race" in r.getMessage()]


def test_zombie_commits_first_then_owner_replaces_its_rows(spark, table):
    write(spark, table, rows("other-day", 2, OTHER_DATE), 3, run_key=OTHER_DATE)
    write(spark, table, rows("zombie", 3), ZOMBIE)
    commit = write(spark, table, rows("owner", 2), OWNER)

    assert commit.committed and commit.token == OWNER
    assert table_rows(spark, table) == sorted(rows("owner", 2))
    assert table_rows(spark, table, OTHER_DATE) == sorted(rows("other-day", 2, OTHER_DATE))
    assert tokens(spark, table) == [ZOMBIE, OWNER]
    summary = spark.sql(
        f"SELECT summary FROM {table}.snapshots WHERE snapshot_id = {commit.snapshot_id}"
    ).collect()[0][0]
    assert summary["neli.token"] == str(OWNER) and summary["neli.run-key"] == DATE


def test_owner_commits_first_then_zombie_raises_and_table_is_unchanged(spark, table):
    write(spark, table, rows("owner", 2), OWNER)
    before_rows, before_snapshots = table_rows(spark, table), snapshot_ids(spark, table)

    with pytest.raises(StaleTokenError) as raised:
        write(spark, table, rows("zombie", 3), ZOMBIE)

    assert (raised.value.token, raised.value.committed) == (ZOMBIE, OWNER)
    assert str(ZOMBIE) in str(raised.value) and str(OWNER) in str(raised.value)
    after_rows = table_rows(spark, table)
    assert len(after_rows) == len(before_rows) == 2
    assert after_rows == before_rows == sorted(rows("owner", 2))
    assert snapshot_ids(spark, table) == before_snapshots


def test_concurrent_commits_lower_token_raises_and_higher_wins(spark, table, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="neli_orchestrate.sinks.iceberg")
    write(spark, table, rows("other-day", 1, OTHER_DATE), 1, run_key=OTHER_DATE)
    gate = Gate(tmp_path, "zombie")
    # The zombie reads the table (no token yet for the date) and is held inside its write job
    # while the owner commits: Iceberg's validation must then refuse the zombie's commit.
    # allow_empty=True only skips the emptiness probe, which would run the held job early.
    zombie = Background(lambda: write(spark, table, rows("zombie", 3), ZOMBIE, gate,
                                      allow_empty=True))
    gate.wait_started(zombie)
    owner = write(spark, table, rows("owner", 2), OWNER)
    gate.release()
    zombie.join()

    assert owner.committed
    assert ["commit of token 5 lost a race" in m for m in lost_races(caplog)] == [True]
    assert isinstance(zombie.error, StaleTokenError), zombie.error
    assert (zombie.error.token, zombie.error.committed) == (ZOMBIE, OWNER)
    assert table_rows(spark, table) == sorted(rows("owner", 2))
    assert table_rows(spark, table, OTHER_DATE) == sorted(rows("other-day", 1, OTHER_DATE))
    assert tokens(spark, table) == [OWNER]


def test_concurrent_commits_higher_token_retries_after_lower_commits(
    spark, table, tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="neli_orchestrate.sinks.iceberg")
    write(spark, table, rows("other-day", 1, OTHER_DATE), 1, run_key=OTHER_DATE)
    gate = Gate(tmp_path, "owner")
    owner = Background(lambda: write(spark, table, rows("owner", 2), OWNER, gate,
                                     allow_empty=True))
    gate.wait_started(owner)
    write(spark, table, rows("zombie", 3), ZOMBIE)  # the zombie's commit lands first...
    gate.release()
    owner.join()

    assert owner.error is None, owner.error
    assert owner.result.committed
    assert len(lost_races(caplog)) == 1
    # ...and the owner's refused commit is retried over it: only the owner's rows remain
    assert table_rows(spark, table) == sorted(rows("owner", 2))
    assert tokens(spark, table) == [ZOMBIE, OWNER]


def test_takeover_after_kill_after_job_commits_again_without_duplicating_rows(spark, table):
    write(spark, table, rows("run", 4), ZOMBIE)  # committed, then died before COMPLETED
    commit = write(spark, table, rows("run", 4), OWNER)

    assert commit.committed
    assert table_rows(spark, table) == sorted(rows("run", 4))  # four rows, not eight
    assert tokens(spark, table) == [ZOMBIE, OWNER]


def test_same_token_twice_is_an_idempotent_no_op(spark, table):
    first = write(spark, table, rows("owner", 2), OWNER)
    again = write(spark, table, rows("owner-retry", 5), OWNER)

    assert first.committed and not again.committed
    assert again.snapshot_id == first.snapshot_id
    assert table_rows(spark, table) == sorted(rows("owner", 2))


def test_empty_output_is_refused_unless_allowed(spark, table):
    with pytest.raises(ConfigError, match="empty DataFrame"):
        write(spark, table, [], OWNER)
    assert snapshot_ids(spark, table) == []


# -- several partitions, snapshot maintenance, one computation --------------------------------

OTHER_ROLE = "hourly_flights"


def test_one_token_several_partitions_and_snapshot_maintenance(spark, table):
    assert write(spark, table, rows("owner", 2), OWNER).committed
    assert write(spark, table, rows("owner", 3, OTHER_DATE), OWNER,
                 partition_value=OTHER_DATE).committed  # one token, two partitions, both land
    assert table_rows(spark, table, OTHER_DATE) == sorted(rows("owner", 3, OTHER_DATE))
    with pytest.raises(ConfigError, match="role"):
        write_iceberg_fenced(frame(spark, rows("x", 1)), table, DATE, 9)

    # An unrelated commit, compaction, then expiry of every snapshot but the last: no summary
    # names the owner's token any more; the table property still does.
    write_iceberg_fenced(frame(spark, rows("other-role", 1, "2013-01-07")), table, "2013-01-07",
                         3, role=OTHER_ROLE)
    spark.sql(f"CALL neli.system.rewrite_data_files(table => '{table[len('neli.'):]}', "
              "options => map('min-input-files', '1'))")
    spark.sql(f"CALL neli.system.expire_snapshots(table => '{table[len('neli.'):]}', "
              "older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)")
    assert tokens(spark, table) == [] and len(snapshot_ids(spark, table)) == 1

    with pytest.raises(StaleTokenError) as raised:
        write(spark, table, rows("zombie", 3), ZOMBIE)
    assert raised.value.committed == OWNER and "table property" in str(raised.value)
    assert table_rows(spark, table) == sorted(rows("owner", 2))


def test_the_dataframe_is_computed_once(spark, table, tmp_path):
    from pyspark.sql import functions as F

    calls = str(tmp_path / "calls")

    def counted(value):  # runs in a Python worker: count through a file, one line per row
        with open(calls, "a") as handle:
            handle.write("x\n")
        return value

    # A filter through the counting UDF: work the emptiness check cannot prune away (as an
    # aggregation's would not be).
    df = frame(spark, rows("owner", 3)).where(
        F.udf(counted, "string")(F.col("writer")).isNotNull())  # type: ignore[arg-type]
    write_iceberg_fenced(df, table, DATE, OWNER, role=ROLE)
    with open(calls) as handle:
        assert len(handle.readlines()) == 3  # the emptiness check and the write share one pass
    assert table_rows(spark, table) == sorted(rows("owner", 3))


# -- data and token in one commit -------------------------------------------------------------


def property_mark(spark, table, token_role=ROLE, date=DATE):
    from neli_orchestrate.sinks.iceberg import _load_table, high_water_property
    from neli_orchestrate.sinks.keys import sink_key

    key = sink_key(token_role, date, "date", date)
    return _load_table(spark, table).properties().get(high_water_property(key))


def branches(spark, table):
    return sorted(r[0] for r in spark.sql(f"SELECT name FROM {table}.refs").collect())


def test_data_and_token_are_one_commit_race_held_before_and_after_publish(
    spark, table, monkeypatch
):
    """The race held at the two edges of the publish: just before it (the data is staged on a
    branch) and just after it. At each edge the rows and the table property agree."""
    from neli_orchestrate.sinks import iceberg as sink

    NEWER, BETWEEN = 9, 8
    seen: dict[str, tuple[bool, str | None]] = {}
    busy = []

    def observe(stage_name: str) -> tuple[bool, str | None]:
        return (table_rows(spark, table) == sorted(rows("newer", 2)), property_mark(spark, table))

    def hook(stage_name: str, _table: str) -> None:
        if busy:
            return  # the nested writers below run their own commits unheld
        busy.append(stage_name)
        try:
            run = plan.get(stage_name)
            if run:
                run()
        finally:
            busy.pop()

    # 1. Held just before its publish, the zombie's rows are staged; the owner commits first.
    plan = {"publish": lambda: write(spark, table, rows("owner", 2), OWNER)}
    monkeypatch.setattr(sink, "_before_commit", hook)
    with pytest.raises(StaleTokenError) as raised:
        write(spark, table, rows("zombie", 3), ZOMBIE)
    assert (raised.value.token, raised.value.committed) == (ZOMBIE, OWNER)
    assert table_rows(spark, table) == sorted(rows("owner", 2))
    assert property_mark(spark, table) == str(OWNER) and branches(spark, table) == ["main"]

    # 2. A newer token: before its publish nothing of it is visible, right after it both the
    # rows and the mark are. Then, still held after the publish, the snapshot carrying its
    # summary is expired, and a writer with a token between the two is refused by the mark.
    def after_publish() -> None:
        seen["published"] = observe("published")
        write_iceberg_fenced(frame(spark, rows("other-role", 1, "2013-01-07")), table,
                             "2013-01-07", 3, role=OTHER_ROLE)
        spark.sql(f"CALL neli.system.expire_snapshots(table => '{table[len('neli.'):]}', "
                  "older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)")
        assert tokens(spark, table) == []
        with pytest.raises(StaleTokenError) as between:
            write(spark, table, rows("between", 4), BETWEEN)
        seen["between"] = (between.value.committed == NEWER, str(between.value))

    plan = {"publish": lambda: seen.__setitem__("publish", observe("publish")),
            "published": after_publish}
    commit = write(spark, table, rows("newer", 2), NEWER)

    assert commit.committed and commit.snapshot_id is not None
    assert seen["publish"] == (False, str(OWNER))  # staged only: neither rows nor mark
    assert seen["published"] == (True, str(NEWER))  # one commit: both at once
    assert seen["between"][0], seen["between"][1]
    assert "table property" in seen["between"][1]
    assert table_rows(spark, table) == sorted(rows("newer", 2))
    assert branches(spark, table) == ["main"]
