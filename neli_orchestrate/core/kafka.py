"""The narrow seam between the NELI protocol and Kafka: what the protocol needs of a client.

The protocol talks to Kafka only through the small :class:`typing.Protocol` classes here:
a :class:`GroupConsumer` (subscribe, poll, commit, rejoin, close), a :class:`HeartbeatProducer`
(send, poll, flush), a :class:`LeaderTopicWatcher` (reads partitions outside the group, for
release hints) and a :class:`LeaderTopicAdmin` (topic and group settings, and read-only
looks at consumer groups: list, describe, committed offsets). Tests inject fakes through
:class:`KafkaClients`; production uses
:class:`~neli_orchestrate.core.confluent.ConfluentKafka`, the confluent-kafka implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "CommittedOffset",
    "ConsumerFault",
    "DeliveryCallback",
    "GroupConsumer",
    "GroupDescription",
    "GroupMember",
    "HeartbeatProducer",
    "KafkaClients",
    "LeaderTopicAdmin",
    "LeaderTopicWatcher",
    "MAX_POLL_EXCEEDED",
    "OFFSET_END",
    "OFFSET_STORED",
    "PollResult",
    "RebalanceListener",
    "Record",
    "authorization_denied",
]

OFFSET_END = -1
"""Start offset meaning "the end of the partition": read only what is written from now on."""
OFFSET_STORED = -1000
"""Start offset meaning "the group's committed offset"."""

# Consumer errors that mean "this member no longer owns its partitions".
MAX_POLL_EXCEEDED = "_MAX_POLL_EXCEEDED"


@dataclass(frozen=True)
class Record:
    """A record read from the leader topic."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None
    log_append_time: bool
    """True if ``timestamp_ms`` was set by the broker when it appended the record."""


@dataclass(frozen=True)
class ConsumerFault:
    """An error the consumer reported from ``poll`` (a Kafka error code name and its text)."""

    code: str
    message: str
    fatal: bool = False


PollResult = Record | ConsumerFault | None
DeliveryCallback = Callable[[int | None, str | None], None]
"""Called with (offset, None) once a heartbeat is written, or (None, error) if it was not."""


class RebalanceListener(Protocol):
    """What the consumer tells the protocol, always on the thread that calls ``poll``/``close``."""

    def on_assign(self, partitions: Sequence[int]) -> Mapping[int, int]:
        """Partitions were assigned; return the offset to start each at (or OFFSET_END)."""
        ...

    def on_revoke(self, partitions: Sequence[int]) -> None:
        """Partitions are being revoked; the successor waits until this returns."""
        ...

    def on_lost(self, partitions: Sequence[int]) -> None:
        """Partitions were lost (session or max-poll expiry); another member may own them."""
        ...

    def on_commit(self, offsets: Mapping[int, int], error: str | None) -> None:
        """An offset commit finished; ``error`` is None if the group coordinator accepted it."""
        ...


class GroupConsumer(Protocol):
    """A member of the leader topic's consumer group."""

    def subscribe(self, listener: RebalanceListener) -> None:
        """Join the group on the leader topic; rebalance events go to ``listener``."""
        ...

    def poll(self, timeout: float) -> PollResult:
        """Serve callbacks and return one record, a fault, or None after ``timeout`` seconds."""
        ...

    def commit(self, offsets: Mapping[int, int]) -> None:
        """Commit ``{partition: offset}`` asynchronously; the result reaches ``on_commit``."""
        ...

    def rejoin(self) -> None:
        """Ask the group coordinator for this member's assignment now, not at the next heartbeat.

        A nudge only: whatever the coordinator answers arrives through the listener as usual.
        Called on the polling thread, never from inside a listener callback.
        """
        ...

    def close(self) -> None:
        """Revoke (``on_revoke``), leave the group at once and release resources."""
        ...


class LeaderTopicWatcher(Protocol):
    """Reads chosen leader-topic partitions from their end, outside the group (no membership).

    Followers use it to see release hints on the partitions of their roles as soon as they are
    written (a long-poll fetch: the broker answers when a record arrives).
    """

    def watch(self, partitions: Sequence[int]) -> None:
        """Read exactly these partitions from now on (from their end); [] stops reading."""
        ...

    def poll(self, timeout: float) -> PollResult:
        """Return one record, a fault, or None after ``timeout`` seconds."""
        ...

    def close(self) -> None: ...


class HeartbeatProducer(Protocol):
    """Writes heartbeats to chosen partitions of the leader topic."""

    def send(self, partition: int, key: bytes, value: bytes,
             on_delivery: DeliveryCallback | None = None) -> None:
        """Queue one record for ``partition``; ``on_delivery`` runs from ``poll``/``flush``."""
        ...

    def poll(self, timeout: float) -> None:
        """Serve delivery callbacks."""
        ...

    def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` for queued records; return how many are still queued."""
        ...

    def close(self) -> None:
        """Drop queued heartbeats (they are worthless once the member stops) and release."""
        ...


@dataclass(frozen=True)
class GroupMember:
    """A member of a consumer group, as the group coordinator describes it."""

    member_id: str
    client_id: str


@dataclass(frozen=True)
class GroupDescription:
    """A consumer group as its coordinator describes it (read-only: nobody joins)."""

    group_id: str
    state: str
    """Kafka's name of the group state: ``EMPTY``, ``STABLE``, ``DEAD`` (no such group, on
    some brokers), ..."""
    members: tuple[GroupMember, ...]


@dataclass(frozen=True)
class CommittedOffset:
    """An offset a consumer group committed, with the metadata string it committed."""

    topic: str
    partition: int
    offset: int
    metadata: str | None


class LeaderTopicAdmin(Protocol):
    """The administrative calls a member makes once, at start-up, and read-only looks at
    consumer groups."""

    def partition_count(self, topic: str, timeout: float) -> int | None:
        """Return the topic's partition count, None if it does not exist.

        Raises KafkaUnavailableError if the cluster cannot be reached or refuses to describe it.
        """
        ...

    def create_topic(self, topic: str, partitions: int, config: Mapping[str, str],
                     timeout: float) -> None:
        """Create the topic; an existing topic is not an error. Raises KafkaUnavailableError."""
        ...

    def topic_config(self, topic: str, timeout: float) -> Mapping[str, str] | None:
        """Return the topic's settings, or None if this client may not read them."""
        ...

    def alter_group_config(self, group_id: str, settings: Mapping[str, str],
                           timeout: float) -> None:
        """Set dynamic group settings (KIP-848 groups). Raises KafkaUnavailableError."""
        ...

    def broker_config(self, topic: str, timeout: float) -> Mapping[str, str] | None:
        """The settings of a broker of the cluster (group protocol and limits), or None if they
        cannot be read (not allowed, or an old broker)."""
        ...

    def group_config(self, group_id: str, timeout: float) -> Mapping[str, str] | None:
        """Return the group's dynamic settings, or None if they cannot be read."""
        ...

    # Read-only looks at consumer groups (nobody joins): a Singleton's busy-group rule, the
    # liveness reader.

    def list_groups(self, timeout: float) -> list[str]:
        """The ids of every consumer group the cluster knows. Raises KafkaUnavailableError."""
        ...

    def describe_group(self, group_id: str, timeout: float) -> GroupDescription | None:
        """The group as its coordinator sees it now, None if there is no such group. Raises
        AuthorizationError or KafkaUnavailableError."""
        ...

    def group_offsets(self, group_id: str, timeout: float) -> list[CommittedOffset]:
        """The offsets the group has committed (with their metadata). Raises
        KafkaUnavailableError."""
        ...

    def close(self) -> None: ...


class KafkaClients(Protocol):
    """Factory of the three clients a member uses; inject a fake one in tests."""

    def admin(self, settings: Mapping[str, Any]) -> LeaderTopicAdmin: ...

    def consumer(self, settings: Mapping[str, Any], topic: str) -> GroupConsumer: ...

    def producer(self, settings: Mapping[str, Any], topic: str) -> HeartbeatProducer: ...

    def watcher(self, settings: Mapping[str, Any], topic: str) -> LeaderTopicWatcher: ...


# -- denied ACLs ---------------------------------------------------------------------------------

def authorization_denied(code: str, message: str = "") -> bool:
    """True if a client error (code name, text) means the broker denied an ACL.

    Waiting never fixes that, so callers raise :class:`AuthorizationError` at once instead of
    treating it as "Kafka unavailable". librdkafka reports a consumer group it may not join as
    a fatal error (code ``_FATAL``) whose text names the cause.
    """
    return code.endswith("_AUTHORIZATION_FAILED") or (
        code == "_FATAL" and "authorization failed" in message.lower())

