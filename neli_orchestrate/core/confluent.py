"""The confluent-kafka (librdkafka) implementation of the Kafka seam, and its clients' settings.

:class:`ConfluentKafka` makes the clients the protocol talks to through
:mod:`neli_orchestrate.core.kafka`; the ``*_settings`` functions turn a resolved
:class:`~neli_orchestrate.core.config.NeliConfig` into each client's librdkafka settings.
:func:`new_admin`, :func:`new_consumer` and :func:`new_producer` are the package's only
constructors of confluent-kafka clients (the ledger, the liveness announcer and the read model
use them for the raw clients they need); they take only settings from the one builder,
:func:`~neli_orchestrate.core.client_settings.client_settings`. tests/test_kafka_clients.py
fails if another module constructs a client.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from neli_orchestrate.core.client_settings import KafkaSettings, client_settings
from neli_orchestrate.core.kafka import (
    CommittedOffset,
    ConsumerFault,
    DeliveryCallback,
    GroupConsumer,
    GroupDescription,
    GroupMember,
    HeartbeatProducer,
    LeaderTopicAdmin,
    LeaderTopicWatcher,
    PollResult,
    RebalanceListener,
    Record,
    authorization_denied,
)
from neli_orchestrate.errors import (
    AuthorizationError,
    KafkaUnavailableError,
    NeliError,
    PermanentKafkaError,
    SessionTimeoutRejectedError,
)

if TYPE_CHECKING:
    from neli_orchestrate.core.config import ResolvedConfig

__all__ = [
    "ConfluentKafka",
    "as_seam_admin",
    "LoginRefusal",
    "RECONNECT_BACKOFF_MS",
    "admin_settings",
    "consumer_settings",
    "is_authorization_error",
    "new_admin",
    "new_consumer",
    "new_producer",
    "producer_settings",
    "watcher_settings",
]

log = logging.getLogger(__name__)
librdkafka_log = logging.getLogger("neli_orchestrate.core.librdkafka")


def is_authorization_error(error: object) -> bool:
    """:func:`authorization_denied` for a ``KafkaException`` or ``KafkaError`` object."""
    if isinstance(error, BaseException):
        args = getattr(error, "args", ())
        error = args[0] if args else None
    if error is None or not hasattr(error, "name"):
        return False
    return authorization_denied(_error_name(error), str(getattr(error, "str", str)()))


class LoginRefusal:
    """An ``error_cb`` that remembers a refused SASL login.

    librdkafka reports bad credentials only through the error callback; the request that
    failed meanwhile says no more than ``_TRANSPORT`` or ``_TIMED_OUT``.
    """

    def __init__(self) -> None:
        self.reason: str | None = None

    def __call__(self, err: Any) -> None:
        if _error_name(err) in ("_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED"):
            self.reason = str(err.str())

    def error(self, client: Any, what: str, servers: object) -> PermanentKafkaError | None:
        """The error to raise for a failed request, if the login was refused (serves ``client``'s
        callbacks first); None otherwise."""
        with contextlib.suppress(Exception):
            client.poll(0)
        if self.reason is None:
            return None
        return PermanentKafkaError(
            f"{what} failed: the cluster at {servers!r} refused this client's credentials "
            f"({self.reason}); check sasl.username, sasl.password, sasl.mechanism and "
            f"security.protocol")


# -- librdkafka settings -------------------------------------------------------------------------

def _ms(seconds: float) -> int:
    return max(1, int(round(seconds * 1000)))


def member_client_defaults(r: ResolvedConfig) -> dict[str, Any]:
    """What every client of a member has unless its ``kafka_config`` says otherwise; also the
    Singleton's busy-check client, over which members run their start-up checks."""
    return {
        "client.id": f"neli-{r.name}",
        # heartbeats are tiny and latency-bound; Nagle's algorithm would delay them
        "socket.nagle.disable": True,
        "reconnect.backoff.ms": RECONNECT_BACKOFF_MS,
    }


def _settings(r: ResolvedConfig, *, required: Mapping[str, Any],
              call: Mapping[str, Any] | None = None) -> KafkaSettings:
    """A member client's settings through the one builder; the reasons for refusing a required
    key are NeliConfig's (PROTECTED_KAFKA_SETTINGS, which NeliConfig also checks up front)."""
    from neli_orchestrate.core.config import PROTECTED_KAFKA_SETTINGS

    return client_settings(
        r.bootstrap_servers, logger=librdkafka_log, required=required, call=call,
        user=r.kafka_config, why=PROTECTED_KAFKA_SETTINGS, defaults=member_client_defaults(r))


def consumer_settings(r: ResolvedConfig) -> KafkaSettings:
    """The consumer's librdkafka settings for a resolved config (group protocol chosen)."""
    if r.group_protocol not in ("classic", "consumer"):
        raise ValueError("choose the group protocol first (topic.resolve_protocol)")
    required: dict[str, Any] = {
        "group.id": r.group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "latest",
        "enable.partition.eof": False,
        "fetch.wait.max.ms": _ms(r.fetch_wait_max),
        "max.poll.interval.ms": _ms(r.max_poll_interval),
    }
    if r.group_protocol == "classic":
        required.update({
            "group.protocol": "classic",
            "partition.assignment.strategy": r.assignor or "cooperative-sticky",
            "session.timeout.ms": _ms(r.session_timeout),
            "heartbeat.interval.ms": _ms(r.group_heartbeat_interval),
            # librdkafka sends a classic-group heartbeat only when its main thread wakes up
            # (timers or requests), in practice every 0.5-1 s for an idle follower: too late
            # for short sessions. The auto-commit timer wakes it every half heartbeat interval,
            # so heartbeats go out at most that late; with enable.auto.offset.store=false
            # nothing is ever stored, so the timer commits nothing (librdkafka skips empty
            # auto-commits silently). Hand-overs do not depend on it (release hints); a
            # shorter timer only burns CPU in every waiting member.
            "enable.auto.commit": True,
            "auto.commit.interval.ms": _ms(r.group_heartbeat_interval / 2),
        })
    else:
        # KIP-848: session and heartbeat are group settings on the broker (see topic.py)
        required["group.protocol"] = "consumer"
        if r.assignor is not None:
            required["group.remote.assignor"] = r.assignor
    return _settings(r, required=required)


def producer_settings(r: ResolvedConfig) -> KafkaSettings:
    """The heartbeat producer's librdkafka settings for a resolved config."""
    return _settings(r, required={
        "acks": "all",
        "linger.ms": 0,
        "enable.idempotence": False,
        # a heartbeat older than the lease proves nothing: give up on it then
        "message.timeout.ms": _ms(r.heartbeat_timeout),
    }, call={"request.timeout.ms": _ms(max(r.heartbeat_timeout, 0.1))})


def watcher_settings(r: ResolvedConfig) -> KafkaSettings:
    """The hint watcher's librdkafka settings: a group-less consumer that long-polls."""
    return _settings(r, required={
        # librdkafka wants a group id even for assign(); this one never joins or commits
        "group.id": f"{r.group_id}.watch",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "latest",
        "enable.partition.eof": False,
        # the broker holds the fetch until a record arrives: the wait costs nothing in
        # latency, a long one saves wake-ups of an idle follower
        "fetch.wait.max.ms": 1000,
    }, call={"client.id": f"neli-{r.name}-watch"})


# librdkafka drops its bootstrap connection once the first metadata response names the
# cluster's brokers; a request caught in flight on it is retried on a new connection, which
# librdkafka opens no sooner than reconnect.backoff.ms / 2 (at least 11 ms) after the client's
# first one: 50 ms with the default 100 ms, on most member starts (seen in librdkafka's debug
# log, "Not selecting any broker for cluster connection: still suppressed for 48ms"). Every
# client of a member pays it once, on its first requests: the admin's checks, and the group
# consumer's join and first fetch (a gate's whole decision waits for those). For a long-lived
# client the setting only moves the first retry after a disconnect: librdkafka still doubles
# the backoff on every failed attempt up to reconnect.backoff.max.ms (10 s), so a broker
# outage sees about three more connection attempts per client than with the default.
RECONNECT_BACKOFF_MS = 10


def admin_settings(r: ResolvedConfig) -> KafkaSettings:
    """The admin client's librdkafka settings for a resolved config (start-up checks only)."""
    return _settings(r, required={})


# -- the only constructors of confluent-kafka clients ------------------------------------------

def _checked(settings: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(settings, KafkaSettings):
        raise TypeError("a Kafka client takes settings from core.client_settings."
                        "client_settings (one builder, one precedence), not a hand-made dict")
    return dict(settings)


def new_admin(settings: KafkaSettings) -> Any:
    """A confluent-kafka ``AdminClient`` (settings from :func:`client_settings` only)."""
    from confluent_kafka.admin import AdminClient

    return AdminClient(_checked(settings))


def new_consumer(settings: KafkaSettings) -> Any:
    """A confluent-kafka ``Consumer`` (settings from :func:`client_settings` only)."""
    from confluent_kafka import Consumer

    return Consumer(_checked(settings))


def new_producer(settings: KafkaSettings) -> Any:
    """A confluent-kafka ``Producer`` (settings from :func:`client_settings` only)."""
    from confluent_kafka import Producer

    return Producer(_checked(settings))


# -- confluent-kafka implementation --------------------------------------------------------------

def _error_name(err: Any) -> str:
    try:
        return str(err.name())
    except Exception:  # noqa: BLE001 - any object describing an error will do
        return str(err)


def _code(exc: BaseException) -> str:
    """The Kafka error name inside a KafkaException ("" if there is none)."""
    args = getattr(exc, "args", ())
    return _error_name(args[0]) if args and hasattr(args[0], "name") else ""


def _poll(consumer: Any, timeout: float, *, fatal_code: bool, timestamps: bool) -> PollResult:
    """Poll a confluent-kafka ``Consumer`` once: None, a ConsumerFault or a Record.

    ``fatal_code``: a fault whose code is ``_FATAL`` is fatal even if librdkafka's flag says
    otherwise (the group consumer). ``timestamps``: the record carries its timestamp and
    whether the broker set it (Full NELI dates evidence by it); the hint watcher needs neither.
    """
    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, TIMESTAMP_NOT_AVAILABLE

    msg = consumer.poll(timeout)
    if msg is None:
        return None
    err = msg.error()
    if err is not None:
        code = _error_name(err)
        return ConsumerFault(code=code, message=str(err.str()),
                             fatal=bool(err.fatal()) or (fatal_code and code == "_FATAL"))
    ts_type, ts = msg.timestamp() if timestamps else (TIMESTAMP_NOT_AVAILABLE, None)
    return Record(
        partition=msg.partition(), offset=msg.offset(), key=msg.key(), value=msg.value(),
        timestamp_ms=ts if ts_type else None,
        log_append_time=ts_type == TIMESTAMP_LOG_APPEND_TIME,
    )


class _ConfluentConsumer:
    def __init__(self, settings: Mapping[str, Any], topic: str) -> None:
        self._topic = topic
        self._listener: RebalanceListener | None = None
        self._classic = settings.get("group.protocol", "classic") == "classic"
        conf = KafkaSettings(_checked(settings))
        conf["on_commit"] = self._on_commit
        self._consumer = new_consumer(conf)

    def subscribe(self, listener: RebalanceListener) -> None:
        self._listener = listener
        self._subscribe([self._topic])

    def _subscribe(self, topics: list[str]) -> None:
        self._consumer.subscribe(topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                                 on_lost=self._on_lost)

    def rejoin(self) -> None:
        if self._classic:
            # Never touch a classic group's subscription to hurry it: changing it while a join
            # is in flight aborts librdkafka (rd_kafka_cgrp_modify_subscription assertion).
            return
        # KIP-848: a subscribe call makes librdkafka send its next heartbeat at once
        self._subscribe([self._topic])

    def _tps(self, partitions: Sequence[int], starts: Mapping[int, int] | None = None) -> list[Any]:
        from confluent_kafka import OFFSET_INVALID, TopicPartition

        starts = starts or {}
        return [TopicPartition(self._topic, p, starts.get(p, OFFSET_INVALID)) for p in partitions]

    def _on_assign(self, consumer: Any, tps: list[Any]) -> None:
        assert self._listener is not None
        partitions = [tp.partition for tp in tps if tp.topic == self._topic]
        starts = self._listener.on_assign(partitions)
        # cooperative-sticky and KIP-848 are incremental: add to, never replace, the assignment
        consumer.incremental_assign(self._tps(partitions, starts))

    def _on_revoke(self, consumer: Any, tps: list[Any]) -> None:
        assert self._listener is not None
        partitions = [tp.partition for tp in tps if tp.topic == self._topic]
        try:
            self._listener.on_revoke(partitions)
        finally:
            consumer.incremental_unassign(self._tps(partitions))

    def _on_lost(self, consumer: Any, tps: list[Any]) -> None:
        assert self._listener is not None
        partitions = [tp.partition for tp in tps if tp.topic == self._topic]
        try:
            self._listener.on_lost(partitions)
        finally:
            consumer.incremental_unassign(self._tps(partitions))

    def _on_commit(self, err: Any, tps: list[Any]) -> None:
        if self._listener is None:
            return
        offsets = {tp.partition: tp.offset for tp in tps}
        error = _error_name(err) if err is not None else None
        if error is None:
            for tp in tps:
                if tp.error is not None:
                    error = _error_name(tp.error)
                    break
        self._listener.on_commit(offsets, error)

    def poll(self, timeout: float) -> PollResult:
        return _poll(self._consumer, timeout, fatal_code=True, timestamps=True)

    def commit(self, offsets: Mapping[int, int]) -> None:
        from confluent_kafka import TopicPartition

        tps = [TopicPartition(self._topic, p, o) for p, o in offsets.items()]
        self._consumer.commit(offsets=tps, asynchronous=True)

    def close(self) -> None:
        self._consumer.close()


class _ConfluentWatcher:
    def __init__(self, settings: Mapping[str, Any], topic: str) -> None:
        self._topic = topic
        self._consumer = new_consumer(KafkaSettings(_checked(settings)))

    def watch(self, partitions: Sequence[int]) -> None:
        from confluent_kafka import OFFSET_END as END
        from confluent_kafka import TopicPartition

        self._consumer.assign([TopicPartition(self._topic, p, END) for p in partitions])

    def poll(self, timeout: float) -> PollResult:
        return _poll(self._consumer, timeout, fatal_code=False, timestamps=False)

    def close(self) -> None:
        self._consumer.close()


class _ConfluentProducer:
    def __init__(self, settings: Mapping[str, Any], topic: str) -> None:
        self._topic = topic
        self._producer = new_producer(KafkaSettings(_checked(settings)))

    def send(self, partition: int, key: bytes, value: bytes,
             on_delivery: DeliveryCallback | None = None) -> None:
        from confluent_kafka import KafkaException

        def delivered(err: Any, msg: Any) -> None:
            if on_delivery is None:
                return
            if err is not None:
                on_delivery(None, _error_name(err))
            else:
                on_delivery(msg.offset(), None)

        try:
            self._producer.produce(self._topic, value=value, key=key, partition=partition,
                                   on_delivery=delivered)
        except BufferError:
            # the local queue is full: the broker has been unreachable for a while; the lease
            # will lapse on its own, a lost heartbeat changes nothing
            if on_delivery is not None:
                on_delivery(None, "_QUEUE_FULL")
        except KafkaException as exc:
            # refused before sending, e.g. TOPIC_AUTHORIZATION_FAILED from cached metadata
            if on_delivery is None:
                raise
            on_delivery(None, _error_name(exc.args[0]) if exc.args else repr(exc))

    def poll(self, timeout: float) -> None:
        self._producer.poll(timeout)

    def flush(self, timeout: float) -> int:
        return int(self._producer.flush(timeout))

    def close(self) -> None:
        try:
            self._producer.purge(in_queue=True, in_flight=True, blocking=False)
            self._producer.flush(0)
        except Exception:  # noqa: BLE001 - closing must not fail
            log.debug("purging heartbeats on close failed", exc_info=True)


#: librdkafka's own deadline for a request to a group's coordinator (its maximum, an hour): far
#: beyond any caller's wait, so that librdkafka never times such a request out (_ConfluentAdmin).
COORDINATOR_REQUEST_TIMEOUT = 3600.0

#: Answers that mean the client's cached coordinator of the group is no longer its coordinator.
_STALE_COORDINATOR = frozenset({"NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE"})


class _ConfluentAdmin:
    """The seam's admin over one confluent-kafka ``AdminClient``.

    Requests to a group's coordinator (describing a group, reading its offsets) work around
    two defects of librdkafka's admin client (2.16), both seen in the region-loss chaos
    scenario (docs/internals/chaos.md):

    - **The abort** (confluentinc/librdkafka#4605, #3663). When an admin request to a
      coordinator times out *before it was sent* (its coordinator's broker is down or unknown)
      and the client later finds the coordinator up, librdkafka releases the request's
      enqueue-once twice and the process dies on ``Assertion 'eonce->refcnt > 0'``. So
      librdkafka is never asked to time such a request out (:data:`COORDINATOR_REQUEST_TIMEOUT`):
      the caller waits on the future for its own timeout. When that passes, the client is
      replaced (destroying a client fails its queued requests without the double release):
      a coordinator's broker that died behind a black hole keeps its connection open, and
      the old client would wait for ``socket.timeout.ms`` (60 s) before asking another.
      Over a caller's client, which is not replaced, the next call for the same group waits
      on the request still in flight instead of sending another.
    - **The stale coordinator.** The client caches a group's coordinator and forgets it only
      after it goes unused for a while, so a member polling its group keeps asking a broker
      that answers ``NOT_COORDINATOR`` for as long as it polls. On that answer the client is
      replaced by a new one, which looks the coordinator up again.
    """

    def __init__(self, settings: Mapping[str, Any], client: Any = None) -> None:
        self._servers = settings.get("bootstrap.servers")
        self._brokers: list[int] = []   # broker ids from the last metadata response
        self._login = LoginRefusal()
        # coordinator requests not yet answered: (kind, group) -> future
        self._inflight: dict[tuple[str, str], Any] = {}
        self._inflight_lock = threading.Lock()
        self._conf: KafkaSettings | None = None  # None: the caller's client, never replaced
        if client is not None:
            self._admin = client        # the caller's AdminClient (its own error_cb, if any)
            return
        self._conf = KafkaSettings(_checked(settings))
        self._conf.setdefault("error_cb", self._login)
        self._admin = new_admin(self._conf)

    def _coordinator_call(self, kind: str, group_id: str, call: Any, timeout: float) -> Any:
        """The answer of ``call(admin)``, a request to ``group_id``'s coordinator returning its
        future, waited for up to ``timeout`` seconds (see the class's docstring). Raises
        ``TimeoutError`` while it is unanswered, or what the future raises."""
        key = (kind, group_id)
        with self._inflight_lock:
            future = self._inflight.get(key)
            if future is None or future.done():
                future = self._inflight[key] = call(self._admin)
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            if self._conf is None:
                raise TimeoutError(
                    f"no answer from the coordinator of group {group_id!r} within {timeout:g}"
                    f" s; the request stays in flight and the next call waits for it") from None
            # A broker that died behind a black hole keeps its connection "up": librdkafka
            # would wait for socket.timeout.ms (60 s) before asking anyone else
            with self._inflight_lock:
                self._renew_locked()
            raise TimeoutError(
                f"no answer from the coordinator of group {group_id!r} within {timeout:g} s;"
                f" the next call asks through a new client") from None
        except Exception as exc:
            if _code(exc) in _STALE_COORDINATOR:
                self._renew(exc)
            raise

    def _renew(self, exc: BaseException) -> None:
        """Replace the client, whose cached coordinator answered ``exc``, by a new one."""
        if self._conf is None:
            return
        log.info("the coordinator cached by the admin client at %s answered %s: using a new "
                 "client, which looks it up again", self._servers, _code(exc))
        with self._inflight_lock:
            self._renew_locked()

    def _renew_locked(self) -> None:
        # dropping the last reference destroys the old client: its requests still in flight
        # fail (not time out), and nobody waits for them
        if self._conf is not None:
            # serve the old client's callbacks first: a refused login is reported only there
            # (LoginRefusal), and the request it failed says no more than that it timed out
            with contextlib.suppress(Exception):
                self._admin.poll(0)
            self._admin = new_admin(self._conf)
            self._inflight.clear()

    def _unavailable(self, what: str, exc: BaseException, fix: str = "") -> NeliError:
        code = ""
        args = getattr(exc, "args", ())
        if args and hasattr(args[0], "name"):
            code = _error_name(args[0])
        refused = self._login.error(self._admin, what, self._servers)
        if refused is not None:
            return refused
        if authorization_denied(code):
            return AuthorizationError(
                f"{what} was denied by the broker ({code}): {fix or 'grant the ACL it needs'};"
                f" docs/guide/security.md lists every ACL a member needs")
        if code in ("_TRANSPORT", "_TIMED_OUT", "_ALL_BROKERS_DOWN", "_RESOLVE", ""):
            hint = (f"is the cluster at bootstrap.servers={self._servers!r} running and "
                    f"reachable (listeners, DNS, firewall, security settings)?")
        elif "AUTHORIZATION" in code:
            hint = "the client lacks an ACL for this operation"
        else:
            hint = "see the broker's answer above"
        return KafkaUnavailableError(f"{what} failed: {exc}; {hint}")

    def list_groups(self, timeout: float) -> list[str]:
        try:
            listing = self._admin.list_consumer_groups(request_timeout=timeout).result(
                timeout=timeout + 5)
        except Exception as exc:  # noqa: BLE001 - KafkaException, timeouts
            raise KafkaUnavailableError(
                f"cannot list consumer groups at {self._servers}: {exc}") from exc
        return [g.group_id for g in listing.valid]

    def describe_group(self, group_id: str, timeout: float) -> GroupDescription | None:
        try:
            description = self._coordinator_call(
                "describe", group_id, lambda admin: admin.describe_consumer_groups(
                    [group_id], request_timeout=COORDINATOR_REQUEST_TIMEOUT)[group_id], timeout)
        except Exception as exc:  # noqa: BLE001 - KafkaException, timeouts
            if "GROUP_ID_NOT_FOUND" in str(exc):
                return None
            what = f"describing consumer group {group_id!r}"
            refused = self._login.error(self._admin, what, self._servers)
            if refused is not None:
                raise refused from exc
            if is_authorization_error(exc):
                raise AuthorizationError(
                    f"{what} was denied ({exc}): grant READ (or DESCRIBE) on it;"
                    f" docs/guide/security.md lists every ACL") from exc
            raise KafkaUnavailableError(
                f"cannot describe consumer group {group_id!r} at {self._servers}: {exc}"
            ) from exc
        state = description.state
        return GroupDescription(
            group_id=group_id, state=str(getattr(state, "name", state)),
            members=tuple(GroupMember(member_id=m.member_id, client_id=m.client_id)
                          for m in description.members or []))

    def group_offsets(self, group_id: str, timeout: float) -> list[CommittedOffset]:
        from confluent_kafka import ConsumerGroupTopicPartitions

        try:
            result = self._coordinator_call(
                "offsets", group_id, lambda admin: admin.list_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(group_id)],
                    request_timeout=COORDINATOR_REQUEST_TIMEOUT)[group_id], timeout)
        except Exception as exc:  # noqa: BLE001 - KafkaException, timeouts
            raise KafkaUnavailableError(
                f"cannot read the offsets of consumer group {group_id!r} at {self._servers}:"
                f" {exc}") from exc
        return [CommittedOffset(topic=tp.topic, partition=tp.partition, offset=tp.offset,
                                metadata=tp.metadata)
                for tp in result.topic_partitions or []]

    def partition_count(self, topic: str, timeout: float) -> int | None:
        from confluent_kafka import KafkaError, KafkaException

        try:
            metadata = self._admin.list_topics(topic=topic, timeout=timeout)
        except KafkaException as exc:
            raise self._unavailable(f"reading metadata of topic {topic!r}", exc) from exc
        self._brokers = sorted(metadata.brokers)
        meta = metadata.topics.get(topic)
        if meta is None:
            return None
        if meta.error is not None:
            if meta.error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                     KafkaError._UNKNOWN_TOPIC):
                return None
            if meta.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                raise AuthorizationError(
                    f"the broker denied describing topic {topic!r} "
                    f"(TOPIC_AUTHORIZATION_FAILED): grant the member's principal READ and "
                    f"WRITE on it (they imply DESCRIBE); docs/guide/security.md lists every ACL")
            raise KafkaUnavailableError(
                f"the cluster at {self._servers!r} refused to describe topic {topic!r}: "
                f"{meta.error.str()}"
            )
        return len(meta.partitions)

    def create_topic(self, topic: str, partitions: int, config: Mapping[str, str],
                     timeout: float) -> None:
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import NewTopic

        new = NewTopic(topic, num_partitions=partitions, replication_factor=-1,
                       config=dict(config))
        try:
            futures = self._admin.create_topics([new], operation_timeout=timeout,
                                                request_timeout=timeout)
            futures[topic].result(timeout=timeout + 5)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if err is not None and hasattr(err, "code") and \
                    err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return
            raise self._unavailable(
                f"creating leader topic {topic!r} with {partitions} partition(s)", exc,
                f"grant CREATE on topic {topic!r}, or create it with {partitions} partition(s)"
                f" and set NeliConfig.create_topic=False",
            ) from exc
        except Exception as exc:  # noqa: BLE001 - e.g. a future timeout
            raise KafkaUnavailableError(
                f"creating leader topic {topic!r} did not finish within {timeout:g} s: {exc!r}"
            ) from exc

    def _describe(self, restype: Any, name: str, timeout: float) -> Mapping[str, str] | None:
        from confluent_kafka.admin import ConfigResource

        try:
            futures = self._admin.describe_configs([ConfigResource(restype, name)],
                                                   request_timeout=timeout)
            entries = next(iter(futures.values())).result(timeout=timeout + 5)
        except Exception:  # noqa: BLE001 - not allowed or not supported: the caller decides
            log.debug("describing %s %r failed", restype, name, exc_info=True)
            return None
        return {key: entry.value for key, entry in entries.items() if entry.value is not None}

    def topic_config(self, topic: str, timeout: float) -> Mapping[str, str] | None:
        from confluent_kafka.admin import ResourceType

        return self._describe(ResourceType.TOPIC, topic, timeout)

    def alter_group_config(self, group_id: str, settings: Mapping[str, str],
                           timeout: float) -> None:
        from confluent_kafka.admin import (
            AlterConfigOpType,
            ConfigEntry,
            ConfigResource,
            ResourceType,
        )

        entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                   for k, v in settings.items()]
        resource = ConfigResource(ResourceType.GROUP, group_id, incremental_configs=entries)
        try:
            futures = self._admin.incremental_alter_configs([resource], request_timeout=timeout)
            next(iter(futures.values())).result(timeout=timeout + 5)
        except Exception as exc:  # noqa: BLE001
            error = self._unavailable(
                f"setting {dict(settings)} on consumer group {group_id!r}", exc,
                f"grant ALTER_CONFIGS on group {group_id!r}, or set the group's "
                f"{', '.join(settings)} with kafka-configs --entity-type groups and set "
                f"NeliConfig.apply_group_config=False")
            if isinstance(error, AuthorizationError):
                raise error from exc
            if _code(exc) in ("INVALID_CONFIG", "INVALID_REQUEST"):
                # The broker validated and refused the values (outside its group.consumer.*
                # limits): a setup fault that no wait or retry cures.
                raise SessionTimeoutRejectedError(
                    f"the broker refuses {dict(settings)} for consumer group {group_id!r}: "
                    f"{exc}; choose a session timeout and group heartbeat within the broker's "
                    f"group.consumer.min/max.session.timeout.ms and "
                    f"group.consumer.min/max.heartbeat.interval.ms"
                ) from exc
            raise KafkaUnavailableError(
                f"setting {dict(settings)} on consumer group {group_id!r} failed: {exc}"
            ) from exc

    def group_config(self, group_id: str, timeout: float) -> Mapping[str, str] | None:
        from confluent_kafka.admin import ResourceType

        return self._describe(ResourceType.GROUP, group_id, timeout)

    # Broker settings are static for a process's life in practice: read once per cluster.
    _broker_configs: dict[str, Mapping[str, str]] = {}
    _broker_lock = threading.Lock()

    def broker_config(self, topic: str, timeout: float) -> Mapping[str, str] | None:
        from confluent_kafka.admin import ResourceType

        key = str(self._servers)
        with self._broker_lock:
            known = self._broker_configs.get(key)
        if known is not None:
            return known
        brokers = self._brokers   # the topic check's metadata named them: no second request
        if not brokers:
            try:
                brokers = sorted(self._admin.list_topics(topic=topic, timeout=timeout).brokers)
            except Exception:  # noqa: BLE001 - the topic checks report an unreachable cluster
                log.debug("listing the brokers failed", exc_info=True)
                return None
        if not brokers:
            return None
        settings = self._describe(ResourceType.BROKER, str(brokers[0]), timeout)
        if settings is not None:
            with self._broker_lock:
                self._broker_configs[key] = settings
        return settings

    def close(self) -> None:
        # AdminClient has no close(); dropping the reference destroys the handle
        with self._inflight_lock:
            self._inflight.clear()
        self._admin = None  # type: ignore[assignment]


class ConfluentKafka:
    """The real clients, from confluent-kafka (librdkafka)."""

    def admin(self, settings: Mapping[str, Any]) -> LeaderTopicAdmin:
        return _ConfluentAdmin(settings)

    def wrap_admin(self, client: Any) -> LeaderTopicAdmin:
        """The seam's admin over a confluent-kafka ``AdminClient`` the caller already has."""
        return _ConfluentAdmin({}, client)

    def consumer(self, settings: Mapping[str, Any], topic: str) -> GroupConsumer:
        return _ConfluentConsumer(settings, topic)

    def producer(self, settings: Mapping[str, Any], topic: str) -> HeartbeatProducer:
        return _ConfluentProducer(settings, topic)

    def watcher(self, settings: Mapping[str, Any], topic: str) -> LeaderTopicWatcher:
        return _ConfluentWatcher(settings, topic)

    def __repr__(self) -> str:
        return "ConfluentKafka()"


def lent_admin(admin: LeaderTopicAdmin) -> LeaderTopicAdmin:
    """A seam admin over ``admin``'s current client, for a borrower's few calls (a member's
    start-up checks over a Singleton's busy-check client).

    It holds that client for as long as the borrower uses it: should ``admin`` replace its
    client meanwhile (a timed-out or stale-coordinator call of another thread), the old one is
    not destroyed under the borrower's requests. It never replaces the client itself, and its
    ``close()`` only lets go of it; ``admin`` stays open.
    """
    if not isinstance(admin, _ConfluentAdmin):
        raise TypeError(f"only the seam's own admin client can be lent, not {admin!r}")
    with admin._inflight_lock:
        client = admin._admin
    return _ConfluentAdmin({"bootstrap.servers": admin._servers}, client)


def as_seam_admin(admin: Any) -> Any:
    """``admin`` itself, or the seam's admin over it if it is a confluent-kafka AdminClient."""
    from confluent_kafka.admin import AdminClient

    return ConfluentKafka().wrap_admin(admin) if isinstance(admin, AdminClient) else admin

