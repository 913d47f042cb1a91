"""An in-memory stand-in for the Kafka seam: the test plays the group coordinator.

The fake consumer serves queued "ops" (assignments, revocations, losses, commit results,
faults) at the start of each poll, like librdkafka serves its queue, then returns at most one
record from an assigned partition; an idle poll advances the fake clock by its timeout, so a
pulse with a timeout takes no real time.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from neli_orchestrate.core.clock import FakeClock
from neli_orchestrate.core.heartbeat import Heartbeat
from neli_orchestrate.core.kafka import (
    OFFSET_END,
    ConsumerFault,
    DeliveryCallback,
    PollResult,
    RebalanceListener,
    Record,
)
from neli_orchestrate.errors import AuthorizationError, KafkaUnavailableError


@dataclass
class FakeCluster:
    """One leader topic and one group, fully controlled by the test."""

    clock: FakeClock
    partitions: int = 1
    topic_exists: bool = True
    log_append_time: bool = False
    topic_settings: dict[str, str] = field(default_factory=dict)
    unreachable: bool = False
    deny_create: bool = False
    group_settings: dict[str, str] | None = None
    broker_settings: dict[str, str] | None = None  # None: not readable (old broker, no ACL)
    deny_group_alter: bool = False
    group_stale_reads: int = 0           # describes that still show the old group settings
    topic_invisible_reads: int = 0       # metadata reads that miss a just-created topic
    # behaviour knobs
    commit_error: str | None = None      # every commit result carries this error
    produce_blocked: bool = False        # heartbeats are not written (partitioned from the leader)
    logs: dict[int, list[Record]] = field(default_factory=dict)
    committed: dict[int, int] = field(default_factory=dict)
    created: list[tuple[str, int, dict[str, str]]] = field(default_factory=list)
    altered_groups: list[dict[str, str]] = field(default_factory=list)
    consumers: list[FakeConsumer] = field(default_factory=list)
    producers: list[FakeProducer] = field(default_factory=list)
    watchers: list[FakeWatcher] = field(default_factory=list)

    def __post_init__(self) -> None:
        for p in range(self.partitions):
            self.logs.setdefault(p, [])

    def append(self, partition: int, key: bytes | None, value: bytes | None,
               timestamp_ms: int | None = None) -> int:
        """Write a record as the broker would; return its offset."""
        log = self.logs[partition]
        offset = len(log)
        if timestamp_ms is None and self.log_append_time:
            timestamp_ms = int(self.clock.time() * 1000)
        log.append(Record(partition=partition, offset=offset, key=key, value=value,
                          timestamp_ms=timestamp_ms, log_append_time=self.log_append_time))
        return offset

    def append_foreign_heartbeat(self, partition: int, member: str, seq: int = 1) -> int:
        beat = Heartbeat(member=member, seq=seq, sent_at=self.clock.monotonic(),
                         sent_wall=self.clock.time())
        key, value = beat.encode()
        return self.append(partition, key, value)

    @property
    def consumer(self) -> FakeConsumer:
        return self.consumers[-1]

    @property
    def producer(self) -> FakeProducer:
        return self.producers[-1]


class FakeAdmin:
    def __init__(self, cluster: FakeCluster, settings: Mapping[str, Any]) -> None:
        self.cluster = cluster
        self.settings = dict(settings)

    def _check(self) -> None:
        if self.cluster.unreachable:
            raise KafkaUnavailableError("cannot reach Kafka at fake:0 (test)")

    def partition_count(self, topic: str, timeout: float) -> int | None:
        self._check()
        if self.cluster.topic_exists and self.cluster.topic_invisible_reads > 0:
            self.cluster.topic_invisible_reads -= 1
            return None
        return self.cluster.partitions if self.cluster.topic_exists else None

    def create_topic(self, topic: str, partitions: int, config: Mapping[str, str],
                     timeout: float) -> None:
        self._check()
        if self.cluster.deny_create:
            raise AuthorizationError(
                f"creating leader topic {topic!r} was denied: TOPIC_AUTHORIZATION_FAILED")
        self.cluster.created.append((topic, partitions, dict(config)))
        self.cluster.topic_exists = True
        self.cluster.partitions = partitions
        self.cluster.topic_settings.update(config)
        for p in range(partitions):
            self.cluster.logs.setdefault(p, [])

    def topic_config(self, topic: str, timeout: float) -> Mapping[str, str] | None:
        return dict(self.cluster.topic_settings)

    def alter_group_config(self, group_id: str, settings: Mapping[str, str],
                           timeout: float) -> None:
        if self.cluster.deny_group_alter:
            # not an ACL (that is AuthorizationError): e.g. a broker without group configs
            raise KafkaUnavailableError("UNSUPPORTED_VERSION (test)")
        self.cluster.altered_groups.append(dict(settings))
        self._old_group_settings = dict(self.cluster.group_settings or {})
        self.cluster.group_settings = {**(self.cluster.group_settings or {}), **settings}

    def broker_config(self, topic: str, timeout: float) -> Mapping[str, str] | None:
        return self.cluster.broker_settings

    def group_config(self, group_id: str, timeout: float) -> Mapping[str, str] | None:
        if self.cluster.group_stale_reads > 0:
            self.cluster.group_stale_reads -= 1
            return getattr(self, "_old_group_settings", self.cluster.group_settings)
        return self.cluster.group_settings

    def close(self) -> None:
        pass


class FakeConsumer:
    def __init__(self, cluster: FakeCluster, settings: Mapping[str, Any], topic: str) -> None:
        self.cluster = cluster
        self.settings = dict(settings)
        self.topic = topic
        self.listener: RebalanceListener | None = None
        self.positions: dict[int, int] = {}
        self.ops: collections.deque[tuple[str, Any]] = collections.deque()
        self.commits: list[dict[int, int]] = []
        self.polls = 0
        self.closed = False
        self.rejoins = 0
        self.trace: list[str] = []   # "assign:0", "unassign:0", ... in the order they happened

    # -- test controls (the test is the group coordinator) ------------------------------------

    def assign(self, *partitions: int) -> None:
        self.ops.append(("assign", list(partitions)))

    def revoke(self, *partitions: int) -> None:
        self.ops.append(("revoke", list(partitions)))

    def lose(self, *partitions: int) -> None:
        self.ops.append(("lost", list(partitions)))

    def fault(self, code: str, fatal: bool = False) -> None:
        self.ops.append(("fault", ConsumerFault(code=code, message=f"{code} (test)", fatal=fatal)))

    # -- the seam -------------------------------------------------------------------------------

    def subscribe(self, listener: RebalanceListener) -> None:
        self.listener = listener

    def _serve(self) -> ConsumerFault | None:
        assert self.listener is not None
        while self.ops:
            kind, arg = self.ops.popleft()
            if kind == "assign":
                starts = self.listener.on_assign(arg)
                for p in arg:
                    start = starts.get(p, OFFSET_END)
                    if start < 0:
                        start = self.cluster.committed.get(p, len(self.cluster.logs[p])) \
                            if start != OFFSET_END else len(self.cluster.logs[p])
                    self.positions[p] = start
                    self.trace.append(f"assign:{p}@{start}")
            elif kind == "revoke":
                owned = [p for p in arg if p in self.positions]
                self.listener.on_revoke(owned)
                for p in owned:
                    del self.positions[p]
                    self.trace.append(f"unassign:{p}")
            elif kind == "lost":
                owned = [p for p in arg if p in self.positions]
                self.listener.on_lost(owned)
                for p in owned:
                    del self.positions[p]
                    self.trace.append(f"lost:{p}")
            elif kind == "commit":
                offsets, error = arg
                if error is None:
                    self.cluster.committed.update(offsets)
                self.listener.on_commit(offsets, error)
            elif kind == "fault":
                return arg  # type: ignore[no-any-return]
        return None

    def poll(self, timeout: float) -> PollResult:
        if self.closed:
            raise RuntimeError("poll on a closed consumer")
        self.polls += 1
        fault = self._serve()
        if fault is not None:
            return fault
        for p in sorted(self.positions):
            pos = self.positions[p]
            log = self.cluster.logs[p]
            if pos < len(log):
                self.positions[p] = pos + 1
                return log[pos]
        self.cluster.clock.advance(timeout)
        return None

    def rejoin(self) -> None:
        self.rejoins += 1
        self.trace.append("rejoin")

    def commit(self, offsets: Mapping[int, int]) -> None:
        self.commits.append(dict(offsets))
        self.ops.append(("commit", (dict(offsets), self.cluster.commit_error)))

    def close(self) -> None:
        assert self.listener is not None
        owned = sorted(self.positions)
        if owned:
            self.listener.on_revoke(owned)
            for p in owned:
                self.trace.append(f"unassign:{p}")
        self.positions.clear()
        self.trace.append("left-group")
        self.closed = True


class FakeWatcher:
    """Reads watched partitions of the fake log from their end (no group)."""

    def __init__(self, cluster: FakeCluster, settings: Mapping[str, Any], topic: str) -> None:
        self.cluster = cluster
        self.settings = dict(settings)
        self.positions: dict[int, int] = {}
        self.history: list[list[int]] = []
        self.closed = False

    def watch(self, partitions: Sequence[int]) -> None:
        self.history.append(list(partitions))
        self.positions = {p: len(self.cluster.logs[p]) for p in partitions}

    def poll(self, timeout: float) -> PollResult:
        for p in sorted(self.positions):
            pos = self.positions[p]
            log = self.cluster.logs[p]
            if pos < len(log):
                self.positions[p] = pos + 1
                return log[pos]
        self.cluster.clock.advance(timeout)
        return None

    def close(self) -> None:
        self.closed = True


class FakeProducer:
    def __init__(self, cluster: FakeCluster, settings: Mapping[str, Any], topic: str) -> None:
        self.cluster = cluster
        self.settings = dict(settings)
        self.topic = topic
        self.reports: collections.deque[tuple[DeliveryCallback, int | None, str | None]] = \
            collections.deque()
        self.sent: list[tuple[int, bytes, bytes]] = []
        self.closed = False

    def send(self, partition: int, key: bytes, value: bytes,
             on_delivery: DeliveryCallback | None = None) -> None:
        self.sent.append((partition, key, value))
        if self.cluster.produce_blocked:
            if on_delivery is not None:
                self.reports.append((on_delivery, None, "_MSG_TIMED_OUT"))
            return
        offset = self.cluster.append(partition, key, value)
        if on_delivery is not None:
            self.reports.append((on_delivery, offset, None))

    def poll(self, timeout: float) -> None:
        while self.reports:
            callback, offset, error = self.reports.popleft()
            callback(offset, error)

    def flush(self, timeout: float) -> int:
        self.poll(0)
        return 0

    def close(self) -> None:
        self.closed = True


class FakeClients:
    """A :class:`~neli_orchestrate.core.kafka.KafkaClients` over a :class:`FakeCluster`."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.admin_settings: dict[str, Any] = {}

    def admin(self, settings: Mapping[str, Any]) -> FakeAdmin:
        self.admin_settings = dict(settings)
        return FakeAdmin(self.cluster, settings)

    def consumer(self, settings: Mapping[str, Any], topic: str) -> FakeConsumer:
        consumer = FakeConsumer(self.cluster, settings, topic)
        self.cluster.consumers.append(consumer)
        return consumer

    def producer(self, settings: Mapping[str, Any], topic: str) -> FakeProducer:
        producer = FakeProducer(self.cluster, settings, topic)
        self.cluster.producers.append(producer)
        return producer

    def watcher(self, settings: Mapping[str, Any], topic: str) -> FakeWatcher:
        watcher = FakeWatcher(self.cluster, settings, topic)
        self.cluster.watchers.append(watcher)
        return watcher


def kinds(events: Sequence[object]) -> list[str]:
    """Event class names, for compact assertions."""
    return [type(e).__name__ for e in events]
