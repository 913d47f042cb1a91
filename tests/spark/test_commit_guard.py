"""The token commit guard publishes only the highest token's output (invariant S3)."""

from __future__ import annotations

import fcntl
import json
import os
import random
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest

from neli_orchestrate.errors import ConfigError, StaleTokenError
from neli_orchestrate.sinks.directory import _exchange
from neli_orchestrate.spark import TokenCommitGuard
from neli_orchestrate.spark.commit import (
    MARKER_NAME,
    CommitConflictError,
    CommitLockTimeout,
    CommitMarkerError,
    commit_output,
    escape_run_key,
)

RUN_KEY = "2013-01-05"


def fixed_clock() -> datetime:
    return datetime(2013, 1, 6, 3, 0, tzinfo=UTC)


def publish(
    guard: TokenCommitGuard,
    token: int,
    content: str,
    *,
    run_key: str = RUN_KEY,
    role: str | None = "daily_flights",
    attempt: int = 0,
):
    with guard.stage(run_key, token, role=role, deployment="us-east-1", attempt=attempt) as staged:
        (staged.path / "part-0.txt").write_text(content)
    return staged


def published_files(guard: TokenCommitGuard, run_key: str = RUN_KEY) -> dict[str, str]:
    target = guard.output_path(run_key)
    return {p.name: p.read_text() for p in sorted(target.iterdir()) if p.name != MARKER_NAME}


def leftovers(guard: TokenCommitGuard) -> list[Path]:
    """Staging or replaced directories still on disk (a clean publish leaves none)."""
    internal = guard.root / "_neli"
    return sorted(internal.glob("staging/*/*")) + sorted(internal.glob("trash/*"))


def test_publish_moves_staged_output_into_place_with_marker(tmp_path: Path) -> None:
    guard = TokenCommitGuard(tmp_path / "out", clock=fixed_clock)

    staged = publish(guard, 7, "rows of token 7")

    target = tmp_path / "out" / RUN_KEY
    assert staged.published
    assert not staged.path.exists()
    assert published_files(guard) == {"part-0.txt": "rows of token 7"}
    marker = json.loads((target / MARKER_NAME).read_text())
    assert marker["token"] == 7
    assert marker["run_key"] == RUN_KEY
    assert marker["role"] == "daily_flights"
    assert marker["deployment"] == "us-east-1"
    assert marker["committed_at"] == "2013-01-06T03:00:00+00:00"
    assert guard.committed(RUN_KEY).token == 7
    assert guard.highest_token(RUN_KEY) == 7
    assert leftovers(guard) == []


def test_nothing_is_visible_while_the_job_is_still_writing(tmp_path: Path) -> None:
    guard = TokenCommitGuard(tmp_path)
    staged = guard.stage(RUN_KEY, 3)
    (staged.path / "part-0.txt").write_text("half")

    assert not guard.output_path(RUN_KEY).exists()
    assert guard.committed(RUN_KEY) is None
    staged.commit()
    assert published_files(guard) == {"part-0.txt": "half"}


def test_equal_token_recommit_is_idempotent_and_keeps_the_first_output(tmp_path: Path) -> None:
    guard = TokenCommitGuard(tmp_path)
    first = publish(guard, 5, "first attempt", attempt=0)

    retry = publish(guard, 5, "retry attempt", attempt=1)

    assert first.published and not retry.published
    assert retry.marker == first.marker
    assert published_files(guard) == {"part-0.txt": "first attempt"}
    assert guard.committed(RUN_KEY).attempt == 0
    assert leftovers(guard) == []


@pytest.mark.parametrize("atomic_swap", [True, False], ids=["rename-exchange", "two-renames"])
def test_higher_token_replaces_the_published_output(tmp_path: Path, atomic_swap: bool) -> None:
    guard = TokenCommitGuard(tmp_path, atomic_swap=atomic_swap)
    publish(guard, 5, "old leader")

    staged = publish(guard, 9, "new leader")

    assert staged.published
    assert published_files(guard) == {"part-0.txt": "new leader"}
    assert guard.committed(RUN_KEY).token == 9
    assert guard.highest_token(RUN_KEY) == 9
    assert leftovers(guard) == []
    # The path taken: the two-rename fallback parks the old output in _neli/trash.
    used_trash = (tmp_path / "_neli" / "trash").exists()
    assert used_trash == (not atomic_swap or not exchange_supported(tmp_path))


def exchange_supported(where: Path) -> bool:
    a, b = where / "probe-a", where / "probe-b"
    a.mkdir()
    b.mkdir()
    try:
        return _exchange(a, b)
    finally:
        a.rmdir()
        b.rmdir()


def test_lower_token_is_refused_before_the_job_writes(tmp_path: Path) -> None:
    guard = TokenCommitGuard(tmp_path)
    publish(guard, 9, "new leader")

    with pytest.raises(StaleTokenError) as caught:
        guard.stage(RUN_KEY, 5, role="daily_flights")

    assert (caught.value.token, caught.value.committed) == (5, 9)
    assert published_files(guard) == {"part-0.txt": "new leader"}


def test_paused_leader_cannot_publish_after_a_newer_token_committed(tmp_path: Path) -> None:
    guard = TokenCommitGuard(tmp_path)
    paused = guard.stage(RUN_KEY, 5, role="daily_flights")  # staged, then "paused"
    (paused.path / "part-0.txt").write_text("stale rows")
    publish(guard, 9, "new leader")  # the new leader finishes meanwhile
    before = (guard.output_path(RUN_KEY) / MARKER_NAME).read_bytes()

    with pytest.raises(StaleTokenError) as caught:
        paused.commit()  # the old leader wakes up

    assert (caught.value.token, caught.value.committed) == (5, 9)
    assert published_files(guard) == {"part-0.txt": "new leader"}
    assert (guard.output_path(RUN_KEY) / MARKER_NAME).read_bytes() == before
    assert not paused.path.exists()  # the stale output is discarded, nothing leaks
    assert leftovers(guard) == []


def test_a_newer_token_staging_refuses_an_older_writer_before_it_publishes(
    tmp_path: Path,
) -> None:
    """Issue 9 item 6, order 1: t2 stages (starts), then the paused t1 wakes and publishes."""
    guard = TokenCommitGuard(tmp_path)
    old = guard.stage(RUN_KEY, 5, role="daily_flights")
    (old.path / "part-0.txt").write_text("stale rows")
    new = guard.stage(RUN_KEY, 9, role="daily_flights")  # a newer claim starts its job
    assert guard.highest_token(RUN_KEY) == 9

    with pytest.raises(StaleTokenError) as caught:
        old.commit()  # refused although token 9 has published nothing yet
    assert (caught.value.token, caught.value.committed) == (5, 9)
    assert guard.committed(RUN_KEY) is None, "the stale output never becomes visible"
    with pytest.raises(StaleTokenError):
        guard.stage(RUN_KEY, 5, role="daily_flights")  # nor may it start again

    (new.path / "part-0.txt").write_text("new leader")
    new.commit()
    assert published_files(guard) == {"part-0.txt": "new leader"}
    assert leftovers(guard) == []


def test_an_older_token_that_published_first_is_replaced_by_the_newer_one(
    tmp_path: Path,
) -> None:
    """Issue 9 item 6, order 2: t1 publishes, then t2 stages and publishes."""
    guard = TokenCommitGuard(tmp_path)
    publish(guard, 5, "old leader")
    new = guard.stage(RUN_KEY, 9, role="daily_flights")
    assert published_files(guard) == {"part-0.txt": "old leader"}  # until t2 publishes
    (new.path / "part-0.txt").write_text("new leader")
    new.commit()
    assert published_files(guard) == {"part-0.txt": "new leader"}
    assert guard.committed(RUN_KEY).token == 9


def test_a_newer_token_that_gives_up_still_keeps_the_older_one_out(tmp_path: Path) -> None:
    guard = TokenCommitGuard(tmp_path)
    old = guard.stage(RUN_KEY, 5, role="daily_flights")
    with pytest.raises(RuntimeError):
        with guard.stage(RUN_KEY, 9, role="daily_flights"):
            raise RuntimeError("the newer job failed")
    with pytest.raises(StaleTokenError):
        old.commit()
    assert guard.committed(RUN_KEY) is None
    publish(guard, 9, "retried under token 9")  # the newer claim's retry may still publish
    assert published_files(guard) == {"part-0.txt": "retried under token 9"}


def test_failed_job_publishes_nothing(tmp_path: Path) -> None:
    guard = TokenCommitGuard(tmp_path)
    publish(guard, 4, "good output")

    with pytest.raises(RuntimeError, match="spark died"):
        with guard.stage(RUN_KEY, 6) as staged:
            (staged.path / "part-0.txt").write_text("partial")
            raise RuntimeError("spark died")

    assert published_files(guard) == {"part-0.txt": "good output"}
    assert guard.committed(RUN_KEY).token == 4
    assert leftovers(guard) == []


def test_crash_between_high_water_mark_and_rename_keeps_stale_writers_out(tmp_path: Path) -> None:
    guard = TokenCommitGuard(tmp_path)
    publish(guard, 3, "token 3")
    # What a crash of token 8's publisher after raising the high-water mark leaves behind.
    guard.high_water_path(RUN_KEY).write_text(
        json.dumps(
            {
                "format": "neli-commit-hwm/1",
                "run_key": RUN_KEY,
                "token": 8,
                "role": "daily_flights",
                "updated_at": "2013-01-06T00:00:00+00:00",
            }
        )
    )

    with pytest.raises(StaleTokenError) as caught:
        publish(guard, 6, "token 6")
    assert caught.value.committed == 8
    assert published_files(guard) == {"part-0.txt": "token 3"}

    publish(guard, 8, "token 8 retried")  # the same run retrying may still publish
    assert published_files(guard) == {"part-0.txt": "token 8 retried"}
    assert guard.committed(RUN_KEY).token == 8


def test_commit_waits_for_the_lock_holder(tmp_path: Path) -> None:
    guard = TokenCommitGuard(tmp_path, lock_timeout=0.2)
    publish(guard, 1, "token 1")
    staged = guard.stage(RUN_KEY, 2)
    (staged.path / "part-0.txt").write_text("token 2")

    with open(guard.lock_path(RUN_KEY), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another publisher mid-commit
        with pytest.raises(CommitLockTimeout, match="held by another writer"):
            staged.commit()
        assert published_files(guard) == {"part-0.txt": "token 1"}

    assert staged.commit().token == 2  # kept for a retry after a lock timeout
    assert published_files(guard) == {"part-0.txt": "token 2"}


WORKER = textwrap.dedent(
    """
    import json, sys
    from neli_orchestrate.errors import StaleTokenError
    from neli_orchestrate.spark import TokenCommitGuard

    root, run_key, token = sys.argv[1], sys.argv[2], int(sys.argv[3])
    guard = TokenCommitGuard(root, lock_timeout=60)
    try:
        staged = guard.stage(run_key, token, role="daily_flights")
    except StaleTokenError as exc:  # a higher token registered first: refused before writing
        print("READY", flush=True)
        sys.stdin.readline()
        print(json.dumps({"token": token, "result": "stale", "committed": exc.committed}))
        sys.exit(0)
    (staged.path / "part-0.txt").write_text(f"token {token}")
    print("READY", flush=True)
    sys.stdin.readline()  # every publisher is staged: commit all at once
    try:
        marker = staged.commit()
        print(json.dumps({"token": token, "result": "published", "marker": marker.token}))
    except StaleTokenError as exc:
        print(json.dumps({"token": token, "result": "stale", "committed": exc.committed}))
    """
)


@pytest.mark.parametrize("round_", range(2))
def test_concurrent_publishers_end_with_the_highest_tokens_output(
    tmp_path: Path, round_: int
) -> None:
    tokens = list(range(10, 18))
    random.Random(round_).shuffle(tokens)
    root = tmp_path / "out"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(root), RUN_KEY, str(token)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for token in tokens
    ]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "READY", proc.stderr.read()
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    guard = TokenCommitGuard(root)
    highest = max(tokens)
    assert guard.committed(RUN_KEY).token == highest
    assert published_files(guard) == {"part-0.txt": f"token {highest}"}
    by_token = {r["token"]: r for r in results}
    assert by_token[highest]["result"] == "published"
    for result in results:
        assert result["result"] in ("published", "stale")
        if result["result"] == "stale":
            assert result["committed"] > result["token"]
    assert leftovers(guard) == []


@pytest.mark.parametrize(
    "marker_text, error",
    [
        ("{not json", "not valid JSON"),
        ('["a list"]', "must hold a JSON object"),
        ('{"format": "neli-commit/1", "run_key": "2013-01-05"}', "no valid token"),
        ('{"format": "neli-commit/1", "run_key": "2013-01-05", "token": "7"}', "no valid token"),
        ('{"format": "neli-commit/99", "run_key": "2013-01-05", "token": 7}', "format"),
    ],
    ids=["invalid-json", "not-an-object", "no-token", "string-token", "unknown-format"],
)
def test_malformed_marker_is_a_clear_error_and_publishes_nothing(
    tmp_path: Path, marker_text: str, error: str
) -> None:
    guard = TokenCommitGuard(tmp_path)
    publish(guard, 7, "token 7")
    marker = guard.output_path(RUN_KEY) / MARKER_NAME
    marker.write_text(marker_text)
    guard.high_water_path(RUN_KEY).unlink()

    with pytest.raises(CommitMarkerError, match=error) as caught:
        publish(guard, 9, "token 9")

    assert str(marker) in str(caught.value)
    assert published_files(guard) == {"part-0.txt": "token 7"}
    assert marker.read_text() == marker_text


def test_malformed_high_water_mark_is_a_clear_error(tmp_path: Path) -> None:
    guard = TokenCommitGuard(tmp_path)
    publish(guard, 7, "token 7")
    guard.high_water_path(RUN_KEY).write_text('{"format": "neli-commit-hwm/1", "token": -1}')

    with pytest.raises(CommitMarkerError, match="high-water mark"):
        publish(guard, 9, "token 9")
    assert published_files(guard) == {"part-0.txt": "token 7"}


def test_foreign_directory_without_marker_is_never_overwritten(tmp_path: Path) -> None:
    guard = TokenCommitGuard(tmp_path)
    foreign = guard.output_path(RUN_KEY)
    foreign.mkdir(parents=True)
    (foreign / "part-0.txt").write_text("written by hand")

    with pytest.raises(CommitConflictError, match="without a _NELI_COMMITTED marker"):
        publish(guard, 9, "token 9")
    assert (foreign / "part-0.txt").read_text() == "written by hand"


def test_tokens_of_another_role_are_not_compared(tmp_path: Path) -> None:
    guard = TokenCommitGuard(tmp_path)
    publish(guard, 3, "role a", role="role_a")

    with pytest.raises(CommitConflictError, match="tokens of different roles"):
        publish(guard, 100, "role b", role="role_b")
    assert published_files(guard) == {"part-0.txt": "role a"}


def test_run_keys_map_to_distinct_visible_directories(tmp_path: Path) -> None:
    guard = TokenCommitGuard(tmp_path)
    keys = ["nycflights/2013-01-05T00:00:00+00:00", "_neli", ".hidden", "a%2Fb", "a/b", "δ"]
    for token, key in enumerate(keys):
        publish(guard, token, key, run_key=key)

    names = [guard.output_path(key).name for key in keys]
    assert len(set(names)) == len(keys)
    assert not any(name.startswith(("_", ".")) for name in names)
    for key in keys:
        assert published_files(guard, key) == {"part-0.txt": key}
        assert guard.committed(key).run_key == key
    assert escape_run_key("2013-01-05") == "2013-01-05"


def test_partition_column_layout(tmp_path: Path) -> None:
    guard = TokenCommitGuard(tmp_path, partition_column="date")
    publish(guard, 1, "x")
    assert guard.output_path(RUN_KEY) == tmp_path / "date=2013-01-05"
    assert (tmp_path / "date=2013-01-05" / "part-0.txt").read_text() == "x"


def test_commit_output_runs_the_writer_in_staging(tmp_path: Path) -> None:
    seen: list[Path] = []

    def write(path: Path) -> None:
        seen.append(path)
        (path / "part-0.txt").write_text("via commit_output")

    marker = commit_output(tmp_path, RUN_KEY, 4, write, role="daily_flights", metadata={"k": "v"})

    assert marker.token == 4 and marker.metadata["k"] == "v"
    assert seen[0] != marker.path and not seen[0].exists()
    assert (marker.path / "part-0.txt").read_text() == "via commit_output"
    with pytest.raises(StaleTokenError):
        commit_output(tmp_path, RUN_KEY, 3, write, role="daily_flights")
    assert len(seen) == 1  # the stale writer never ran


def test_purge_removes_abandoned_staging(tmp_path: Path) -> None:
    guard = TokenCommitGuard(tmp_path)
    crashed = guard.stage(RUN_KEY, 1)
    live = guard.stage(RUN_KEY, 2)
    old = os.stat(crashed.path).st_mtime - 7200
    os.utime(crashed.path, (old, old))

    removed = guard.purge(older_than=3600)

    assert removed == [crashed.path]
    assert not crashed.path.exists() and live.path.exists()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"token": -1}, "token must be a non-negative int"),
        ({"token": True}, "token must be a non-negative int"),
        ({"token": "7"}, "token must be a non-negative int"),
        ({"run_key": ""}, "run_key must be a non-empty string"),
        ({"attempt": -2}, "attempt must be a non-negative int"),
    ],
)
def test_invalid_arguments_are_config_errors(tmp_path: Path, kwargs: dict, match: str) -> None:
    guard = TokenCommitGuard(tmp_path)
    args = {"run_key": RUN_KEY, "token": 1, "attempt": 0} | kwargs
    with pytest.raises(ConfigError, match=match):
        guard.stage(args["run_key"], args["token"], attempt=args["attempt"])


def test_object_store_root_is_refused_with_a_pointer_to_the_docs() -> None:
    with pytest.raises(ConfigError, match="docs/guide/spark.md"):
        TokenCommitGuard("s3a://bucket/daily_performance")
    assert TokenCommitGuard("file:///tmp/x").root == Path("/tmp/x")
