"""Token-checked Delta commits (neli_orchestrate.spark.delta) against real Spark and the real
Delta jars: whoever commits first, the highest token's rows are what the table holds, and a stale
token raises instead of being skipped quietly."""

from __future__ import annotations

import logging

import pytest
from sink_cases import DATE, OTHER_DATE, Background, Gate, frame, rows

from neli_orchestrate.errors import ConfigError, StaleTokenError
from neli_orchestrate.spark.delta import (
    committed_token,
    delta_app_id,
    delta_history,
    write_delta_fenced,
)
from neli_orchestrate.testing.table_jars import local_table_session

ROLE = "daily_flights"
ZOMBIE, OWNER = 5, 7


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    session = local_table_session(tmp_path_factory.mktemp("warehouse"), app_name="delta sink")
    yield session
    session.stop()


def table_rows(spark, path, date=DATE):
    df = spark.read.format("delta").load(path).where(f"date = '{date}'")
    return sorted(tuple(r) for r in df.select("date", "carrier", "flights", "writer").collect())


def write(spark, path, data, token, gate=None):
    df = frame(spark, data)
    return write_delta_fenced(gate.hold(df) if gate else df, path, DATE, token, role=ROLE)


def test_zombie_commits_first_then_owner_replaces_its_rows(spark, tmp_path):
    path = str(tmp_path / "daily")
    write_delta_fenced(frame(spark, rows("other-day", 2, OTHER_DATE)), path, OTHER_DATE, 3,
                       role=ROLE)
    write(spark, path, rows("zombie", 3), ZOMBIE)
    commit = write(spark, path, rows("owner", 2), OWNER)

    assert commit.committed and commit.token == OWNER
    assert table_rows(spark, path) == sorted(rows("owner", 2))
    # the run key's partition only: another date's rows stay as they were
    assert table_rows(spark, path, OTHER_DATE) == sorted(rows("other-day", 2, OTHER_DATE))
    assert committed_token(spark, path, delta_app_id(ROLE, DATE)) == OWNER
    tokens = [h["token"] for h in delta_history(spark, path) if h["run_key"] == DATE]
    assert tokens == [ZOMBIE, OWNER]


def test_owner_commits_first_then_zombie_raises_and_table_is_unchanged(spark, tmp_path):
    path = str(tmp_path / "daily")
    write(spark, path, rows("owner", 2), OWNER)
    before_rows = table_rows(spark, path)
    before_versions = [h["version"] for h in delta_history(spark, path)]

    with pytest.raises(StaleTokenError) as raised:
        write(spark, path, rows("zombie", 3), ZOMBIE)

    assert (raised.value.token, raised.value.committed) == (ZOMBIE, OWNER)
    assert str(ZOMBIE) in str(raised.value) and str(OWNER) in str(raised.value)
    after_rows = table_rows(spark, path)
    assert len(after_rows) == len(before_rows) == 2
    assert after_rows == before_rows == sorted(rows("owner", 2))
    assert [h["version"] for h in delta_history(spark, path)] == before_versions


def lost_races(caplog):
    return [r for r in caplog.records if "lost a race" in r.getMessage()]


def test_concurrent_commits_lower_token_raises_and_higher_wins(spark, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="neli_orchestrate.sinks.delta")
    path = str(tmp_path / "daily")
    write_delta_fenced(frame(spark, rows("other-day", 1, OTHER_DATE)), path, OTHER_DATE, 1,
                       role=ROLE)
    gate = Gate(tmp_path, "zombie")
    # The zombie passes the token check and starts its Delta transaction, then is held inside
    # its write job while the owner commits: the zombie's commit must then be refused.
    zombie = Background(lambda: write(spark, path, rows("zombie", 3), ZOMBIE, gate))
    gate.wait_started(zombie)
    owner = write(spark, path, rows("owner", 2), OWNER)
    gate.release()
    zombie.join()

    assert owner.committed
    # refused by Delta's conflict check at commit time, not by the check before writing
    assert ["commit of token 5 lost a race" in r.getMessage() for r in lost_races(caplog)] == [
        True
    ]
    assert isinstance(zombie.error, StaleTokenError), zombie.error
    assert (zombie.error.token, zombie.error.committed) == (ZOMBIE, OWNER)
    assert table_rows(spark, path) == sorted(rows("owner", 2))
    tokens = [h["token"] for h in delta_history(spark, path) if h["run_key"] == DATE]
    assert tokens == [OWNER]


def test_concurrent_commits_higher_token_retries_after_lower_commits(spark, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="neli_orchestrate.sinks.delta")
    path = str(tmp_path / "daily")
    write_delta_fenced(frame(spark, rows("other-day", 1, OTHER_DATE)), path, OTHER_DATE, 1,
                       role=ROLE)
    gate = Gate(tmp_path, "owner")
    owner = Background(lambda: write(spark, path, rows("owner", 2), OWNER, gate))
    gate.wait_started(owner)
    write(spark, path, rows("zombie", 3), ZOMBIE)  # the zombie's commit lands first...
    gate.release()
    owner.join()

    assert owner.error is None, owner.error
    assert owner.result.committed
    assert len(lost_races(caplog)) == 1
    # ...and the owner's conflicting commit is retried over it: only the owner's rows remain
    assert table_rows(spark, path) == sorted(rows("owner", 2))
    tokens = [h["token"] for h in delta_history(spark, path) if h["run_key"] == DATE]
    assert tokens == [ZOMBIE, OWNER]


def test_takeover_after_kill_after_job_commits_again_without_duplicating_rows(spark, tmp_path):
    path = str(tmp_path / "daily")
    # The first owner's job committed its output, then it died before recording COMPLETED.
    write(spark, path, rows("run", 4), ZOMBIE)
    # The deployment that takes over runs the same job again under its higher token.
    commit = write(spark, path, rows("run", 4), OWNER)

    assert commit.committed
    assert table_rows(spark, path) == sorted(rows("run", 4))  # four rows, not eight
    assert committed_token(spark, path, delta_app_id(ROLE, DATE)) == OWNER


def test_same_token_twice_is_an_idempotent_no_op(spark, tmp_path):
    path = str(tmp_path / "daily")
    first = write(spark, path, rows("owner", 2), OWNER)
    again = write(spark, path, rows("owner-retry", 5), OWNER)

    assert first.committed and not again.committed
    assert again.version == first.version
    assert table_rows(spark, path) == sorted(rows("owner", 2))


# -- first write, several partitions, maintenance ---------------------------------------------

OTHER_ROLE = "hourly_flights"


def test_zombie_held_in_its_first_write_before_the_table_existed_is_refused(spark, tmp_path):
    # No table yet: the zombie checks (nothing recorded) and is held inside its write job; the
    # owner creates the table with its token and another role writes its partition. Delta's
    # put-if-absent of version 0 fails the zombie's commit; the retry sees the owner's token.
    path = str(tmp_path / "daily")
    gate = Gate(tmp_path, "zombie")
    zombie = Background(lambda: write(spark, path, rows("zombie", 3), ZOMBIE, gate))
    gate.wait_started(zombie)
    write(spark, path, rows("owner", 2), OWNER)
    write_delta_fenced(frame(spark, rows("other-role", 2, OTHER_DATE)), path, OTHER_DATE, 3,
                       role=OTHER_ROLE)
    gate.release()
    zombie.join()

    assert isinstance(zombie.error, StaleTokenError), zombie.error
    assert (zombie.error.token, zombie.error.committed) == (ZOMBIE, OWNER)
    assert table_rows(spark, path) == sorted(rows("owner", 2))
    assert table_rows(spark, path, OTHER_DATE) == sorted(rows("other-role", 2, OTHER_DATE))


def test_one_token_several_partitions_maintenance_and_retention(spark, tmp_path):
    path = str(tmp_path / "daily")
    first = write(spark, path, rows("owner", 2), OWNER)
    second = write_delta_fenced(frame(spark, rows("owner", 3, OTHER_DATE)), path, DATE, OWNER,
                                role=ROLE, partition_value=OTHER_DATE)
    assert first.committed and second.committed  # one token, two partitions, both land
    assert table_rows(spark, path, OTHER_DATE) == sorted(rows("owner", 3, OTHER_DATE))
    with pytest.raises(ConfigError, match="role"):
        write_delta_fenced(frame(spark, rows("x", 1)), path, DATE, 9)

    # Compaction and vacuum (Spark's OPTIMIZE, then VACUUM with no retention) keep the token.
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    spark.sql(f"OPTIMIZE delta.`{path}`")
    spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS")
    for date, partition in ((DATE, None), (OTHER_DATE, OTHER_DATE)):
        with pytest.raises(StaleTokenError):
            write_delta_fenced(frame(spark, rows("zombie", 1, date)), path, DATE, ZOMBIE,
                               role=ROLE, partition_value=partition)
    assert table_rows(spark, path) == sorted(rows("owner", 2))
    # The other engine's writer (delta-rs) shares the key and is refused after Spark's
    # compaction too.
    import pyarrow as pa

    from neli_orchestrate.sinks.delta import write_deltalake_fenced

    zombie_rs = pa.table({"date": [DATE], "carrier": ["C0"], "flights": [1], "writer": ["rs"]})
    with pytest.raises(StaleTokenError):
        write_deltalake_fenced(zombie_rs, path, DATE, ZOMBIE, role=ROLE)
    assert table_rows(spark, path) == sorted(rows("owner", 2))

    # Transaction retention would let Delta forget the token: refused up front, by name.
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
              "('delta.setTransactionRetentionDuration' = 'interval 1 days')")
    with pytest.raises(ConfigError, match="delta.setTransactionRetentionDuration"):
        write(spark, path, rows("owner", 2), OWNER + 1)
    assert table_rows(spark, path) == sorted(rows("owner", 2))
