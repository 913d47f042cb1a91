"""The run ledger on a compacted Kafka topic, written through per-role transactional producers."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import math
import re
import threading
import time
import uuid
import warnings
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, NoReturn

from neli_orchestrate.core.client_settings import KafkaSettings, client_settings
from neli_orchestrate.core.config import NeliConfig
from neli_orchestrate.core.confluent import (
    RECONNECT_BACKOFF_MS,
    new_admin,
    new_consumer,
    new_producer,
)
from neli_orchestrate.core.confluent import is_authorization_error as _denied
from neli_orchestrate.errors import (
    AuthorizationError,
    ConfigError,
    FencedError,
    KafkaUnavailableError,
    TopicMismatchError,
)
from neli_orchestrate.ledger.cache import (
    Checkpoint,
    PartitionEnd,
    ReplayCache,
    Verdict,
    default_directory,
    end_is_known,
    judge,
)
from neli_orchestrate.ledger.record import (
    DEFAULT_LEDGER_TOPIC,
    LedgerError,
    LedgerRecord,
    encode_key,
    role_partition,
)
from neli_orchestrate.ledger.replay import Replay, ReplayBuilder
from neli_orchestrate.ledger.transactions import find_open_transaction

logger = logging.getLogger(__name__)



#: The all-zero topic id: "none" (a broker that does not know the topic's id).
_NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"

_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

# Settings the ledger's correctness depends on; kafka_config may not override them.
_PROTECTED = frozenset(
    {
        "bootstrap.servers",
        "transactional.id",
        "transaction.timeout.ms",
        "enable.idempotence",
        "acks",
        "isolation.level",
        "group.id",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "enable.partition.eof",
    }
)


@dataclass(frozen=True)
class KafkaLedgerConfig:
    """Where the ledger lives and how long its operations may take.

    ``kafka_config`` carries client settings such as ``security.protocol`` and ``sasl.*``; the
    settings the ledger depends on (``transactional.id``, ``isolation.level``, ...) cannot be
    overridden there.
    """

    #: Kafka bootstrap servers, ``host:port[,host:port]``.
    bootstrap_servers: str
    #: The compacted ledger topic (SingletonConfig: ``<namespace>.ledger``).
    topic: str = DEFAULT_LEDGER_TOPIC
    #: Partitions of the ledger topic. Fixed for the topic's life: changing it would move roles
    #: to other partitions, away from their history. An existing topic must match.
    partitions: int = 1
    #: Replication factor used when creating the topic (None: the broker's default).
    replication_factor: int | None = None
    #: ``transactional.id`` = prefix + role; None means ``"<topic>:"``. Every deployment of the
    #: same ledger must use the same prefix, or leaders will not fence each other.
    transactional_id_prefix: str | None = None
    #: Client settings (security.protocol, sasl.*, ssl.*); ledger-owned settings are refused.
    kafka_config: Mapping[str, Any] = field(default_factory=dict)
    #: Extra topic configs at creation (``cleanup.policy=compact`` is always set;
    #: ``segment.ms`` defaults to one hour so compaction can reach recent records).
    topic_config: Mapping[str, str] = field(default_factory=dict)
    #: Create the topic (compacted) if it is missing; needs CREATE on it.
    create_topic: bool = True
    #: Seconds a replay may take before KafkaUnavailableError. A writer that died inside a
    #: transaction holds the last stable offset of its partition until a newer leader of its
    #: role fences it or ``transaction_timeout`` passes.
    replay_timeout: float = 30.0
    #: ``transaction.timeout.ms`` of the writers, in seconds.
    transaction_timeout: float = 10.0
    #: Seconds for init_transactions, commit and admin requests.
    request_timeout: float = NeliConfig.request_timeout
    #: Continue each replay from where the last one of the role stopped (in this process, or
    #: in a file on this host), when that is provably safe (docs/guide/ledger.md, "Replay cache");
    #: False replays every role from offset 0 every time.
    replay_cache: bool = True
    #: Directory of the per-host replay cache files (one per role; private to the user). None:
    #: ``$XDG_CACHE_HOME/neli-orchestrate/ledger``. An empty string keeps the cache in memory.
    replay_cache_dir: str | None = None
    #: Keep clients from one claim to the next in this process: a role's transactional
    #: producer (:meth:`KafkaLedger.resume`, no new ``init_transactions()`` per claim: the
    #: broker's producer epoch is the fence, so a newer leader's makes the kept producer's
    #: commit fail) and the replay consumer's assignment (the next replay continues where the
    #: last stopped). False: a new producer, fenced, and a new assignment for every claim.
    #: See docs/internals/performance.md, "Across regions".
    keep_clients: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.bootstrap_servers, str) or not self.bootstrap_servers.strip():
            raise ConfigError("bootstrap_servers must be a non-empty 'host:port[,host:port]'")
        if not isinstance(self.topic, str) or not _TOPIC_NAME.match(self.topic):
            raise ConfigError(
                f"topic {self.topic!r} is not a legal Kafka topic name ([A-Za-z0-9._-], 1-249)"
            )
        if isinstance(self.partitions, bool) or not isinstance(self.partitions, int) or (
            self.partitions < 1
        ):
            raise ConfigError(f"partitions must be an integer >= 1, got {self.partitions!r}")
        if self.replication_factor is not None and self.replication_factor < 1:
            raise ConfigError(
                f"replication_factor must be >= 1 or None, got {self.replication_factor}"
            )
        for name in ("replay_timeout", "transaction_timeout", "request_timeout"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not value > 0 or not math.isfinite(value):
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        overridden = sorted(_PROTECTED & set(self.kafka_config))
        if overridden:
            raise ConfigError(
                f"kafka_config may not set {', '.join(overridden)}: the ledger manages these"
                " (use bootstrap_servers / transaction_timeout fields instead)"
            )
        if self.replay_cache_dir is not None and not isinstance(self.replay_cache_dir, str):
            raise ConfigError(
                f"replay_cache_dir must be a directory path or None, got {self.replay_cache_dir!r}"
            )
        if self.topic_config.get("cleanup.policy", "compact") != "compact":
            raise ConfigError("topic_config cleanup.policy must be 'compact' for the ledger")

    @property
    def prefix(self) -> str:
        """The effective ``transactional.id`` prefix."""
        if self.transactional_id_prefix is None:
            return f"{self.topic}:"
        return self.transactional_id_prefix

    def transactional_id(self, role: str) -> str:
        """``transactional.id`` of ``role``'s writers, identical in every deployment."""
        return self.prefix + role


#: What a reader of the ledger needs: only committed records, and the end seen as an event.
READER_REQUIRED: Mapping[str, Any] = {
    "isolation.level": "read_committed",
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
}


def ledger_settings(config: KafkaLedgerConfig, *, required: Mapping[str, Any] | None = None,
                           call: Mapping[str, Any] | None = None) -> KafkaSettings:
    """The settings of one of the ledger's clients (core's one builder): its logs go to
    ``neli_orchestrate.ledger.kafka.librdkafka``; the claim waits for the writer's and the replay
    consumer's first requests, hence the member clients' short first reconnect.

    A request in flight is given up after ``request_timeout`` (``socket.timeout.ms``; the
    transactional writer's may not exceed its transaction timeout), not librdkafka's 60 s: a
    broker lost behind a black hole keeps its connection open, and a kept replay consumer's
    fetch to it held a region-loss take-over back for a minute (docs/internals/chaos.md)."""
    socket_timeout = min(config.request_timeout, config.transaction_timeout)
    return client_settings(
        config.bootstrap_servers, logger=logging.getLogger(__name__ + ".librdkafka"),
        required=required, call=call, user=config.kafka_config,
        defaults={"reconnect.backoff.ms": RECONNECT_BACKOFF_MS,
                  # a claim's requests are small and in a row: Nagle's algorithm would hold one
                  # back while the previous one is unacknowledged
                  "socket.nagle.disable": True,
                  "socket.timeout.ms": max(1000, int(socket_timeout * 1000))},
        why={key: "the ledger manages it" for key in _PROTECTED})


def _kafka() -> Any:
    import confluent_kafka
    import confluent_kafka.admin  # noqa: F401 - the submodule is not imported by the package

    return confluent_kafka


def _fencing_codes() -> frozenset[int]:
    error = _kafka().KafkaError
    return frozenset({error._FENCED, error.PRODUCER_FENCED, error.INVALID_PRODUCER_EPOCH})


def _transient_codes() -> frozenset[int]:
    error = _kafka().KafkaError
    return frozenset({
        error.NOT_LEADER_FOR_PARTITION, error.LEADER_NOT_AVAILABLE,
        error.UNKNOWN_TOPIC_OR_PART, error.REQUEST_TIMED_OUT, error._TRANSPORT,
        error._TIMED_OUT, error.NOT_COORDINATOR, error.COORDINATOR_LOAD_IN_PROGRESS,
        # list_offsets on a partition whose leader the client has not learnt yet (a topic
        # just created by another deployment): "Failed to query partition leaders".
        error._NOENT,
    })


def _end_codes() -> frozenset[int]:
    """Errors that mean the partition's end is not known *yet* (a leader is changing)."""
    error = _kafka().KafkaError
    return _transient_codes() | frozenset({
        error.OFFSET_NOT_AVAILABLE, error.FENCED_LEADER_EPOCH, error.UNKNOWN_LEADER_EPOCH,
        error.NOT_ENOUGH_REPLICAS, error.KAFKA_STORAGE_ERROR,
    })


#: Seconds between two questions for the end of a partition whose end came back below the
#: cached offset (a truncation is believed only when a second answer, this much later,
#: agrees: judge()).
CONFIRM_INTERVAL = 0.5
#: Seconds between questions for an end offset while the partition has none (leader change).
_END_RETRY = 0.1
#: Seconds a replay's position may stand still below the end before it names the open
#: transaction holding it back (once, as a warning).
_STUCK_WARNING = 2.0

#: Seconds closing a ledger producer serves its purged messages' reports (_close_quietly).
_CLOSE_FLUSH = 1.0

#: Seconds a released producer may wait for the role's next claim before it is dropped
#: (the next claim then fences anew).
_KEEP_AT_MOST = 600.0

#: How long the broker holds the replay consumer's fetch when there is nothing new to read.
#: The consumer stays assigned between replays (KafkaLedger._keep_assigned), so this is its
#: idle rate too: about two fetches a second, and a record committed meanwhile is fetched at
#: once (the broker answers a held fetch as soon as data arrives).
_FETCH_WAIT_MS = 500


def _kafka_error(exc: BaseException) -> Any:
    """The KafkaError inside a KafkaException (or None)."""
    args = getattr(exc, "args", ())
    if args and hasattr(args[0], "code"):
        return args[0]
    return None


class KafkaLedger:
    """The run ledger on a compacted Kafka topic, written through per-role transactional producers.

    Thread-safe: replays are serialized on one read_committed consumer; each writer is used by
    one thread at a time.
    """

    def __init__(self, config: KafkaLedgerConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._admin: Any = None
        self._consumer: Any = None
        self._partitions: int | None = None
        self._closed = False
        self._cluster_id = ""
        #: The topic's delete.retention.ms in seconds (None: unknown, no checkpoint is trusted).
        self._delete_retention: float | None = None
        #: Producers being created and connected before leading, by role (see prepare()).
        # role -> (the producer being connected, monotonic time prepare() started it)
        self._prepared: dict[str, tuple[Future[Any], float]] = {}
        #: Healthy producers released by a claim, by role, with the highest token of the role
        #: they had seen (see resume()); each is checked out by one writer at a time.
        self._kept: dict[str, tuple[Any, int, float]] = {}
        #: (partition, position) the replay consumer stays assigned at between replays.
        self._assigned: tuple[int, int] | None = None
        #: Clocks of the replay's deadlines and waits (tests inject fakes).
        self._monotonic = time.monotonic
        self._sleep = time.sleep
        self._cache: ReplayCache | None = None
        if config.replay_cache:
            directory = config.replay_cache_dir
            self._cache = ReplayCache(
                default_directory() if directory is None else (directory or None))

    # -- set-up ---------------------------------------------------------------------------

    def _client_config(self, required: Mapping[str, Any] | None = None,
                       call: Mapping[str, Any] | None = None) -> KafkaSettings:
        return ledger_settings(self.config, required=required, call=call)

    def _ensure_ready(self) -> int:
        """Create/check the topic once; returns its partition count."""
        if self._closed:
            raise LedgerError("the ledger was closed")
        if self._partitions is not None:
            return self._partitions
        admin = self._admin
        if admin is None:
            admin = self._admin = new_admin(self._client_config())
        partitions = self._topic_partitions(admin)
        self._check_cluster(admin)
        if partitions is None:
            if not self.config.create_topic:
                raise TopicMismatchError(
                    f"ledger topic {self.config.topic!r} does not exist and create_topic=False;"
                    f" create it with cleanup.policy=compact and {self.config.partitions}"
                    " partition(s)"
                )
            # The count is read back, never assumed: another deployment (or an operator) may
            # have created the topic a moment ago with a count the metadata had not shown yet.
            partitions = self._create_topic(admin)
        if partitions != self.config.partitions:
            raise TopicMismatchError(
                f"ledger topic {self.config.topic!r} has {partitions} partitions but the config"
                f" says partitions={self.config.partitions}; roles map to partitions by"
                " crc32(role) % partitions, so set partitions to the topic's count (never add"
                " partitions to a ledger topic)"
            )
        self._check_cleanup_policy(admin)
        self._partitions = partitions
        return partitions

    def _check_cluster(self, admin: Any) -> None:
        """Refuse a cluster that lacks what the ledger needs: compaction and transactions.

        Either would fail much later and far from its cause: without a log cleaner the ledger
        grows forever and replays slow down without bound; a transaction coordinator that
        cannot create ``__transaction_state`` makes every ``init_transactions()`` time out as
        if the cluster were merely slow. Raises :class:`ConfigError` naming the feature.
        """
        ck = _kafka()
        try:
            metadata = admin.list_topics(timeout=self.config.request_timeout)
            broker_id = min(metadata.brokers)
            resource = ck.admin.ConfigResource(ck.admin.ResourceType.BROKER, str(broker_id))
            configs = admin.describe_configs(
                [resource], request_timeout=self.config.request_timeout
            )[resource].result(timeout=self.config.request_timeout * 2)
        except (ck.KafkaException, ValueError) as exc:
            # DESCRIBE_CONFIGS on the cluster is not granted everywhere: warn, as for the topic
            logger.warning("cannot verify that the cluster offers compaction and transactions"
                           " (broker configuration not readable: %s)", exc)
            return
        broker = {key: entry.value for key, entry in configs.items() if entry.value is not None}
        missing = []
        if broker.get("log.cleaner.enable", "true").lower() == "false":
            missing.append(
                f"log compaction (broker {broker_id}: log.cleaner.enable=false, so the ledger"
                f" topic {self.config.topic!r} would never be compacted; enable the log cleaner)")
        live = len(metadata.brokers)
        if "__transaction_state" not in metadata.topics:  # else the coordinator made it: fine
            for key in ("transaction.state.log.replication.factor",
                        "transaction.state.log.min.isr"):
                wanted = int(broker.get(key, "1"))
                if wanted > live:
                    missing.append(
                        f"working transactions, which fence earlier leaders (broker"
                        f" {broker_id}: {key}={wanted} but {live} broker(s) are live, so the"
                        f" transaction coordinator cannot create __transaction_state; lower"
                        f" {key} to at most {live} or add brokers)")
                    break
        if missing:
            raise ConfigError("the cluster lacks what the run ledger needs: "
                              + "; and ".join(missing))

    def _topic_partitions(self, admin: Any) -> int | None:
        try:
            metadata = admin.list_topics(
                topic=self.config.topic, timeout=self.config.request_timeout
            )
        except _kafka().KafkaException as exc:
            raise KafkaUnavailableError(
                f"cannot read metadata of ledger topic {self.config.topic!r} from"
                f" {self.config.bootstrap_servers}: {exc}"
            ) from exc
        self._cluster_id = metadata.cluster_id or ""
        topic = metadata.topics.get(self.config.topic)
        if topic is None or topic.error is not None:
            code = topic.error.code() if topic is not None and topic.error is not None else None
            if code == _kafka().KafkaError.TOPIC_AUTHORIZATION_FAILED:
                raise AuthorizationError(
                    f"not authorized to describe ledger topic {self.config.topic!r}: grant the"
                    " principal READ and WRITE on it (they imply DESCRIBE); docs/guide/security.md"
                )
            return None
        return len(topic.partitions)

    def _create_topic(self, admin: Any) -> int:
        """Create the topic, or find it created by another; return its partition count."""
        ck = _kafka()
        # Kafka never compacts the active segment; rolling it hourly (instead of weekly) keeps
        # the uncompacted tail, which every replay decodes in full, small.
        topic_config = {"cleanup.policy": "compact", "segment.ms": "3600000",
                        **self.config.topic_config}
        new_topic = ck.admin.NewTopic(
            self.config.topic,
            num_partitions=self.config.partitions,
            replication_factor=self.config.replication_factor or -1,
            config=topic_config,
        )
        future = admin.create_topics(
            [new_topic], operation_timeout=self.config.request_timeout
        )[self.config.topic]
        try:
            future.result(timeout=self.config.request_timeout * 2)
            logger.info(
                "created ledger topic %r (%d partitions, compacted)",
                self.config.topic, self.config.partitions,
            )
        except ck.KafkaException as exc:
            err = _kafka_error(exc)
            code = err.code() if err is not None else None
            if code != ck.KafkaError.TOPIC_ALREADY_EXISTS:
                self._raise_create_error(exc, code)
            # another deployment created it first: its count is read below and checked
        # Wait until the topic is visible: the first replay relies on its metadata, and the
        # caller checks the partition count it reports.
        deadline = self._monotonic() + self.config.request_timeout
        while (partitions := self._topic_partitions(admin)) is None:
            if self._monotonic() > deadline:
                raise KafkaUnavailableError(
                    f"ledger topic {self.config.topic!r} was created but never became visible"
                    f" within request_timeout={self.config.request_timeout:g} s; retry, or"
                    " raise request_timeout"
                )
            self._sleep(0.05)
        return partitions

    def _raise_create_error(self, exc: Exception, code: int | None) -> NoReturn:
        ck = _kafka()
        if _denied(exc):
            raise AuthorizationError(
                f"not allowed to create ledger topic {self.config.topic!r} ({exc}); grant"
                f" CREATE on it, or create it yourself with cleanup.policy=compact and"
                f" {self.config.partitions} partition(s) and set create_topic=False;"
                " docs/guide/security.md"
            ) from exc
        if code == ck.KafkaError.POLICY_VIOLATION:
            raise KafkaUnavailableError(
                f"not allowed to create ledger topic {self.config.topic!r} ({exc}); create it"
                f" yourself with cleanup.policy=compact and {self.config.partitions}"
                " partition(s), or grant CREATE"
            ) from exc
        raise KafkaUnavailableError(
            f"creating ledger topic {self.config.topic!r} failed: {exc}"
        ) from exc

    def _check_cleanup_policy(self, admin: Any) -> None:
        ck = _kafka()
        resource = ck.admin.ConfigResource(ck.admin.ResourceType.TOPIC, self.config.topic)
        try:
            configs = admin.describe_configs(
                [resource], request_timeout=self.config.request_timeout
            )[resource].result(timeout=self.config.request_timeout * 2)
        except ck.KafkaException as exc:
            # Reading configs needs DESCRIBE_CONFIGS; without it we cannot verify, only warn.
            logger.warning(
                "cannot verify cleanup.policy of ledger topic %r: %s", self.config.topic, exc
            )
            return
        retention = configs.get("delete.retention.ms")
        if retention is not None and retention.value is not None:
            self._delete_retention = int(retention.value) / 1000
        entry = configs.get("cleanup.policy")
        policy = entry.value if entry is not None else None
        if policy is not None and "compact" not in policy.split(","):
            raise TopicMismatchError(
                f"ledger topic {self.config.topic!r} has cleanup.policy={policy}; it must be"
                " 'compact', or completed runs are deleted by retention and would run again"
            )
        if policy is not None and "delete" in policy.split(","):
            logger.warning(
                "ledger topic %r has cleanup.policy=%s: retention deletes completed runs too",
                self.config.topic, policy,
            )

    def partition_for(self, role: str) -> int:
        """The ledger partition holding ``role``'s records."""
        return role_partition(role, self._ensure_ready())

    # -- LedgerStore ------------------------------------------------------------------------

    def begin(self, role: str) -> KafkaLedgerWriter:
        """Create ``role``'s transactional producer and ``init_transactions()`` (fences earlier)."""
        with self._lock:
            partition = role_partition(role, self._ensure_ready())
            kept = self._kept.pop(role, None)
        if kept is not None:
            _close_quietly(kept[0])  # the init below fences it anyway
        return KafkaLedgerWriter(self, role, partition, self._fenced_producer(role))

    def resume(self, role: str) -> KafkaLedgerWriter:
        """A writer on the producer an earlier claim of ``role`` in this process released
        (:meth:`KafkaLedgerWriter.release`), without a new ``init_transactions()``; else
        :meth:`begin`.

        Its fence is the earlier ``init_transactions()``: a newer leader's fences it at the
        broker, so its commit fails with :class:`FencedError` (:attr:`KafkaLedgerWriter.reused`
        tells the caller to :meth:`begin` and decide again). Its :meth:`~KafkaLedgerWriter.replay`
        fences again at once when the role holds a token it did not see (another writer).
        """
        with self._lock:
            partition = role_partition(role, self._ensure_ready())
            kept = self._kept.pop(role, None) if self.config.keep_clients else None
        if kept is None:
            return self.begin(role)
        producer, seen, kept_at = kept
        if self._monotonic() - kept_at > _KEEP_AT_MOST:
            # Long idle: the broker may have expired the transactional id (7 days by
            # default) or moved its coordinator; a new fence costs little by comparison.
            _close_quietly(producer)
            return self.begin(role)
        logger.debug("resumed the ledger writer of role %r (fenced at an earlier claim)", role)
        return KafkaLedgerWriter(self, role, partition, producer, seen=seen)

    def _keep(self, role: str, producer: Any, seen: int) -> None:
        """Take back a released writer's producer for the role's next claim."""
        with self._lock:
            other = None if self._closed else self._kept.pop(role, None)
            if not self._closed and other is None:
                self._kept[role] = (producer, seen, self._monotonic())
                return
        # Closed, or two released producers of one role: which was fenced last is not
        # known here, so neither is kept.
        _close_quietly(producer)
        if other is not None:
            _close_quietly(other[0])

    def _fenced_producer(self, role: str) -> Any:
        """A producer of ``role`` after ``init_transactions()``: every earlier one is fenced."""
        with self._lock:
            prepared, since = self._prepared.pop(role, (None, 0.0))
        ck = _kafka()
        producer = None
        if prepared is not None:
            try:
                producer = prepared.result(timeout=self.config.request_timeout * 2)
            except Exception as exc:  # noqa: BLE001 - created again below, errors reported there
                logger.debug("the prepared ledger producer of %r is unusable: %s", role, exc)
        if producer is not None and self._monotonic() - since > self.config.request_timeout:
            # Prepared before a wait (the role was busy): what it learnt of the cluster then
            # may be a lost broker's, whose open connection it would wait on for its request
            # timeout (region-loss trials, docs/internals/chaos.md). The head start is for the
            # join, not for a wait: a new producer.
            logger.debug("the ledger producer of %r was prepared %.0f s ago: a new one", role,
                         self._monotonic() - since)
            _close_quietly(producer)
            producer = None
        if producer is None:
            producer = self._producer(role)
        try:
            producer.init_transactions(self.config.request_timeout)
        except ck.KafkaException as exc:
            err = _kafka_error(exc)
            _close_quietly(producer)
            hint = ""
            denied = ck.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            if err is not None and err.code() == denied:
                raise AuthorizationError(
                    f"init_transactions for role {role!r} was denied ({err.name()}): grant WRITE"
                    f" on transactional id {self.config.transactional_id(role)!r} (a PREFIXED"
                    f" rule on {self.config.prefix!r} covers every role); docs/guide/security.md"
                ) from exc
            raise KafkaUnavailableError(
                f"init_transactions for role {role!r} failed: {exc}{hint}"
            ) from exc
        logger.debug("began ledger writer for role %r", role)
        return producer

    def _producer(self, role: str) -> Any:
        # enable.sparse.connections=False: the producer connects to the brokers the metadata
        # names, not only to those it has a request for. init_transactions() sends its
        # FindCoordinator to a broker already up and, finding none (a prepared producer has only
        # its bootstrap connection), waits for a fixed 500 ms timer: 6 of 10 gate claims at
        # 60 ms of round trip paid it (docs/internals/performance.md, "One-off claims").
        return new_producer(self._client_config(required={
            "transactional.id": self.config.transactional_id(role),
            "transaction.timeout.ms": int(self.config.transaction_timeout * 1000),
            "enable.idempotence": True,
            "acks": "all",
        }, call={"linger.ms": 0, "enable.sparse.connections": False}))

    def prepare(self, role: str) -> None:
        """Get ready to :meth:`begin` ``role`` quickly; call it before leading (fences nobody).

        Creates the role's producer and connects it (a metadata request): librdkafka retries
        ``init_transactions`` on a fixed 500 ms timer when the coordinator's connection is not
        up yet, which a producer created at ``begin`` usually hits. Then connects the replay
        consumer the same way, if this ledger has none yet (a new process: a gate's task),
        so the replay after the fence pays no connection of its own. Also takes the role's
        first replay checkpoint if there is none (:meth:`warm`).
        """
        self.warm(role)
        with self._lock:
            if role in self._prepared or self._closed:
                return
            future: Future[Any] = Future()
            self._prepared[role] = (future, self._monotonic())
        # Connecting takes a round trip or two: it runs while the caller joins the group.
        threading.Thread(target=self._connect, args=(role, future), daemon=True,
                         name=f"neli-ledger-connect-{role}").start()

    def _connect(self, role: str, future: Future[Any]) -> None:
        try:
            producer = self._producer(role)
        except BaseException as exc:  # noqa: BLE001 - begin() creates it again and reports
            future.set_exception(exc)
            return
        try:
            producer.list_topics(self.config.topic, timeout=self.config.request_timeout)
        except Exception as exc:  # noqa: BLE001 - only a head start; begin() reports errors
            logger.debug("connecting the ledger producer of %r early failed: %s", role, exc)
        with self._lock:
            # Under the lock: a close() that runs later sees the result and closes it; one that
            # ran before did not, so it is closed here (once either way).
            closed = self._closed
            future.set_result(producer)
            if not closed and self._consumer is not None:
                return
        if closed:
            _close_quietly(producer)
            return
        # Connected outside the lock, which the fence and the replays of other roles take: only
        # a connection is made (no assignment, no offset); the replay assigns it.
        consumer = self._new_replay_consumer()
        try:
            consumer.list_topics(self.config.topic, timeout=self.config.request_timeout)
        except Exception as exc:  # noqa: BLE001 - only a head start; the replay reports
            logger.debug("connecting the ledger replay consumer early failed: %s", exc)
        with self._lock:
            if self._consumer is None and not self._closed:
                self._consumer, consumer = consumer, None
        if consumer is not None:  # a replay made its own meanwhile, or the ledger was closed
            with contextlib.suppress(Exception):
                consumer.close()

    def replay(self, role: str) -> Replay:
        """Replay ``role`` read_committed up to the high watermark (no fence; not for tokens)."""
        return self._replay(role, fenced=False)

    def warm(self, role: str) -> None:
        """Take ``role``'s checkpoint now if there is none, so that the replay after the fence
        reads only the tail: a replay from offset 0 of a large ledger takes seconds, and while
        leading, that time counts against the member's lease."""
        if self._cache is None:
            return
        with self._lock:
            self._ensure_ready()
            if self._cache.get(self._cluster_id, self.config.topic, role) is not None:
                return
        self._replay(role, fenced=False)

    def _replay(self, role: str, *, fenced: bool) -> Replay:
        ck = _kafka()
        with self._lock:
            partition = role_partition(role, self._ensure_ready())
            tp = ck.TopicPartition(self.config.topic, partition)
            deadline = self._monotonic() + self.config.replay_timeout
            # Before the high watermark is read: every message above it is written later.
            read_at = time.time()
            # Topic id and log start are asked for alongside the high watermark (one round trip),
            # after it: the broker answers one connection's requests in order, and the end is
            # awaited first.
            asked = self._ask_end(tp, deadline)
            pending = self._partition_facts(partition) if self._cache is not None else None
            # An offset, never a sentinel: an unknown end is not an empty ledger (S5).
            end = self._end_offset(tp, deadline, asked)
            topic_id, log_start = self._facts(pending)
            builder, start, end = self._resume(role, tp, topic_id, log_start, end, read_at,
                                               deadline)
            if end.offset > start:
                position = self._fold(builder, role, tp, start, end.offset, deadline)
            else:
                # At the checkpoint (or an empty partition): the checkpoint's position was
                # reached read_committed, so no transaction below it is still open.
                position = start
            if self._cache is not None and topic_id is not None:
                self._cache.put(Checkpoint(self._cluster_id, self.config.topic, topic_id,
                                           partition, position, read_at, builder.state(),
                                           end.leader_epoch))
            return builder.build(position, fenced=fenced)

    def _resume(self, role: str, tp: Any, topic_id: str | None, log_start: int | None,
                end: PartitionEnd, read_at: float, deadline: float,
                ) -> tuple[ReplayBuilder, int, PartitionEnd]:
        """The fold to continue, its offset, and the end to fold to: the role's checkpoint if
        the topic confirms it, else offset 0 (cache.judge)."""
        cache = self._cache
        if cache is None or topic_id is None:
            return ReplayBuilder(role), 0, end
        checkpoint = cache.get(self._cluster_id, self.config.topic, role)
        if checkpoint is None:
            return ReplayBuilder(role), 0, end
        earlier: PartitionEnd | None = None
        while True:
            judgement = judge(checkpoint, topic_id=topic_id, partition=tp.partition,
                              log_start=log_start, end=end, earlier=earlier, now=read_at,
                              retention=self._delete_retention)
            if judgement.verdict is not Verdict.CONFIRM:
                break
            # An end below the checkpoint may be a deposed leader's answer: ask again, from
            # the partition's current leader, before believing the topic was truncated.
            if self._monotonic() + CONFIRM_INTERVAL >= deadline:
                raise KafkaUnavailableError(
                    f"replay of role {role!r}: ledger partition {tp.topic}[{tp.partition}]"
                    f" answers an end below what this host already read ({judgement.why})"
                    f" and did not confirm it within replay_timeout"
                    f" ({self.config.replay_timeout} s); nothing was decided. Retry once the"
                    " partition's leadership has settled")
            logger.info("replay of %r: %s; asking the broker again", role, judgement.why)
            self._sleep(CONFIRM_INTERVAL)
            self._refresh_metadata()
            earlier, end = end, self._end_offset(tp, deadline)
        if judgement.verdict is Verdict.CONTINUE:
            logger.debug("replay of %r continues at offset %d (%d run keys cached)", role,
                         checkpoint.offset, len(checkpoint.state.records))
            return ReplayBuilder(role, checkpoint.state), checkpoint.offset, end
        builder = ReplayBuilder(role)
        if judgement.verdict is Verdict.RESTARTED:
            # Offsets restarted: tokens issued before must still not be reissued.
            builder.raise_token_floor(checkpoint.state.max_token)
            logger.warning(
                "ledger topic %r of role %r: %s; replaying from offset 0. Claims stay refused"
                " until the partition passes token %d issued before (delete %s to accept the"
                " new topic after resetting the sinks' tokens)", self.config.topic, role,
                judgement.why, checkpoint.state.max_token,
                cache.path(self._cluster_id, self.config.topic, role) or "the process's cache")
        else:
            logger.debug("replay of %r starts at offset 0: %s", role, judgement.why)
        return builder, 0, end

    def _open_transaction(self, partition: int) -> str:
        """Name the open transaction holding ``partition``'s last stable offset back."""
        def consumer(settings: dict[str, Any]) -> Any:
            return new_consumer(self._client_config(
                required={k: v for k, v in settings.items() if k in _PROTECTED},
                call={k: v for k, v in settings.items() if k not in _PROTECTED}))

        try:
            found = find_open_transaction(self._admin, consumer, self.config.topic, partition,
                                          self.config.prefix,
                                          timeout=min(self.config.request_timeout, 5.0))
        except (_kafka().KafkaException, concurrent.futures.TimeoutError) as exc:
            return f"an open transaction holds the last stable offset (not named: {exc})"
        if found is None:
            return "the last stable offset is below the high watermark"
        return found.describe(time.time())

    def _refresh_metadata(self) -> None:
        """Ask for the topic's metadata, so the next request goes to its current leader."""
        try:
            self._admin.list_topics(topic=self.config.topic,
                                    timeout=self.config.request_timeout)
        except _kafka().KafkaException as exc:
            logger.debug("refreshing the metadata of %r: %s", self.config.topic, exc)

    def _fold(self, builder: ReplayBuilder, role: str, tp: Any, start: int, high: int,
              deadline: float) -> int:
        """Fold ``tp`` from ``start`` read_committed until the high watermark; the position."""
        ck = _kafka()
        partition = tp.partition
        consumer = self._replay_consumer()
        kept, self._assigned = self._assigned, None
        # The consumer's position is this fold's only once the assignment below has taken
        # effect: librdkafka starts the fetch on its own thread, and until then position()
        # still says where the consumer's last assignment stood, possibly this replay's end.
        # The first event of the new assignment (a record, or the end of the partition)
        # comes after that; outdated events are dropped.
        started = kept == (partition, start)
        if not started:
            # An explicit offset rather than OFFSET_BEGINNING saves a ListOffsets round trip;
            # auto.offset.reset=earliest covers records deleted from the log start.
            consumer.assign([ck.TopicPartition(self.config.topic, partition, start)])
        # else: still assigned where the last replay stopped, so the records written since
        # are usually fetched already (a fetch waits on the broker until data arrives).
        position = eof = -1
        moved_at, named = self._monotonic(), False
        done = False
        # consume() waits for a full batch or the timeout: keep the timeout short, and none at
        # first, when a kept assignment has usually fetched the records already.
        wait = 0.0
        try:
            while True:
                batch, wait = consumer.consume(num_messages=10000, timeout=wait), 0.005
                started = started or bool(batch)
                for message in batch:
                    error = message.error()
                    if error is not None:
                        if error.code() == ck.KafkaError._PARTITION_EOF:
                            eof = max(eof, message.offset())
                            continue
                        if error.code() == ck.KafkaError.GROUP_AUTHORIZATION_FAILED:
                            # librdkafka looks up the coordinator of the (never joined)
                            # replay group; the assigned partitions fetch without it.
                            continue
                        if (error.retriable() or error.code() in _transient_codes()) and (
                            not error.fatal()
                        ):
                            logger.debug("replay of %r: %s (retrying)", role, error)
                            continue  # bounded by the replay deadline below
                        if _denied(error):
                            raise AuthorizationError(
                                f"replaying ledger topic {self.config.topic!r} was denied"
                                f" ({error.name()}): grant READ on it; docs/guide/security.md"
                            )
                        raise KafkaUnavailableError(
                            f"replaying ledger partition {partition}: {error}"
                        )
                    builder.add(message.key(), message.value(), message.offset())
                # The position moves past transaction markers too, so it reaches the high
                # watermark once every transaction open at the start has ended. Before the
                # first fetch it is a sentinel (-1001), below any end.
                before = position
                try:
                    if started:
                        position = max(consumer.position([tp])[0].offset, eof)
                except ck.KafkaException as exc:
                    logger.debug("replay of %r: no position yet (%s)", role, exc)
                if position >= high:
                    done = True
                    return position
                now = self._monotonic()
                if position != before:
                    moved_at = now
                elif not named and now - moved_at > _STUCK_WARNING:
                    named = True   # say once who holds the replay back, instead of waiting silently
                    logger.warning("replay of role %r waits: %s", role,
                                   self._open_transaction(partition))
                if now > deadline:
                    raise KafkaUnavailableError(
                        f"replay of role {role!r} stuck at offset"
                        f" {position if end_is_known(position) else start} of ledger"
                        f" partition {self.config.topic}[{partition}], below the high"
                        f" watermark {high}: {self._open_transaction(partition)}. A writer"
                        " that died mid-transaction blocks until a newer leader of its role"
                        " fences it or its transaction timeout passes"
                    )
        finally:
            self._keep_assigned(consumer, tp, position if done else None)

    def _keep_assigned(self, consumer: Any, tp: Any, position: int | None) -> None:
        """After a replay: stay assigned at ``position`` if the consumer's own position is
        exactly there (the next replay of the partition continues with no new assignment),
        else unassign (a failed replay, or a position taken from an end-of-partition event)."""
        if position is not None and self.config.keep_clients:
            try:
                if consumer.position([tp])[0].offset == position:
                    self._assigned = (tp.partition, position)
                    return
            except _kafka().KafkaException as exc:
                logger.debug("replay consumer position unknown (%s): unassigning", exc)
        consumer.unassign()

    def _partition_facts(self, partition: int) -> Any:
        """Ask for the topic id and the log start offset at once; answered by ``_facts``."""
        ck = _kafka()
        tp = ck.TopicPartition(self.config.topic, partition)
        timeout = self.config.request_timeout
        try:
            described = self._admin.describe_topics(
                ck.TopicCollection([self.config.topic]), request_timeout=timeout
            )[self.config.topic]
            earliest = self._admin.list_offsets(
                {tp: ck.admin.OffsetSpec.earliest()}, request_timeout=timeout)[tp]
        except ck.KafkaException as exc:
            logger.debug("cannot describe ledger topic %r (%s)", self.config.topic, exc)
            return None
        return described, earliest

    def _facts(self, pending: Any) -> tuple[str | None, int | None]:
        """(topic id, log start offset); None for what the broker did not say (a topic id of
        None: no cache; a log start of None: no checkpoint is continued)."""
        if pending is None:
            return None, None
        ck = _kafka()
        described, earliest = pending
        timeout = self.config.request_timeout * 2
        try:
            topic_id = getattr(described.result(timeout=timeout), "topic_id", None)
        except (ck.KafkaException, concurrent.futures.TimeoutError) as exc:
            logger.debug("cannot describe ledger topic %r (%s): replaying from offset 0",
                         self.config.topic, exc)
            return None, None
        log_start: int | None
        try:
            log_start = int(earliest.result(timeout=timeout).offset)
        except (ck.KafkaException, concurrent.futures.TimeoutError) as exc:
            logger.debug("no log start offset of ledger topic %r (%s)", self.config.topic, exc)
            log_start = None
        if log_start is not None and not end_is_known(log_start):
            log_start = None  # -1001 during a leader change: not an offset
        if topic_id is None or str(topic_id) == _NO_TOPIC_ID:
            return None, log_start
        return str(topic_id), log_start

    def _ask_end(self, tp: Any, deadline: float) -> tuple[Any, float] | None:
        """Ask for ``tp``'s high watermark: (the answer's future, its timeout), or None if the
        request could not be made (``_end_offset`` asks again and says why)."""
        timeout = self._end_timeout(deadline)
        try:
            return self._request_end(tp, timeout), timeout
        except _kafka().KafkaException:
            return None

    def _end_timeout(self, deadline: float) -> float:
        return max(0.5, min(self.config.request_timeout, deadline - self._monotonic()))

    def _request_end(self, tp: Any, timeout: float) -> Any:
        """One ListOffsets request for ``tp``'s high watermark; its future."""
        ck = _kafka()
        return self._admin.list_offsets(
            {tp: ck.admin.OffsetSpec.latest()},
            isolation_level=ck.IsolationLevel.READ_UNCOMMITTED,
            request_timeout=timeout,
        )[tp]

    def _end_offset(self, tp: Any, deadline: float,
                    asked: tuple[Any, float] | None = None) -> PartitionEnd:
        """The partition's high watermark, an offset: while the partition has no leader, or
        answers a sentinel (-1001 during a leader change), or does not answer, ask again until
        ``deadline``, then raise :class:`KafkaUnavailableError`. Never a guess. ``asked``: the
        first request, already made (``_ask_end``)."""
        ck = _kafka()
        last = "no answer"
        while True:
            timeout = self._end_timeout(deadline)
            try:
                if asked is not None:
                    (future, timeout), asked = asked, None
                else:
                    future = self._request_end(tp, timeout)
                result = future.result(timeout=timeout + 1)
                offset = int(result.offset)
                if end_is_known(offset):
                    return PartitionEnd(offset, getattr(result, "leader_epoch", None))
                last = (f"offset {offset}, which is not an offset (the partition's leader is"
                        " changing)")
            except concurrent.futures.TimeoutError:
                last = f"no answer within {timeout:.1f} s"
            except ck.KafkaException as exc:
                if _denied(exc):
                    raise AuthorizationError(
                        f"reading the high watermark of ledger topic {tp.topic!r} was denied"
                        f" ({exc}): grant READ on it (implies DESCRIBE); docs/guide/security.md"
                    ) from exc
                err = _kafka_error(exc)
                # A partition just created, or moving between brokers, has no leader for a
                # moment; the admin API reports that as not retriable, but it is.
                if err is None or not (err.retriable() or err.code() in _end_codes()):
                    raise KafkaUnavailableError(
                        f"cannot read the high watermark of ledger partition"
                        f" {tp.topic}[{tp.partition}]: {exc}"
                    ) from exc
                last = str(exc)
            if self._monotonic() >= deadline:
                raise KafkaUnavailableError(
                    f"cannot establish the end of ledger partition {tp.topic}[{tp.partition}]"
                    f" within replay_timeout ({self.config.replay_timeout} s); the last answer"
                    f" was {last}. Nothing was read or decided (an unknown end is not an empty"
                    " ledger); retry once the partition has a leader")
            logger.debug("end of ledger partition %s[%d] not known yet (%s); asking again",
                         tp.topic, tp.partition, last)
            self._sleep(_END_RETRY)

    def _replay_consumer(self) -> Any:
        if self._consumer is None:
            self._consumer = self._new_replay_consumer()
        return self._consumer

    def _new_replay_consumer(self) -> Any:
        return new_consumer(self._client_config(required={
            "group.id": f"neli-ledger-replay-{uuid.uuid4().hex}",  # never joins a group
            **READER_REQUIRED,
        }, call={
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": _FETCH_WAIT_MS,
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 16 * 1024 * 1024,
        }))

    def close(self) -> None:
        """Close the replay consumer; writers are closed by their owners."""
        with self._lock:
            self._closed = True
            prepared, self._prepared = list(self._prepared.values()), {}
            for future, _ in prepared:
                if future.done() and future.exception() is None:
                    _close_quietly(future.result())
            kept, self._kept = list(self._kept.values()), {}
            for producer, _, _ in kept:
                _close_quietly(producer)
            self._assigned = None
            if self._consumer is not None:
                try:
                    self._consumer.close()
                except Exception as exc:  # noqa: BLE001 - closing must not mask the caller's error
                    logger.debug("closing ledger replay consumer: %s", exc)
                self._consumer = None
            self._admin = None

    def __enter__(self) -> KafkaLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: confluent-kafka's warnings when ``close()`` cannot abort or flush a producer's transaction
#: (a fenced producer, or one whose ``init_transactions()`` is still in progress on another
#: thread). :func:`_close_quietly` drops such producers on purpose, so these warnings, and only
#: when this module closes a producer, are noise. A filter rather than
#: ``warnings.catch_warnings()``: that swaps the process's one filter list and is not
#: thread-safe. Two threads closing producers at once (a watchdog and a task) could restore each
#: other's lists, letting the warning through or leaving "ignore every RuntimeWarning" behind
#: for the whole process (the warning reached CI's output that way).
_CLOSE_WARNING = r"Producer (abort_transaction|flush) failed during close"
warnings.filterwarnings("ignore", message=_CLOSE_WARNING, category=RuntimeWarning,
                        module=r"neli_orchestrate\.ledger\.kafka\Z")


def _close_quietly(producer: Any) -> None:
    """Close a ledger producer without waiting on the cluster.

    Whatever it still holds belongs to a transaction that was not committed (or whose commit
    has an unknown outcome, settled by the next ``init_transactions()``), so it is purged, not
    delivered: confluent-kafka's ``close()`` flushes with no timeout, and with a partition
    leaderless or a broker gone that blocked the caller for as long as the messages lived.
    Should anything remain, the producer is dropped instead (destroying it fails what it held).
    """
    # A fenced producer raises (or warns about, _CLOSE_WARNING) its fatal error when closed;
    # that error was already reported as FencedError, so here it is only noise.
    try:
        purge = getattr(producer, "purge", None)
        if purge is not None:
            purge()
        flush = getattr(producer, "flush", None)
        if flush is not None and flush(_CLOSE_FLUSH) > 0:
            logger.debug("ledger producer still holds messages after a purge: dropped")
            return
        close = getattr(producer, "close", None)
        if close is not None:
            close()
    except Exception as exc:  # noqa: BLE001
        logger.debug("closing ledger producer: %s", exc)


class KafkaLedgerWriter:
    """The transactional producer of one role, valid until a newer ``begin`` fences it."""

    def __init__(self, ledger: KafkaLedger, role: str, partition: int, producer: Any, *,
                 seen: int | None = None) -> None:
        self._ledger = ledger
        self._role = role
        self.partition = partition
        self.transactional_id = ledger.config.transactional_id(role)
        self._producer: Any = producer
        self._dead: str | None = None
        #: Fenced at an earlier claim (KafkaLedger.resume), not by this one.
        self._reused = seen is not None
        #: The highest token of the role this producer has seen since its fence (its own
        #: writes included); None before its first replay.
        self._seen = seen
        #: Whether any operation of this writer failed: a producer that erred is never kept.
        self._erred = False

    @property
    def role(self) -> str:
        return self._role

    @property
    def fenced(self) -> bool:
        """True once a write failed because a newer leader's begin fenced this writer."""
        return self._dead == "fenced"

    @property
    def reused(self) -> bool:
        """True while this writer's fence is an earlier claim's ``init_transactions()``: a
        :class:`FencedError` from its write means "begin and decide again", not a lost run."""
        return self._reused

    def replay(self) -> Replay:
        """Replay the role after this writer's fence; its ``next_token`` may be used for claims.

        A writer resumed from an earlier claim fences again first if the role holds a token
        it has not seen: another leader wrote since, so its ``init_transactions()`` fenced
        this producer and a write could only fail.
        """
        self._check_usable(None)
        try:
            replay = self._ledger._replay(self._role, fenced=True)
            if self._reused and replay.max_token != self._seen:
                logger.info("role %r: another leader wrote since this process's last claim"
                            " (token %d, last seen %s): fencing again", self._role,
                            replay.max_token, self._seen)
                self._refence()
                replay = self._ledger._replay(self._role, fenced=True)
        except BaseException:
            self._erred = True  # never kept: what it read or fenced is not known
            raise
        self._seen = replay.max_token
        return replay

    def _refence(self) -> None:
        """Drop the kept producer and fence with a new one (``init_transactions()``)."""
        _close_quietly(self._producer)
        self._reused = False
        self._seen = None
        try:
            self._producer = self._ledger._fenced_producer(self._role)
        except BaseException:
            self._dead = "closed"
            self._erred = True
            raise

    def write(self, record: LedgerRecord) -> None:
        """Write one record in one committed transaction."""
        if record.role != self._role:
            raise ValueError(f"writer of role {self._role!r} cannot write {record.role!r}")
        self._transaction([(record.key, record.encode())], token=record.token)
        self._seen = record.token if self._seen is None else max(self._seen, record.token)

    def tombstone(self, run_keys: Sequence[str]) -> None:
        """Delete ``run_keys`` (tombstones) in one committed transaction."""
        if run_keys:
            self._transaction([(encode_key(self._role, k), None) for k in run_keys], token=None)

    def _check_usable(self, token: int | None) -> None:
        if self._dead == "fenced":
            raise FencedError(
                f"the ledger writer of role {self._role!r} was fenced by a newer leader",
                role=self._role, token=token,
            )
        if self._dead is not None:
            raise KafkaUnavailableError(
                f"the ledger writer of role {self._role!r} is unusable ({self._dead});"
                " re-acquire leadership and begin() again"
            )

    def _transaction(
        self, messages: Iterable[tuple[bytes, bytes | None]], token: int | None
    ) -> None:
        self._check_usable(token)
        ck = _kafka()
        producer = self._producer
        topic = self._ledger.config.topic
        timeout = self._ledger.config.request_timeout
        try:
            producer.begin_transaction()
            for key, value in messages:
                producer.produce(topic, key=key, value=value, partition=self.partition)
            deadline = time.monotonic() + timeout
            while True:
                try:
                    producer.commit_transaction(max(0.1, deadline - time.monotonic()))
                    return
                except ck.KafkaException as exc:
                    err = _kafka_error(exc)
                    if (
                        err is not None
                        and err.retriable()
                        and not err.fatal()
                        and not err.txn_requires_abort()
                        and time.monotonic() < deadline
                    ):
                        continue  # commit_transaction may be retried after a retriable error
                    raise
        except ck.KafkaException as exc:
            self._erred = True
            self._fail(exc, token)
        except BufferError as exc:
            self._erred = True
            self._abort()
            raise KafkaUnavailableError(f"ledger producer queue full: {exc}") from exc

    def _fail(self, exc: BaseException, token: int | None) -> None:
        err = _kafka_error(exc)
        if _denied(exc):
            if err.txn_requires_abort() and not err.fatal():
                self._abort()
            else:
                self._dead = f"denied ({err.name()})"
                _close_quietly(self._producer)
            raise AuthorizationError(
                f"ledger write for role {self._role!r} was denied, nothing written"
                f" ({err.name()}): grant WRITE on ledger topic {self._ledger.config.topic!r}"
                f" and on transactional id {self.transactional_id!r}; docs/guide/security.md"
            ) from exc
        if err is not None and err.code() in _fencing_codes():
            self._dead = "fenced"
            _close_quietly(self._producer)
            raise FencedError(
                f"ledger write for role {self._role!r} refused: a newer leader called"
                f" init_transactions() ({err.name()})",
                role=self._role, token=token,
            ) from exc
        if err is not None and err.fatal():
            self._dead = f"fatal error {err.name()}"
            _close_quietly(self._producer)
            raise KafkaUnavailableError(
                f"ledger writer of role {self._role!r} hit a fatal error: {err}"
            ) from exc
        if err is not None and err.txn_requires_abort():
            self._abort()
            raise KafkaUnavailableError(
                f"ledger write for role {self._role!r} was aborted, nothing written: {err}"
            ) from exc
        # Timed out without a definite answer: the commit may still land. Only a new begin()
        # (whose init_transactions settles the transaction) may write for this role again.
        self._dead = f"unknown outcome of a commit ({exc})"
        _close_quietly(self._producer)
        raise KafkaUnavailableError(
            f"ledger write for role {self._role!r} has an unknown outcome: {exc}; re-acquire"
            " leadership, begin() and replay before deciding again"
        ) from exc

    def _abort(self) -> None:
        try:
            self._producer.abort_transaction(self._ledger.config.request_timeout)
        except Exception as exc:  # noqa: BLE001 - if abort fails the producer is unusable
            self._dead = f"abort failed ({exc})"
            _close_quietly(self._producer)

    def close(self) -> None:
        """Abort any open transaction and close the producer."""
        if self._dead is None:
            self._dead = "closed"
            _close_quietly(self._producer)

    def release(self) -> None:
        """End this writer, handing a healthy producer back to the ledger for the role's next
        claim in this process (:meth:`KafkaLedger.resume`); otherwise :meth:`close`.

        Call it only while the role's leadership holds (never after a fence, a lost lease or
        an error): the caller's word that nothing is known to have gone wrong. A producer
        that erred, was fenced, or has not replayed since its fence is closed instead.
        """
        if (self._dead is not None or self._erred or self._seen is None
                or not self._ledger.config.keep_clients):
            self.close()
            return
        self._dead = "released"
        self._ledger._keep(self._role, self._producer, self._seen)
