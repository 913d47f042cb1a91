"""The replay cache: continue a role's fold from where the last replay stopped, when that is safe.

Usage (what :class:`~neli_orchestrate.ledger.kafka.KafkaLedger` does on every replay)::

    checkpoint = cache.get(key)                     # this process's, else this host's file
    end = ...the high watermark, an offset (never -1001: end_is_known), and its leader epoch...
    judgement = judge(checkpoint, topic_id=..., log_start=..., end=end, now=..., retention=...)
    ...CONFIRM: ask for the end again (earlier=end) and judge again...
    builder = ReplayBuilder(role, checkpoint.state) if CONTINUE else ReplayBuilder(role)
    ...fold the messages from checkpoint.offset (or 0) up to the high watermark...
    cache.put(key, Checkpoint(...))

A checkpoint is the fold of a role's committed messages below a read_committed position. Kafka
never changes what lies below that position, with three exceptions, each of which makes
:func:`refusal` answer "replay from offset 0":

- the topic was deleted and recreated (another topic id) or truncated (the high watermark is
  below the checkpoint, and stays there when the broker is asked again: :func:`judge`):
  offsets mean something else now;
- records were deleted from the log start (``DeleteRecords``: the log start offset passed the
  checkpoint);
- compaction removed a tombstone written after the checkpoint, together with the record it
  deleted. The broker keeps a tombstone at least ``delete.retention.ms`` after it was written,
  so a checkpoint is only continued within that time (:data:`RETENTION_SHARE` of it, to allow
  for clock differences between this host and the broker) of the moment its high watermark
  was read; every record above the checkpoint was written after that moment.

Only answers that are offsets are facts. An end offset of -1001 (``OFFSET_INVALID``, what a
partition whose leader is changing may answer), any other negative offset, or an end below the
checkpoint that the broker does not confirm when asked again, says nothing about the topic: the
replay waits for a real answer (:func:`end_is_known`, :attr:`Verdict.CONFIRM`) and never judges
the topic recreated from it.

The highest token a checkpoint saw survives a recreated topic: the fresh replay refuses to
issue a token that does not exceed it (:attr:`~neli_orchestrate.ledger.replay.Replay.next_token`),
which makes "the ledger topic was recreated under a running system" a clear error instead of
tokens that go backwards.

Checkpoints live in memory (long-lived processes: Dagster, a ``Singleton`` in a service) and
in one file per role under the cache directory (every Airflow task is a new process on the
same host). A file that cannot be read is ignored and rewritten, never trusted in part.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import MappingProxyType

from neli_orchestrate.ledger.record import LedgerRecord, MalformedRecordError, _parse
from neli_orchestrate.ledger.replay import FoldState

logger = logging.getLogger(__name__)

#: A checkpoint is continued only within this share of the topic's ``delete.retention.ms``.
RETENTION_SHARE = 0.5

_FORMAT = 1


def end_is_known(offset: int) -> bool:
    """True if ``offset``, a broker's answer for a partition's end or log start, is an offset.

    Negative answers are sentinels (-1001 ``OFFSET_INVALID`` during a leader change, -1
    ``OFFSET_END``, ...): a replay that took one as the end would read nothing and issue a token
    below those already issued.
    """
    return offset >= 0


@dataclass(frozen=True)
class PartitionEnd:
    """One broker answer for the end (high watermark) of a ledger partition."""

    offset: int
    #: The leader epoch the answer came from (None: the broker did not say).
    leader_epoch: int | None = None


@dataclass(frozen=True)
class Checkpoint:
    """The fold of ``role`` below ``offset`` of partition ``partition`` of topic ``topic_id``."""

    cluster_id: str
    topic: str
    topic_id: str
    partition: int
    #: The read_committed position the fold reached (every message below it is folded).
    offset: int
    #: Wall-clock epoch seconds at which the replay read its high watermark (before it reached
    #: ``offset``): every message at or above ``offset`` was written later.
    read_at: float
    state: FoldState
    #: Leader epoch of the end offset the fold reached (None: unknown). An answer from an
    #: older epoch is a deposed leader's, not a fact about the partition now.
    leader_epoch: int | None = None

    @property
    def role(self) -> str:
        return self.state.role


class Verdict(Enum):
    """What a replay does with a checkpoint, given the partition as the broker describes it."""

    #: Continue the fold at the checkpoint's offset.
    CONTINUE = "continue"
    #: Replay from offset 0: the checkpoint may miss changes, but offsets still mean what they
    #: meant (the tokens it saw were issued on this topic and stay below its end).
    REPLAY = "replay"
    #: Offsets restarted (another topic id, or a truncation the broker confirmed): replay from
    #: offset 0 and issue no token up to the checkpoint's highest.
    RESTARTED = "restarted"
    #: The end is below the checkpoint, which no fact explains yet: ask the broker again.
    CONFIRM = "confirm"


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    #: Why the checkpoint is not continued (None for CONTINUE).
    why: str | None = None


def judge(checkpoint: Checkpoint, *, topic_id: str, partition: int, log_start: int | None,
          end: PartitionEnd, earlier: PartitionEnd | None = None, now: float,
          retention: float | None) -> Judgement:
    """Whether ``checkpoint`` may be continued, given the partition as it is now.

    ``end`` is the broker's answer for the partition's end (an offset: the caller never passes
    a sentinel, see :func:`end_is_known`); ``earlier`` the answer before it in this replay, when
    the broker was asked again after an end below the checkpoint. Such an end is judged a
    truncation only when two answers a moment apart agree, from a leader epoch no older than the
    checkpoint's: anything else may be a deposed leader's answer, and :attr:`Verdict.CONFIRM`
    asks again. ``log_start`` None means the broker gave no valid log start (replay from 0).
    ``retention`` is the topic's ``delete.retention.ms`` in seconds (None: unknown, so no
    checkpoint is trusted).
    """
    if not end_is_known(end.offset):
        raise ValueError(f"end offset {end.offset} is not an offset; wait for the broker")
    if checkpoint.topic_id != topic_id:
        return Judgement(Verdict.RESTARTED, f"the ledger topic was recreated (topic id"
                         f" {checkpoint.topic_id} is now {topic_id})")
    if checkpoint.partition != partition:
        return Judgement(Verdict.REPLAY,
                         f"the role moved from partition {checkpoint.partition} to {partition}")
    if end.offset < checkpoint.offset:
        stale = (end.leader_epoch is not None and checkpoint.leader_epoch is not None
                 and end.leader_epoch < checkpoint.leader_epoch)
        if stale or earlier is None or earlier != end:
            return Judgement(Verdict.CONFIRM, (
                f"the partition ends at {end.offset} (leader epoch {end.leader_epoch}), below"
                f" the cached offset {checkpoint.offset} (leader epoch"
                f" {checkpoint.leader_epoch}), not yet confirmed"))
        return Judgement(Verdict.RESTARTED, (
            f"the partition ends at {end.offset}, below the cached offset {checkpoint.offset}"
            f" (truncated: confirmed twice by leader epoch {end.leader_epoch})"))
    if log_start is None or not end_is_known(log_start):
        return Judgement(Verdict.REPLAY, "the partition's log start offset is unknown")
    if log_start > checkpoint.offset:
        return Judgement(Verdict.REPLAY, f"records below offset {log_start} were deleted, past"
                         f" the cached offset {checkpoint.offset}")
    if retention is None:
        return Judgement(Verdict.REPLAY,
                         "the topic's delete.retention.ms is unknown (no DESCRIBE_CONFIGS)")
    age = now - checkpoint.read_at
    if age < 0:
        return Judgement(Verdict.REPLAY,
                         f"the checkpoint is {-age:.0f} s in the future (the clock went back)")
    if age >= RETENTION_SHARE * retention:
        return Judgement(Verdict.REPLAY, (
            f"the checkpoint is {age:.0f} s old; compaction may have removed tombstones"
            f" written since (delete.retention.ms {retention * 1000:.0f})"))
    return Judgement(Verdict.CONTINUE)


def refusal(checkpoint: Checkpoint, *, topic_id: str, partition: int, log_start: int,
            high: int, now: float, retention: float | None) -> str | None:
    """Why ``checkpoint`` may not be continued (None: it may), for a ``high`` watermark the
    caller knows to be settled (an end below the checkpoint counts as confirmed)."""
    end = PartitionEnd(high, checkpoint.leader_epoch)
    judgement = judge(checkpoint, topic_id=topic_id, partition=partition, log_start=log_start,
                      end=end, earlier=end, now=now, retention=retention)
    return judgement.why


class ReplayCache:
    """Checkpoints by (cluster, topic, role): in memory, and in files under ``directory``."""

    def __init__(self, directory: str | os.PathLike[str] | None) -> None:
        self.directory = None if directory is None else Path(directory)
        self._memory: dict[tuple[str, str, str], Checkpoint] = {}
        #: (mtime_ns, size) of each file as last read or written: an unchanged file is not
        #: parsed again.
        self._seen: dict[tuple[str, str, str], tuple[int, int]] = {}
        self._unwritable = False

    def path(self, cluster_id: str, topic: str, role: str) -> Path | None:
        """The file of ``role``'s checkpoint (None: memory only)."""
        if self.directory is None:
            return None
        digest = hashlib.sha256("\0".join((cluster_id, topic, role)).encode()).hexdigest()
        return self.directory / f"{digest[:32]}.json"

    def get(self, cluster_id: str, topic: str, role: str) -> Checkpoint | None:
        """The most advanced checkpoint of ``role``: this process's, or the host's file."""
        key = (cluster_id, topic, role)
        cached = self._memory.get(key)
        path = self.path(cluster_id, topic, role)
        if path is None:
            return cached
        stamp = _stamp(path)
        if stamp is None or (cached is not None and self._seen.get(key) == stamp):
            return cached
        loaded = _load(path, cluster_id, topic, role)
        self._seen[key] = stamp
        if loaded is not None and (cached is None or loaded.offset > cached.offset):
            self._memory[key] = loaded
            return loaded
        return cached

    def put(self, checkpoint: Checkpoint) -> None:
        """Remember ``checkpoint`` (in memory; written to the file when there is a directory)."""
        key = (checkpoint.cluster_id, checkpoint.topic, checkpoint.role)
        self._memory[key] = checkpoint
        path = self.path(*key)
        if path is not None and not self._unwritable:
            try:
                _store(path, checkpoint)
                stamp = _stamp(path)
                if stamp is not None:
                    self._seen[key] = stamp
            except OSError as exc:
                # The cache only saves time: without it every replay starts at offset 0.
                self._unwritable = True
                logger.warning("cannot write the ledger replay cache %s (%s): replays of this"
                               " process start at offset 0", path, exc)

    def forget(self, cluster_id: str, topic: str, role: str) -> None:
        """Drop ``role``'s checkpoint (memory and file)."""
        self._memory.pop((cluster_id, topic, role), None)
        self._seen.pop((cluster_id, topic, role), None)
        path = self.path(cluster_id, topic, role)
        if path is not None:
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                logger.debug("cannot remove %s: %s", path, exc)


def default_directory() -> Path:
    """``$XDG_CACHE_HOME/neli-orchestrate/ledger`` (``~/.cache/...`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "neli-orchestrate" / "ledger"


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return status.st_mtime_ns, status.st_size


def _store(path: Path, checkpoint: Checkpoint) -> None:
    state = checkpoint.state
    document = {
        "format": _FORMAT, "cluster_id": checkpoint.cluster_id, "topic": checkpoint.topic,
        "topic_id": checkpoint.topic_id, "partition": checkpoint.partition,
        "offset": checkpoint.offset, "read_at": checkpoint.read_at, "role": state.role,
        "leader_epoch": checkpoint.leader_epoch,
        "ignored": state.ignored, "max_token": state.max_token,
        "records": {k: v.decode("utf-8") for k, v in state.values.items()},
        "unreadable": {k: [o, why] for k, (o, why) in state.unreadable.items()},
        # each record's offset (what LedgerRecord.offset reports after a resumed replay)
        "offsets": {k: r.offset for k, r in state.records.items() if r.offset is not None},
    }
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Write a new file and rename it over the old one: a reader sees either file, whole.
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(document, f, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _load(path: Path, cluster_id: str, topic: str, role: str) -> Checkpoint | None:
    try:
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("ignoring the unreadable ledger replay cache %s: %s", path, exc)
        return None
    try:
        if (document["format"] != _FORMAT or document["cluster_id"] != cluster_id
                or document["topic"] != topic or document["role"] != role):
            return None
        records: dict[str, LedgerRecord] = {}
        values: dict[str, bytes] = {}
        offsets = document.get("offsets", {})  # absent in caches written before it
        for run_key, text in document["records"].items():
            value = text.encode("utf-8")
            record = _parse(value, (role, run_key))
            at = offsets.get(run_key)
            if at is not None:
                if type(at) is not int or at < 0:
                    raise ValueError("record offsets must be non-negative integers")
                object.__setattr__(record, "offset", at)
            records[run_key] = record
            values[run_key] = value
        unreadable = {k: (int(o), str(why)) for k, (o, why) in document["unreadable"].items()}
        offset, partition = document["offset"], document["partition"]
        ignored, max_token = document["ignored"], document["max_token"]
        read_at = float(document["read_at"])
        if not all(type(n) is int and n >= -1 for n in (offset, partition, ignored, max_token)):
            raise ValueError("offsets and counts must be integers")
        state = FoldState(role, MappingProxyType(records), MappingProxyType(values),
                          MappingProxyType(unreadable), ignored, max_token)
        epoch = document.get("leader_epoch")
        if epoch is not None and type(epoch) is not int:
            raise ValueError("leader_epoch must be an integer or null")
        return Checkpoint(cluster_id, topic, str(document["topic_id"]), partition, offset,
                          read_at, state, epoch)
    except (KeyError, TypeError, ValueError, AttributeError, MalformedRecordError) as exc:
        logger.warning("ignoring the malformed ledger replay cache %s: %s", path, exc)
        return None

