"""Publish a run's output directory only if its fencing token is not stale.

Usage::

    guard = TokenCommitGuard("/data/daily_performance")
    with guard.stage(run.claim) as staged:     # or guard.stage("2013-01-05", token=run.token)
        write_files_into(staged.path)          # private staging directory
    staged.marker.token                         # published: /data/daily_performance/2013-01-05

The guard is the sink half of fencing (invariant S3): a leader that was paused, lost its role
and woke up again still holds its old token, and its publish raises
:class:`~neli_orchestrate.errors.StaleTokenError` instead of overwriting the newer leader's
output.

Protocol, for one run key under ``root``:

1. Stage registers the token: under an exclusive ``flock`` on ``root/_neli/locks/<key>.lock``
   it refuses a token below the high-water mark ``root/_neli/tokens/<key>.json`` (or the
   published marker) and raises the mark to it, *before the job writes*. From then on every
   older token is stale, whether its writer already staged or not, so a paused older runner
   cannot publish after a newer claim started, even if the newer one never publishes.
   The writer then stages into ``root/_neli/staging/<key>/t<token>-a<attempt>-<uuid>``;
   nothing outside that directory changes while the job runs, and readers never see it
   (Spark skips names starting with ``_``).
2. Publish takes the lock again, then, under the
   lock: reads the high-water mark and the marker
   ``_NELI_COMMITTED`` inside the published directory; a token below either raises
   ``StaleTokenError``; an equal token whose output is already published is a no-op; otherwise
   it writes the marker into the staging directory, raises the high-water mark, and renames the
   staging directory into place (an atomic ``RENAME_EXCHANGE`` swap with the previous output on
   Linux, two renames elsewhere).
3. The lock is released and the replaced output is deleted.

What this guarantees on one POSIX filesystem, for writers that all go through the guard:

- The published directory only ever moves to a higher (or equal) token: a lower token can never
  replace it, whatever the interleaving, because check and rename happen under one lock.
- Readers see a complete output or the previous complete output, never a half-written one
  (with the atomic swap; the two-rename fallback has a short window with no directory at all).
- A crash at any step leaves either the old output or the new one published, and the high-water
  mark already raised, so a stale writer stays refused while the same token may publish again.
  The kernel drops the ``flock`` of a dead process, so there are no stale locks.

What it does *not* guarantee:

- Object stores (S3, GCS, ABFS) have no atomic directory rename and no ``flock``; see
  ``docs/guide/spark.md`` for conditional writes and table-format commits.
- NFS and other network filesystems: ``flock`` across machines depends on the server's lock
  manager; do not rely on it.
- A writer paused *while holding the lock* after passing the check publishes when it resumes;
  the newer writer waits on the lock (up to ``lock_timeout``) and then replaces that output, so
  the end state is still the highest token's, but readers may briefly see the stale output.
- Equal tokens are not ordered: the first publication of a token stands, later ones are no-ops.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, overload

from neli_orchestrate.claim import Claim, as_claim
from neli_orchestrate.errors import ConfigError, NeliError, StaleTokenError

logger = logging.getLogger(__name__)

MARKER_NAME = "_NELI_COMMITTED"
MARKER_FORMAT = "neli-commit/1"
HIGH_WATER_FORMAT = "neli-commit-hwm/1"
INTERNAL_DIR = "_neli"
DEFAULT_LOCK_TIMEOUT = 120.0

_SAFE_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.")
_MAX_NAME_BYTES = 200


class CommitError(NeliError):
    """The commit guard could not publish; the message says what to fix."""


class CommitMarkerError(CommitError):
    """A commit marker or high-water-mark file is unreadable; inspect or remove the named file."""


class CommitConflictError(CommitError):
    """The target holds output the guard cannot compare tokens with (foreign or other role)."""


class CommitLockTimeout(CommitError, TimeoutError):
    """Another writer held the run key's commit lock past ``lock_timeout``."""


@dataclass(frozen=True)
class CommitMarker:
    """What was published for a run key: the token and who committed it, when."""

    token: int
    run_key: str
    role: str | None
    deployment: str | None
    attempt: int
    committed_at: str
    path: Path
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """Serialise the marker as stored in ``_NELI_COMMITTED`` (path excluded)."""
        return json.dumps(
            {
                "format": MARKER_FORMAT,
                "token": self.token,
                "run_key": self.run_key,
                "role": self.role,
                "deployment": self.deployment,
                "attempt": self.attempt,
                "committed_at": self.committed_at,
                "metadata": dict(self.metadata),
            },
            indent=2,
            sort_keys=True,
        )


def escape_run_key(run_key: str) -> str:
    """Return the directory name for a run key: reversible, Hadoop- and Spark-safe.

    Bytes outside ``[A-Za-z0-9._-]`` become ``%XX`` (the escaping Spark uses for partition
    values), and so does a leading ``.`` or ``_`` so the output is never hidden from readers.
    """
    if not isinstance(run_key, str) or not run_key:
        raise ConfigError(f"run_key must be a non-empty string, got {run_key!r}")
    if "\x00" in run_key:
        raise ConfigError(f"run_key must not contain NUL characters: {run_key!r}")
    out = []
    for index, byte in enumerate(run_key.encode("utf-8")):
        char = chr(byte)
        if char in _SAFE_CHARS and not (index == 0 and char in "._"):
            out.append(char)
        else:
            out.append(f"%{byte:02X}")
    name = "".join(out)
    if len(name) > _MAX_NAME_BYTES:
        raise ConfigError(
            f"run_key {run_key!r} is too long for a directory name "
            f"({len(name)} bytes escaped, limit {_MAX_NAME_BYTES})"
        )
    return name


def _root_path(root: str | os.PathLike[str]) -> Path:
    text = os.fspath(root)
    if "://" in text:
        if text.startswith("file://"):
            text = text[len("file://") :]
        else:
            raise ConfigError(
                f"root {text!r} is not a local path: the token commit guard needs a POSIX "
                "filesystem (atomic rename and flock). For object stores use conditional writes "
                "or a table format's commit; see docs/guide/spark.md"
            )
    return Path(text).absolute()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write_text(path: Path, text: str) -> None:
    # Write-fsync-rename so a crash leaves the old file or the new one, never a torn one.
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_tree(path: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(path):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_renameat2: Any = None
_renameat2_loaded = False


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2(RENAME_EXCHANGE)``); False if unsupported."""
    global _renameat2, _renameat2_loaded
    if not _renameat2_loaded:
        _renameat2_loaded = True
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            func = libc.renameat2
            func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
            func.argtypes += [ctypes.c_uint]
            func.restype = ctypes.c_int
            _renameat2 = func
        except (OSError, AttributeError):
            _renameat2 = None
    if _renameat2 is None:
        return False
    result = _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if result == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, f"renameat2(RENAME_EXCHANGE) failed: {os.strerror(err)}", str(a), 0, str(b))


def _utc_now() -> datetime:
    return datetime.now(UTC)


class TokenCommitGuard:
    """Publish output directories under ``root`` only for the highest fencing token.

    ``partition_column`` names the published directory ``<column>=<run key>`` (Hive/Spark
    partition layout, so ``spark.read.parquet(root)`` sees a column); without it the directory
    is named after the run key. ``lock_timeout`` bounds the wait for another publisher (None
    waits forever). ``fsync_data`` also fsyncs every staged file before publishing (Spark does
    not fsync local output). ``atomic_swap=False`` forces the two-rename fallback used where
    ``renameat2(RENAME_EXCHANGE)`` is missing. ``clock`` stamps ``committed_at`` (metadata
    only; no decision depends on wall time); ``monotonic`` measures the lock deadline.

    .. note:: Only writers that go through a guard are fenced. Do not point other tools at the
       published directories, and keep ``root`` on one local POSIX filesystem.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        partition_column: str | None = None,
        lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
        fsync_data: bool = False,
        atomic_swap: bool = True,
        clock: Callable[[], datetime] = _utc_now,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if partition_column is not None and (
            not partition_column or escape_run_key(partition_column) != partition_column
        ):
            raise ConfigError(
                f"partition_column must be a plain column name ([A-Za-z0-9_-], not starting "
                f"with '_' or '.'), got {partition_column!r}"
            )
        if lock_timeout is not None and lock_timeout < 0:
            raise ConfigError(f"lock_timeout must be >= 0 seconds or None, got {lock_timeout!r}")
        self._root = _root_path(root)
        self._partition_column = partition_column
        self._lock_timeout = lock_timeout
        self._fsync_data = fsync_data
        self._atomic_swap = atomic_swap
        self._clock = clock
        self._monotonic = monotonic

    @property
    def root(self) -> Path:
        """The directory holding the published outputs (and the guard's ``_neli`` area)."""
        return self._root

    @property
    def partition_column(self) -> str | None:
        """The partition column naming published directories, if any."""
        return self._partition_column

    def output_path(self, run_key: str) -> Path:
        """Return where the output of ``run_key`` is published."""
        name = escape_run_key(run_key)
        if self._partition_column is not None:
            name = f"{self._partition_column}={name}"
        return self._root / name

    def lock_path(self, run_key: str) -> Path:
        """Return the lock file publishers of ``run_key`` ``flock`` (never deleted)."""
        return self._internal("locks") / f"{escape_run_key(run_key)}.lock"

    def high_water_path(self, run_key: str) -> Path:
        """Return the file recording the highest token ever staged or committed for ``run_key``."""
        return self._internal("tokens") / f"{escape_run_key(run_key)}.json"

    def committed(self, run_key: str) -> CommitMarker | None:
        """Return the marker of the output published for ``run_key``, or None if none is."""
        return self._read_marker(self.output_path(run_key), run_key)

    def highest_token(self, run_key: str) -> int | None:
        """Return the highest token staged or committed for ``run_key`` (lower ones are stale)."""
        return self._max_committed(self._read_high_water(run_key), self.committed(run_key))

    def check(
        self, claim: Claim | str, token: int | None = None, *, role: str | None = None
    ) -> None:
        """Raise ``StaleTokenError`` now if the claim's token is already below a committed token.

        ``claim`` is the run's :class:`~neli_orchestrate.claim.Claim`; the loose form passes
        the run key, ``token`` and ``role=``. An early, lock-free check so a stale job fails
        before computing anything; the authoritative check is repeated under the lock when
        publishing.
        """
        claim = as_claim(claim, token, role=role)  # the loose form
        run_key, token, role = claim.run_key, claim.token, claim.role
        high = self._read_high_water(run_key)
        current = self.committed(run_key)
        self._check_role(run_key, role, high, current)
        committed = self._max_committed(high, current)
        if committed is not None and token < committed:
            raise self._stale(run_key, token, committed)

    def stage(
        self,
        claim: Claim | str,
        token: int | None = None,
        *,
        role: str | None = None,
        deployment: str | None = None,
        attempt: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> StagedOutput:
        """Register the claim's token and create a private staging directory for it.

        ``claim`` is the run's :class:`~neli_orchestrate.claim.Claim` (``run.claim``,
        ``read_neli_conf(spark)``); the loose form passes the run key and ``token`` (with
        ``role=``, ``deployment=``, ``attempt=``) and builds that Claim.

        Fails fast with ``StaleTokenError`` if the token is already stale. Otherwise raises the
        run key's high-water mark to ``token`` (under the lock) before the job writes, so from
        now on every lower token is refused, staged or not, published or not. Use the result
        as a context manager (publish on success, discard on exception) or call ``commit()``.
        """
        claim = as_claim(claim, token, role=role, deployment=deployment, attempt=attempt)
        run_key, token, role, deployment = claim.run_key, claim.token, claim.role, claim.deployment
        attempt = claim.attempt
        self._register(run_key, token, role)
        parent = self._internal("staging", create=True) / escape_run_key(run_key)
        parent.mkdir(parents=True, exist_ok=True)
        path = parent / f"t{token}-a{attempt}-{uuid.uuid4().hex[:12]}"
        path.mkdir()
        logger.debug("staging %s token %d in %s", run_key, token, path)
        return StagedOutput(
            self, path, run_key, token, role, deployment, attempt, dict(metadata or {})
        )

    def _register(self, run_key: str, token: int, role: str | None) -> None:
        """Under the lock: refuse a stale ``token``, else raise the high-water mark to it.

        Registering at stage time (before the job writes) makes every older token stale from
        now on: a paused older writer that wakes up can no longer publish, even before this
        token publishes, and even if it never does.
        """
        with self._locked(run_key):
            high = self._read_high_water(run_key)
            current = self.committed(run_key)
            self._check_role(run_key, role, high, current)
            committed = self._max_committed(high, current)
            if committed is not None and token < committed:
                raise self._stale(run_key, token, committed)
            if high is None or token > high[0]:
                self._write_high_water(run_key, token, role)
                logger.debug("registered token %d for run key %r", token, run_key)

    def purge(self, older_than: float) -> list[Path]:
        """Delete abandoned staging and replaced outputs last modified over ``older_than`` s ago.

        Crashed writers leave their staging directories behind. Pick ``older_than`` well above
        your longest job: a live job's staging directory is removed too if it is older.
        """
        cutoff = time.time() - older_than
        removed: list[Path] = []
        candidates: list[Path] = []
        staging = self._internal("staging")
        if staging.is_dir():
            for key_dir in staging.iterdir():
                candidates.extend(key_dir.iterdir() if key_dir.is_dir() else [])
        trash = self._internal("trash")
        if trash.is_dir():
            candidates.extend(trash.iterdir())
        for path in candidates:
            try:
                if path.stat().st_mtime < cutoff:
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(path)
            except FileNotFoundError:
                continue
        if removed:
            logger.info(
                "purged %d abandoned staging/replaced directories under %s",
                len(removed),
                self._root,
            )
        return removed

    # -- internals -------------------------------------------------------------------------

    def _internal(self, name: str, *, create: bool = False) -> Path:
        path = self._root / INTERNAL_DIR / name
        if create:
            path.mkdir(parents=True, exist_ok=True)
        return path

    @contextlib.contextmanager
    def _locked(self, run_key: str) -> Iterator[None]:
        path = self.lock_path(run_key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if self._lock_timeout is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            else:
                deadline = self._monotonic() + self._lock_timeout
                delay = 0.005
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        remaining = deadline - self._monotonic()
                        if remaining <= 0:
                            raise CommitLockTimeout(
                                f"commit lock {path} for run key {run_key!r} was held by another "
                                f"writer for more than {self._lock_timeout} s; a paused or hung "
                                "publisher holds it (find it with `fuser` / `lsof`) or raise "
                                "lock_timeout"
                            ) from None
                        time.sleep(min(delay, remaining))
                        delay = min(delay * 2, 0.1)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def _read_json(self, path: Path, what: str) -> dict[str, Any] | None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise CommitMarkerError(f"cannot read {what} {path}: {exc}") from exc
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CommitMarkerError(
                f"{what} {path} is not valid JSON ({exc}); the committed token is unknown, so "
                "nothing will be published for this run key until the file is repaired or removed"
            ) from exc
        if not isinstance(data, dict):
            raise CommitMarkerError(f"{what} {path} must hold a JSON object, got {type(data)!r}")
        return data

    def _read_marker(self, target: Path, run_key: str) -> CommitMarker | None:
        if not target.exists() and not target.is_symlink():
            return None
        if not target.is_dir():
            raise CommitConflictError(
                f"{target} exists but is not a directory; it was not published by the token "
                f"commit guard. Move it away before committing run key {run_key!r}"
            )
        marker_path = target / MARKER_NAME
        data = self._read_json(marker_path, "commit marker")
        if data is None:
            raise CommitConflictError(
                f"{target} exists without a {MARKER_NAME} marker, so it was not published by the "
                f"token commit guard and its token is unknown; move it away (or delete it) before "
                f"committing run key {run_key!r}"
            )
        fmt = data.get("format")
        if fmt != MARKER_FORMAT:
            raise CommitMarkerError(
                f"commit marker {marker_path} has format {fmt!r}, expected {MARKER_FORMAT!r} "
                "(written by another version of neli_orchestrate?)"
            )
        token = data.get("token")
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise CommitMarkerError(
                f"commit marker {marker_path} has no valid token (got {token!r})"
            )
        if data.get("run_key") != run_key:
            raise CommitConflictError(
                f"commit marker {marker_path} belongs to run key {data.get('run_key')!r}, "
                f"not {run_key!r}"
            )
        role = data.get("role")
        deployment = data.get("deployment")
        attempt = data.get("attempt", 0)
        committed_at = data.get("committed_at")
        metadata = data.get("metadata", {})
        if (
            not (role is None or isinstance(role, str))
            or not (deployment is None or isinstance(deployment, str))
            or isinstance(attempt, bool)
            or not isinstance(attempt, int)
            or not isinstance(committed_at, str)
            or not isinstance(metadata, dict)
        ):
            raise CommitMarkerError(
                f"commit marker {marker_path} has fields of the wrong type: role, deployment "
                "(string or null), attempt (int), committed_at (string), metadata (object)"
            )
        return CommitMarker(
            token=token,
            run_key=run_key,
            role=role,
            deployment=deployment,
            attempt=attempt,
            committed_at=committed_at,
            path=target,
            metadata=metadata,
        )

    def _read_high_water(self, run_key: str) -> tuple[int, str | None] | None:
        path = self.high_water_path(run_key)
        data = self._read_json(path, "high-water mark")
        if data is None:
            return None
        token = data.get("token")
        role = data.get("role")
        if (
            data.get("format") != HIGH_WATER_FORMAT
            or isinstance(token, bool)
            or not isinstance(token, int)
            or token < 0
            or not (role is None or isinstance(role, str))
            or data.get("run_key") != run_key
        ):
            raise CommitMarkerError(
                f"high-water mark {path} is malformed (expected format {HIGH_WATER_FORMAT!r}, "
                f"run_key {run_key!r}, a non-negative int token); got {data!r}"
            )
        return token, role

    def _write_high_water(self, run_key: str, token: int, role: str | None) -> None:
        payload = {
            "format": HIGH_WATER_FORMAT,
            "run_key": run_key,
            "token": token,
            "role": role,
            "updated_at": self._clock().isoformat(),
        }
        path = self.high_water_path(run_key)
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write_text(path, json.dumps(payload, sort_keys=True))

    @staticmethod
    def _max_committed(
        high: tuple[int, str | None] | None, current: CommitMarker | None
    ) -> int | None:
        present = [
            t
            for t in (high[0] if high else None, current.token if current else None)
            if t is not None
        ]
        return max(present) if present else None

    @staticmethod
    def _check_role(
        run_key: str,
        role: str | None,
        high: tuple[int, str | None] | None,
        current: CommitMarker | None,
    ) -> None:
        # Tokens are only ordered within one role; comparing across roles would let an
        # unrelated role with a larger counter overwrite this one's output.
        if role is None:
            return
        for other in (high[1] if high else None, current.role if current else None):
            if other is not None and other != role:
                raise CommitConflictError(
                    f"output for run key {run_key!r} was committed by role {other!r}; role "
                    f"{role!r} cannot publish there because tokens of different roles are not "
                    "comparable. Give each role its own output root"
                )

    def _stale(self, run_key: str, token: int, committed: int) -> StaleTokenError:
        return StaleTokenError(
            f"token {token} for run key {run_key!r} is stale: token {committed} is already "
            f"committed under {self._root}; a newer leader owns this run, so this writer must "
            "stop without publishing",
            token=token,
            committed=committed,
        )

    def _publish(self, staged: StagedOutput) -> tuple[CommitMarker, bool]:
        """Publish ``staged`` under the lock; return the marker and whether this call published."""
        run_key, token = staged.run_key, staged.token
        target = self.output_path(run_key)
        if not staged.path.is_dir():
            raise CommitError(
                f"staging directory {staged.path} is gone (purged or moved?); nothing to publish"
            )
        leftover: Path | None = None
        with self._locked(run_key):
            high = self._read_high_water(run_key)
            current = self._read_marker(target, run_key)
            self._check_role(run_key, staged.role, high, current)
            committed = self._max_committed(high, current)
            if committed is not None and token < committed:
                raise self._stale(run_key, token, committed)
            if current is not None and current.token == token:
                # The same run publishing again (a retry): its first publication stands.
                return current, False
            marker = CommitMarker(
                token=token,
                run_key=run_key,
                role=staged.role,
                deployment=staged.deployment,
                attempt=staged.attempt,
                committed_at=self._clock().isoformat(),
                path=target,
                metadata={
                    **staged.metadata,
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "staging": staged.path.name,
                },
            )
            if self._fsync_data:
                _fsync_tree(staged.path)
            _atomic_write_text(staged.path / MARKER_NAME, marker.to_json())
            # Raise the high-water mark before the rename: if we crash between the two, stale
            # writers stay refused and this token can still publish on retry.
            if high is None or token > high[0]:
                self._write_high_water(run_key, token, staged.role)
            if current is None:
                os.rename(staged.path, target)
            elif self._atomic_swap and _exchange(staged.path, target):
                leftover = staged.path  # now holds the replaced output
            else:
                trash = self._internal("trash", create=True) / (
                    f"{escape_run_key(run_key)}-t{current.token}-{uuid.uuid4().hex[:12]}"
                )
                os.rename(target, trash)
                os.rename(staged.path, target)
                leftover = trash
            _fsync_dir(target.parent)
            _fsync_dir(staged.path.parent)
        if leftover is not None:
            shutil.rmtree(leftover, ignore_errors=True)
        logger.info(
            "committed run key %r with token %d (role %s, deployment %s) at %s%s",
            run_key,
            token,
            staged.role,
            staged.deployment,
            target,
            f", replacing token {current.token}" if current is not None else "",
        )
        return marker, True


class StagedOutput:
    """A private staging directory that becomes the published output on ``commit()``.

    As a context manager: publishes when the block exits normally and discards the staging
    directory when it raises (or when the publish itself fails).
    """

    def __init__(
        self,
        guard: TokenCommitGuard,
        path: Path,
        run_key: str,
        token: int,
        role: str | None,
        deployment: str | None,
        attempt: int,
        metadata: dict[str, Any],
    ) -> None:
        self.guard = guard
        self.path = path
        self.run_key = run_key
        self.token = token
        self.role = role
        self.deployment = deployment
        self.attempt = attempt
        self.metadata = metadata
        self.marker: CommitMarker | None = None
        self.published = False
        self._discarded = False

    def commit(self) -> CommitMarker:
        """Publish the staged output; raise ``StaleTokenError`` if a higher token committed.

        Returns the marker now published for the run key (for an equal-token re-commit, the
        earlier publication's marker; this staging directory is then discarded). A stale
        staging directory is discarded; after other errors it is kept so ``commit()`` can be
        retried.
        """
        if self.marker is not None:
            return self.marker
        if self._discarded:
            raise CommitError(f"staging directory {self.path} was discarded; stage again")
        try:
            marker, published = self.guard._publish(self)
        except StaleTokenError:
            logger.warning(
                "refusing to publish run key %r with stale token %d; discarding %s",
                self.run_key,
                self.token,
                self.path,
            )
            self.discard()
            raise
        self.marker = marker
        self.published = published
        if not published:
            logger.info(
                "run key %r already published with token %d at %s; discarding re-commit %s",
                self.run_key,
                self.token,
                marker.path,
                self.path,
            )
            self.discard()
        return marker

    def discard(self) -> None:
        """Delete the staging directory (idempotent)."""
        self._discarded = True
        shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> StagedOutput:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            if self.marker is None:
                self.discard()
            return
        try:
            self.commit()
        except BaseException:
            if self.marker is None:
                self.discard()
            raise

    def __repr__(self) -> str:
        return f"StagedOutput(run_key={self.run_key!r}, token={self.token}, path={self.path})"


@overload
def commit_output(
    root: str | os.PathLike[str],
    claim: Claim,
    write: Callable[[Path], None],
    /,
    *,
    metadata: Mapping[str, Any] | None = None,
    partition_column: str | None = None,
    lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
) -> CommitMarker: ...


@overload
def commit_output(
    root: str | os.PathLike[str],
    run_key: str,
    token: int,
    write: Callable[[Path], None],
    /,
    *,
    role: str | None = None,
    deployment: str | None = None,
    attempt: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    partition_column: str | None = None,
    lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
) -> CommitMarker: ...


def commit_output(
    root: str | os.PathLike[str],
    *args: Any,
    role: str | None = None,
    deployment: str | None = None,
    attempt: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    partition_column: str | None = None,
    lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
) -> CommitMarker:
    """``commit_output(root, claim, write)``: run ``write(staging_dir)`` and publish the result
    under ``root`` if the claim's token is current.

    The loose form ``commit_output(root, run_key, token, write, role=..., ...)`` builds the
    Claim. Raises ``StaleTokenError`` (before ``write`` runs, or at publish time) when a higher
    token has committed for the run key; the published output is then left untouched.
    """
    if len(args) == 3:  # the loose form
        run_key, token, write = args
        claim = as_claim(run_key, token, role=role, deployment=deployment, attempt=attempt)
    elif len(args) == 2 and isinstance(args[0], Claim):
        claim, write = args
        as_claim(claim, role=role, deployment=deployment, attempt=attempt)  # none of them
    else:
        raise TypeError("commit_output() takes (root, claim, write) or "
                        "(root, run_key, token, write)")
    guard = TokenCommitGuard(root, partition_column=partition_column, lock_timeout=lock_timeout)
    with guard.stage(claim, metadata=metadata) as staged:
        write(staged.path)
    if staged.marker is None:  # pragma: no cover - __exit__ commits or raises
        raise CommitError(f"run key {claim.run_key!r} was not published")
    return staged.marker
