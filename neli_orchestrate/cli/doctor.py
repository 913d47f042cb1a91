"""``neli-orchestrate doctor``: do the cluster and the settings give the guarantees? Each finding
comes with its fix; the exit code is 1 if any finding is an error.

Every permission is *tried*, never inferred from ACL listings: describe the groups and topics,
commit an offset for a throwaway group, write a record to the leader topic, and
``init_transactions()`` plus an aborted transaction on the ledger topic with a throwaway
transactional id under the namespace's prefix. Nothing readers act on is left behind: the
leader-topic record is not a heartbeat, the ledger record is aborted (read_committed readers
never see it), and the throwaway group is deleted.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import click
from rich.text import Text

from neli_orchestrate import NeliConfig
from neli_orchestrate.cli._context import Target, connection_options, setting_option
from neli_orchestrate.cli._output import emit, json_option, progress, stdout, table
from neli_orchestrate.errors import ConfigError
from neli_orchestrate.observe import (
    COORDINATOR_REQUEST_TIMEOUT,
    broker_config,
    broker_timeouts,
    describe_config,
    group_prefix,
    group_protocol,
    open_ledger_transaction,
    ride_through,
)

if TYPE_CHECKING:
    from neli_orchestrate.observe import BrokerTimeouts, ResolvedConfig

__all__ = ["Finding", "broker_release", "diagnose", "doctor"]

OK, WARNING, ERROR = "ok", "warning", "error"


@dataclass(frozen=True)
class Finding:
    check: str
    level: str
    message: str
    fix: str = ""


def _ck() -> Any:
    import confluent_kafka
    import confluent_kafka.admin  # noqa: F401

    return confluent_kafka


def _code(exc: BaseException) -> str:
    args = getattr(exc, "args", ())
    err = args[0] if args else None
    name = getattr(err, "name", None)
    return str(name()) if callable(name) else ""


#: The Kafka releases the compatibility job tests (README.md, "Supported Kafka").
OLDEST_TESTED, NEWEST_TESTED = "3.9.1", "4.4.0"


def broker_release(broker: dict[str, str] | None) -> tuple[str | None, str]:
    """The broker's Kafka release as far as its configuration tells, and how it was read.

    Clients are not told a broker's release. A 3.x broker still lists
    ``inter.broker.protocol.version`` (e.g. ``3.9-IV0``: release 3.9); 4.0 removed it, with
    every ZooKeeper setting, so a broker without either is 4.x.
    """
    if broker is None:
        return None, "the broker's configuration is not readable"
    ibp = broker.get("inter.broker.protocol.version")
    if ibp:
        return ibp.split("-", 1)[0], f"inter.broker.protocol.version={ibp}"
    if any(key.startswith("zookeeper.") for key in broker):
        return None, "a ZooKeeper-era broker without inter.broker.protocol.version"
    return "4.x", "no inter.broker.protocol.version or ZooKeeper settings (removed in 4.0)"


#: Allowance after the controller fences a dead broker until the clients are answered again:
#: the in-sync change or the new leader's election, and the clients finding the new leader.
#: Measured on a loaded two-core machine (tests/regions/test_broker_crash_ride_through.py):
#: up to 13.1 s of stall with a 9 s broker session when the heartbeat partition's leader died.
_ISR_CHANGE = 4.0


def _ride_through_floor(r: ResolvedConfig, protocol: str, timeouts: BrokerTimeouts) -> float:
    """The session above which ``r``'s members ride through a broker's crash, heartbeat
    timeout derived (a third of the session): R = 2/3 session - what R loses besides the
    stop budget, which must exceed the stall plus a heartbeat interval."""
    extra = r.clock_error + (0.0 if protocol == "classic"
                             else r.group_heartbeat_interval + timeouts.coordinator_write)
    return 1.5 * (timeouts.session + _ISR_CHANGE + r.heartbeat_interval + extra)


def ride_through_check(r: ResolvedConfig, protocol: str,
                       broker: Mapping[str, str] | None) -> tuple[str, str, str]:
    """Can a leader ride through one broker's crash (protocol.md, 8a)? (level, message, fix).

    A crash stalls the heartbeat partition and the offsets topic until the controller fences
    the dead broker (``broker.session.timeout.ms``); a follower that lives but stops fetching
    holds them for ``replica.lag.time.max.ms``. A leader rides through a stall ``S`` when its
    last accepted commit (at most ``heartbeat_interval`` before the crash) plus the ride-through
    bound ``R`` lies beyond it: ``S + heartbeat_interval < R``.
    """
    timeouts = broker_timeouts(broker)
    read = timeouts.read
    fence, lag, write = timeouts.session, timeouts.replica_lag, timeouts.coordinator_write
    ride = ride_through(r, protocol, timeouts)
    stall = fence + _ISR_CHANGE
    need = stall + r.heartbeat_interval
    source = "the broker's" if read else "Kafka's default (the broker's are unreadable)"
    stop = (f"stop budget (session_timeout - heartbeat_timeout) / 2 = {r.stop_budget:.2f} s, "
            f"the time the work gets to stop")
    if protocol == "classic":
        bound = (f"session_timeout {r.session_timeout:g} s - clock_error {r.clock_error:g} s - "
                 f"{stop}")
    else:
        bound = (f"session_timeout {r.session_timeout:g} s - group heartbeat "
                 f"{r.group_heartbeat_interval:g} s - {timeouts.COORDINATOR_WRITE_KEY} "
                 f"{write:g} s - clock_error {r.clock_error:g} s - {stop}")
    wanted = _ride_through_floor(r, protocol, timeouts)
    arithmetic = (f"a dead broker stalls the heartbeat partition and __consumer_offsets for up "
                  f"to broker.session.timeout.ms {fence:g} s ({source}) + {_ISR_CHANGE:g} s "
                  f"for the in-sync sets or the leader to change and the clients to follow; "
                  f"a leader rides through while that plus heartbeat_interval "
                  f"{r.heartbeat_interval:g} s = {need:g} s stays below "
                  f"the ride-through bound R = {bound} = {max(ride, 0.0):.2f} s")
    if ride <= 0:
        arithmetic += f" (R would not exceed heartbeat_timeout {r.heartbeat_timeout:g} s: off)"
    lagging = (f"a follower that lives but stops fetching holds them for "
               f"replica.lag.time.max.ms {lag:g} s, which "
               + ("this bound covers too" if lag + _ISR_CHANGE + r.heartbeat_interval < ride
                  else "no leader rides through: it is fenced and leads again afterwards"))
    if ride > need:
        return OK, f"{protocol} groups: {arithmetic}: {ride:.2f} > {need:g}; {lagging}", ""
    fix = (f"raise session_timeout above {wanted:.1f} s, heartbeat_timeout derived (crash "
           f"failover takes as long)"
           + (", or use classic groups (group_protocol='classic'), whose bound does not "
              "lose the group heartbeat and the write timeout" if protocol != "classic"
              else ""))
    return (WARNING, f"{protocol} groups: one broker's crash can fence every leader (L3 "
            f"does not hold in the worst case): {arithmetic}: {max(ride, 0.0):.2f} <= {need:g}",
            fix)


def failover_check(r: ResolvedConfig, protocol: str,
                   broker: Mapping[str, str] | None) -> tuple[str, str, str]:
    """How long a lost region's run waits for another region (docs/guide/topologies.md):
    (level, message, fix). Always ``ok``: it states the arithmetic and the trade-off.

    A member that dies is removed by its group's coordinator ``session_timeout`` after its
    last heartbeat. When the coordinator's broker dies with it (the region holding both is
    lost), the controller first fences that broker (``broker.session.timeout.ms``), the
    coordinator moves, and the new one restarts every loaded member's session: the take-over
    starts no sooner than ``F + S``, then a rebalance and the claim follow. The shortest
    session that still rides through a broker's crash (:func:`ride_through_check`) is the
    floor of what a shorter session can buy.
    """
    timeouts = broker_timeouts(broker)
    fence, session = timeouts.session, r.session_timeout
    source = "the broker's" if timeouts.read else "Kafka's default"
    shortest = _ride_through_floor(r, protocol, timeouts)
    message = (f"{protocol} groups: a dead leader's run is taken over once its session "
               f"ends, {session:g} s after its last heartbeat; when its group coordinator dies "
               f"with it (a lost region), no sooner than broker.session.timeout.ms {fence:g} s "
               f"({source}) + session_timeout {session:g} s = {fence + session:g} s, as the "
               f"new coordinator restarts every member's session, then a rebalance and the "
               f"claim (a few seconds across regions, docs/internals/chaos.md)")
    fix = ""
    if session > shortest + 1:
        fix = (f"for a faster take-over, lower session_timeout, but keep it above "
               f"{shortest:.1f} s to ride through a broker's crash on these settings")
    return OK, message, fix


def _major_minor(release: str) -> tuple[int, int]:
    major, _, rest = release.partition(".")
    return int(major), int(rest.split(".", 1)[0] or 0)


class _Doctor:
    def __init__(self, target: Target, neli: NeliConfig) -> None:
        self.target = target
        self.neli = neli
        self.names = target.names
        self.findings: list[Finding] = []
        self.admin: Any = None
        self.broker: dict[str, str] | None = None
        self.brokers = 0
        self.protocol: str = neli.resolved.group_protocol

    def add(self, check: str, level: str, message: str, fix: str = "") -> None:
        self.findings.append(Finding(check, level, message, fix))

    # -- checks ---------------------------------------------------------------------------

    def reachability(self) -> bool:
        ck = _ck()
        t = self.target
        self.admin = t.admin_client()
        try:
            metadata = self.admin.list_topics(timeout=t.timeout)
        except ck.KafkaException as exc:
            self.add("broker", ERROR,
                     f"no broker at {t.bootstrap_servers} answered within {t.timeout:g} s "
                     f"({exc.args[0].str() if exc.args else exc})",
                     "check the address, that the listener is reachable from here (DNS, "
                     "firewall), and security.protocol/sasl.*/ssl.* (-X key=value)")
            return False
        self.brokers = len(metadata.brokers)
        self.add("broker", OK, f"{self.brokers} broker(s) answer at {t.bootstrap_servers} "
                 f"(cluster {metadata.cluster_id})")
        self.broker = broker_config(self.admin, t.timeout)
        if self.broker is None:
            self.add("broker", WARNING, "cannot read the broker's configuration, so the "
                     "broker-side timeout checks below are skipped",
                     "grant DESCRIBE_CONFIGS on the cluster to this principal for the doctor")
        return True

    def version(self) -> None:
        release, how = broker_release(self.broker)
        tested = f"the tested range is Kafka {OLDEST_TESTED} to {NEWEST_TESTED}"
        if release is None:
            self.add("version", WARNING, f"cannot tell the broker's Kafka release ({how}); "
                     f"{tested}", "grant DESCRIBE_CONFIGS on the cluster to read it")
        elif release == "4.x" or _major_minor(release) >= _major_minor(OLDEST_TESTED):
            self.add("version", OK, f"Kafka {release} ({how}); {tested}")
        else:
            self.add("version", WARNING, f"Kafka {release} ({how}) is older than the oldest "
                     f"tested release; {tested}", f"upgrade the brokers to {OLDEST_TESTED} or "
                     f"later")

    def kip848(self) -> None:
        r = self.neli.resolved
        self.protocol, why = group_protocol(self.broker, r)
        # One row: which protocol members use and why (the reason names the broker's support).
        self.add("kip-848", OK, f"members use the {self.protocol} group protocol: {why}")
        if self.broker is None:
            return
        protocols = self.broker.get("group.coordinator.rebalance.protocols", "classic")
        if "consumer" not in [p.strip() for p in protocols.split(",")]:
            level = ERROR if self.protocol == "consumer" else WARNING
            self.add("kip-848", level,
                     f"the broker does not offer the KIP-848 protocol "
                     f"(group.coordinator.rebalance.protocols={protocols})",
                     "run Kafka 4.x (or 3.7+ with the consumer protocol enabled), or use "
                     "group_protocol='classic'")

    def _range(self, check: str, value_ms: int, low_key: str, high_key: str, what: str,
               level: str) -> None:
        assert self.broker is not None
        low = int(self.broker.get(low_key, "0"))
        high = int(self.broker.get(high_key, str(2**31)))
        if low <= value_ms <= high:
            self.add(check, OK, f"{what} {value_ms} ms is within the broker's "
                     f"[{low_key}={low}, {high_key}={high}]")
        else:
            self.add(check, level, f"{what} {value_ms} ms is outside the broker's "
                     f"[{low_key}={low}, {high_key}={high}]: the broker refuses such members",
                     f"set the session timeout within [{low}, {high}] ms, or change "
                     f"{low_key}/{high_key} on the brokers")

    def timeouts(self) -> None:
        r = self.neli.resolved
        self.add("timeouts", OK,
                 f"heartbeat_timeout {r.heartbeat_timeout:g} s + clock_error {r.clock_error:g} s "
                 f"+ group heartbeat {r.group_heartbeat_interval:g} s < session_timeout "
                 f"{r.session_timeout:g} s; revoke barrier {r.revoke_timeout:g} s < "
                 f"max_poll_interval {r.max_poll_interval:g} s (profile {r.profile}, "
                 f"group_protocol {r.group_protocol})")
        if self.broker is None:
            return
        session_ms = round(r.session_timeout * 1000)
        heartbeat_ms = round(r.group_heartbeat_interval * 1000)
        # the protocol the members will use must accept the timings; the other one only matters
        # if the deployments switch
        classic = ERROR if self.protocol == "classic" else WARNING
        consumer = ERROR if self.protocol == "consumer" else WARNING
        self._range("timeouts", session_ms, "group.min.session.timeout.ms",
                    "group.max.session.timeout.ms", "classic-protocol session timeout", classic)
        self._range("timeouts", session_ms, "group.consumer.min.session.timeout.ms",
                    "group.consumer.max.session.timeout.ms", "KIP-848 session timeout",
                    consumer)
        self._range("timeouts", heartbeat_ms, "group.consumer.min.heartbeat.interval.ms",
                    "group.consumer.max.heartbeat.interval.ms", "KIP-848 heartbeat interval",
                    consumer)
        if self.protocol == "consumer":
            default = int(self.broker.get("group.consumer.session.timeout.ms", "45000")) / 1000
            if r.heartbeat_timeout + r.clock_error >= default:
                self.add("timeouts", WARNING,
                         f"the broker's default KIP-848 session ({default:g} s) is too short "
                         f"for heartbeat_timeout {r.heartbeat_timeout:g} s: a group whose "
                         f"settings cannot be written falls back to it",
                         "keep apply_group_config=True and grant ALTER_CONFIGS on the groups")
        tx_max = int(self.broker.get("transaction.max.timeout.ms", "900000"))
        tx = round(self.target.ledger_config().transaction_timeout * 1000)
        if tx > tx_max:
            self.add("timeouts", ERROR, f"the ledger's transaction timeout {tx} ms exceeds the "
                     f"broker's transaction.max.timeout.ms={tx_max}",
                     "lower KafkaLedgerConfig.transaction_timeout")

    def ride_through(self) -> None:
        if self.brokers < 2:
            self.add("ride-through", OK, f"{self.brokers} broker: a broker's crash is an "
                     "outage of the cluster, not a stall to ride through")
            return
        level, message, fix = ride_through_check(self.neli.resolved, self.protocol,
                                                 self.broker)
        self.add("ride-through", level, message, fix)
        self.add("failover", *failover_check(self.neli.resolved, self.protocol, self.broker))

    def topics(self) -> dict[str, int]:
        """Describe both topics (a tried DESCRIBE); check the ledger's policy and replication."""
        ck = _ck()
        t, names = self.target, self.names
        found: dict[str, int] = {}
        for topic, what in ((names.leader_topic, "leader topic"),
                            (names.ledger_topic, "ledger topic")):
            try:
                meta = self.admin.list_topics(topic=topic, timeout=t.timeout).topics.get(topic)
            except ck.KafkaException as exc:
                self.add("acl", ERROR, f"describing {what} {topic!r} failed: {exc}")
                continue
            code = meta.error.name() if meta is not None and meta.error is not None else ""
            if "AUTHORIZATION" in code:
                self.add("acl", ERROR, f"DESCRIBE on {what} {topic!r} denied ({code})",
                         f"grant DESCRIBE, READ and WRITE on topic {topic!r}")
                continue
            if meta is None or code or not meta.partitions:
                self._missing_topic(topic, what)
                continue
            found[topic] = len(meta.partitions)
            self.add("acl", OK, f"DESCRIBE on {what} {topic!r} allowed")
            if topic == names.ledger_topic:
                self._ledger_topic(topic, meta)
        return found

    def _missing_topic(self, topic: str, what: str) -> None:
        """A topic not created yet is fine when this principal may create it: tried, not
        guessed (a validate-only CreateTopics checks the ACL and the settings, creates nothing)."""
        ck = _ck()
        t = self.target
        compact = " with cleanup.policy=compact" if topic == self.names.ledger_topic else ""
        new = ck.admin.NewTopic(topic, 1, replication_factor=-1)
        try:
            self.admin.create_topics([new], operation_timeout=t.timeout, validate_only=True)[
                topic].result(timeout=t.timeout + 5)
        except ck.KafkaException as exc:
            code = _code(exc)
            if "ALREADY_EXISTS" in code:  # created meanwhile by a member
                self.add("topics", OK, f"{what} {topic!r} exists (created just now)")
            elif "AUTHORIZATION" in code:
                self.add("acl", ERROR, f"{what} {topic!r} does not exist and CREATE on it is "
                         f"denied ({code})", f"create it yourself{compact}, or grant CREATE on "
                         f"topic {topic!r}")
            else:
                self.add("topics", WARNING, f"{what} {topic!r} does not exist yet, and a "
                         f"validate-only create failed ({code or exc})",
                         f"create it yourself{compact}")
            return
        self.add("topics", OK, f"{what} {topic!r} does not exist yet: the first member creates "
                 "it (CREATE allowed, tried with a validate-only request)")

    def _ledger_topic(self, topic: str, meta: Any) -> None:
        settings = describe_config(self.admin, "TOPIC", topic, self.target.timeout)
        if settings is None:
            self.add("ledger", WARNING, f"cannot read the settings of ledger topic {topic!r}",
                     f"grant DESCRIBE_CONFIGS on topic {topic!r}")
            return
        policy = [p.strip() for p in settings.get("cleanup.policy", "delete").split(",")]
        if "compact" not in policy:
            self.add("ledger", ERROR,
                     f"ledger topic {topic!r} has cleanup.policy={','.join(policy)}: retention "
                     f"deletes completed runs, which would then run again",
                     f"kafka-configs --alter --entity-type topics --entity-name {topic} "
                     f"--add-config cleanup.policy=compact")
        elif "delete" in policy:
            self.add("ledger", WARNING, f"ledger topic {topic!r} has cleanup.policy="
                     f"{','.join(policy)}: retention also deletes completed runs",
                     f"set cleanup.policy=compact on {topic}")
        else:
            self.add("ledger", OK, f"ledger topic {topic!r} is compacted")
        replicas = min(len(p.replicas) for p in meta.partitions.values())
        min_isr = int(settings.get("min.insync.replicas", "1"))
        if replicas < min(3, self.brokers):
            self.add("ledger", WARNING,
                     f"ledger topic {topic!r} has replication factor {replicas} on a cluster "
                     f"of {self.brokers} broker(s): losing a broker can lose the ledger",
                     "recreate it (while nothing runs) with replication factor 3 and "
                     "min.insync.replicas=2, or reassign partitions")
        elif replicas > 1 and min_isr < 2:
            self.add("ledger", WARNING,
                     f"ledger topic {topic!r}: min.insync.replicas={min_isr} lets a single "
                     f"replica acknowledge a claim", f"set min.insync.replicas=2 on {topic}")
        else:
            self.add("ledger", OK, f"ledger topic {topic!r}: replication factor {replicas}, "
                     f"min.insync.replicas {min_isr}")
        if settings.get("unclean.leader.election.enable", "false") == "true":
            self.add("ledger", ERROR, f"ledger topic {topic!r} allows unclean leader election:"
                     f" a failover may drop committed claims",
                     f"set unclean.leader.election.enable=false on {topic}")

    def group_acl(self, topics: dict[str, int]) -> None:
        """Tried: describe a role group name, commit an offset for a throwaway group."""
        ck = _ck()
        t, names = self.target, self.names
        probe = names.group_id(f"__neli_doctor_{uuid.uuid4().hex[:8]}")
        try:
            # never librdkafka's own timeout on a coordinator request (core.confluent)
            description = self.admin.describe_consumer_groups(
                [probe], request_timeout=COORDINATOR_REQUEST_TIMEOUT)[probe].result(
                    timeout=t.timeout)
            del description
            self.add("acl", OK, f"DESCRIBE on groups like {probe!r} allowed")
        except ck.KafkaException as exc:
            code = _code(exc)
            if "AUTHORIZATION" in code:
                self.add("acl", ERROR, f"DESCRIBE on group {probe!r} denied ({code})",
                         f"grant DESCRIBE and READ on groups with the prefix "
                         f"{group_prefix(names)!r}")
                return
            self.add("acl", WARNING, f"describing group {probe!r} failed: {exc}")
        if names.leader_topic not in topics:
            return
        consumer = t.consumer_client(**{"group.id": probe, "enable.auto.commit": False})
        try:
            consumer.commit(offsets=[ck.TopicPartition(names.leader_topic, 0, 0)],
                            asynchronous=False)
            self.add("acl", OK, f"READ on groups like {probe!r} and on topic "
                     f"{names.leader_topic!r} allowed (offset commit)")
        except ck.KafkaException as exc:
            code = _code(exc)
            fix = (f"grant READ on groups with the prefix {group_prefix(names)!r}"
                   if "GROUP" in code else f"grant READ on topic {names.leader_topic!r}")
            self.add("acl", ERROR, f"committing an offset for group {probe!r} failed "
                     f"({code or exc})", fix)
            return
        finally:
            consumer.close()
        try:
            self.admin.delete_consumer_groups(
                [probe], request_timeout=COORDINATOR_REQUEST_TIMEOUT)[probe].result(
                    timeout=t.timeout)
        except Exception:  # noqa: BLE001 - the throwaway group expires with its offsets
            pass

    def write_acl(self, topics: dict[str, int]) -> None:
        """Tried: a (non-heartbeat) record to the leader topic; init_transactions and an aborted
        transaction on the ledger topic with a throwaway transactional id."""
        ck = _ck()
        t, names = self.target, self.names
        if names.leader_topic in topics:
            producer = t.producer_client(**{"acks": "all", "linger.ms": 0})
            errors: list[str] = []
            producer.produce(names.leader_topic, key=b"__neli_doctor", value=b"{}",
                             on_delivery=lambda err, msg: errors.append(err.name()) if err
                             else None)
            left = producer.flush(t.timeout)
            if errors or left:
                self.add("acl", ERROR, f"writing to leader topic {names.leader_topic!r} failed "
                         f"({errors[0] if errors else 'no answer'})",
                         f"grant WRITE on topic {names.leader_topic!r}")
            else:
                self.add("acl", OK, f"WRITE on leader topic {names.leader_topic!r} allowed")
        tid = f"{names.transactional_id_prefix}__neli_doctor_{uuid.uuid4().hex[:8]}"
        producer = t.producer_client(**{
            "transactional.id": tid, "transaction.timeout.ms": 10000, "linger.ms": 0})
        try:
            producer.init_transactions(t.timeout)
        except ck.KafkaException as exc:
            code = _code(exc)
            if "CLUSTER_AUTHORIZATION" in code:
                fix = "grant IDEMPOTENT_WRITE on the cluster (or WRITE on the ledger topic)"
            else:
                fix = (f"grant WRITE and DESCRIBE on transactional ids with the prefix "
                       f"{names.transactional_id_prefix!r}")
            self.add("acl", ERROR, f"init_transactions() with transactional id {tid!r} failed "
                     f"({code or exc})", fix)
            return
        self.add("acl", OK, f"transactional ids with the prefix "
                 f"{names.transactional_id_prefix!r} allowed (init_transactions, idempotent "
                 f"write)")
        if names.ledger_topic not in topics:
            return
        errors = []
        try:
            producer.begin_transaction()
            producer.produce(names.ledger_topic, key=b"__neli_doctor", value=None, partition=0,
                             on_delivery=lambda err, msg: errors.append(err.name()) if err
                             else None)
            producer.flush(t.timeout)
            producer.abort_transaction(t.timeout)
        except ck.KafkaException as exc:
            errors.append(_code(exc) or str(exc))
        if errors:
            self.add("acl", ERROR, f"a transactional write to ledger topic "
                     f"{names.ledger_topic!r} failed ({errors[0]})",
                     f"grant WRITE on topic {names.ledger_topic!r}")
        else:
            self.add("acl", OK, f"transactional WRITE on ledger topic {names.ledger_topic!r} "
                     f"allowed (the probe was aborted)")

    def transactions(self, topics: dict[str, int]) -> None:
        """Transactions open on the ledger longer than the writers' transaction timeout: hanging
        (KIP-664). They hold every replay of the partition back; the broker should have aborted
        them, so the fix is Kafka's own abort."""
        ck = _ck()
        t, names = self.target, self.names
        topic = names.ledger_topic
        if topic not in topics:
            return
        limit = t.ledger_config().transaction_timeout
        now = time.time()
        hanging = 0
        for partition in range(topics[topic]):
            try:
                found = open_ledger_transaction(t, self.admin, partition)
            except (ck.KafkaException, TimeoutError) as exc:
                self.add("transactions", WARNING, f"cannot read the last stable offset of "
                         f"ledger partition {topic}[{partition}]: {exc}",
                         f"grant READ and DESCRIBE on topic {topic!r}")
                continue
            if found is None:
                continue
            age = found.age(now)
            if age is not None and age <= limit:
                self.add("transactions", OK, f"{found.describe(now)}: within the transaction"
                         f" timeout ({limit:g} s), a claim in progress")
                continue
            hanging += 1
            self.add("transactions", ERROR,
                     f"hanging transaction: {found.describe(now)}, longer than the ledger's"
                     f" transaction timeout ({limit:g} s); every replay of the partition waits"
                     " for it and claims of its roles fail",
                     f"if no leader of the role is running, abort it: "
                     f"{found.abort_command(t.bootstrap_servers)} (Kafka 3.0+, KIP-664); a new "
                     f"leader's begin() also aborts its own role's transaction")
        if not hanging:
            self.add("transactions", OK, f"no ledger transaction open longer than the "
                     f"transaction timeout ({limit:g} s)")

    def clock(self) -> None:
        """Offset of this host's clock from the broker's, from a LogAppendTime record."""
        ck = _ck()
        t = self.target
        topic = f"{self.names.leader_topic}.clock"
        meta = self.admin.list_topics(topic=topic, timeout=t.timeout).topics.get(topic)
        if meta is None or meta.error is not None:
            new = ck.admin.NewTopic(topic, 1, replication_factor=-1, config={
                "message.timestamp.type": "LogAppendTime", "retention.ms": "3600000",
                "cleanup.policy": "delete"})
            try:
                self.admin.create_topics([new], operation_timeout=t.timeout)[topic].result(
                    timeout=t.timeout + 5)
            except ck.KafkaException as exc:
                if "ALREADY_EXISTS" not in _code(exc):
                    self.add("clock", WARNING, f"cannot measure the clock offset: creating "
                             f"{topic!r} failed ({_code(exc) or exc})",
                             f"create topic {topic!r} with message.timestamp.type="
                             f"LogAppendTime, or grant CREATE on it")
                    return
        producer = t.producer_client(**{"acks": "all", "linger.ms": 0})
        samples: list[tuple[float, float]] = []  # (offset, uncertainty)
        deadline = time.monotonic() + t.timeout
        for _ in range(5):
            got: list[Any] = []
            sent = time.time()
            producer.produce(topic, value=b"clock", on_delivery=lambda err, msg, got=got:
                             got.append((err, msg, time.time())))
            while not got and time.monotonic() < deadline:
                producer.poll(0.05)
            if not got or got[0][0] is not None:
                break
            _, msg, received = got[0]
            ts_type, ts = msg.timestamp()
            if ts_type != ck.TIMESTAMP_LOG_APPEND_TIME:
                self.add("clock", WARNING, f"topic {topic!r} does not use LogAppendTime; "
                         f"cannot measure the clock offset",
                         f"set message.timestamp.type=LogAppendTime on {topic}")
                return
            samples.append((ts / 1000 - (sent + received) / 2, (received - sent) / 2))
        if not samples:
            self.add("clock", WARNING, f"cannot measure the clock offset: writing to {topic!r}"
                     f" failed", f"grant WRITE on topic {topic!r}")
            return
        offset, error = min(samples, key=lambda s: s[1])  # the tightest round trip
        r = self.neli.resolved
        bound = r.clock_error
        # the broker stamps to the millisecond
        if abs(offset) - error - 0.001 > bound:
            self.add("clock", ERROR,
                     f"this host's clock is {-offset * 1000:+.0f} ms (±{error * 1000:.0f}) off "
                     f"the broker's, more than clock_error {bound:g} s allows",
                     "synchronise clocks (chrony/NTP) on every deployment and broker, or "
                     "raise clock_error and the session timeout with it")
        else:
            self.add("clock", OK, f"this host's clock is {-offset * 1000:+.1f} ms "
                     f"(±{error * 1000:.1f}) off the broker's (allowed: {bound:g} s)")


def diagnose(target: Target, neli: NeliConfig) -> list[Finding]:
    """Run every check against ``target``; the findings, in order."""
    d = _Doctor(target, neli)
    if d.reachability():
        d.version()
        d.kip848()
        d.timeouts()
        d.ride_through()
        topics = d.topics()
        d.transactions(topics)
        d.group_acl(topics)
        d.write_acl(topics)
        d.clock()
    return d.findings


_STYLE = {OK: Text("ok", style="green"), WARNING: Text("warning", style="yellow"),
          ERROR: Text("error", style="bold red")}


@click.command()
@connection_options
@setting_option("profile", "--profile", help="timing profile the deployments use")
@setting_option("group_protocol", "--group-protocol", default="auto", show_default=True,
                help="group protocol the deployments use")
@setting_option("session_timeout", "--session-timeout")
@setting_option("heartbeat_timeout", "--heartbeat-timeout")
@json_option
def doctor(target: Target, profile: str, group_protocol: str, session_timeout: float | None,
           heartbeat_timeout: float | None, as_json: bool) -> int:
    """Check broker, protocol support, timeouts, ACLs (tried), ledger topic and clock."""
    findings: list[Finding]
    try:
        neli = NeliConfig(bootstrap_servers=target.bootstrap_servers, group_id=target.namespace,
                          topic=target.names.leader_topic, profile=profile,
                          group_protocol=group_protocol,  # type: ignore[arg-type]
                          session_timeout=session_timeout, heartbeat_timeout=heartbeat_timeout,
                          kafka_config={k: v for k, v in target.kafka_config.items()})
    except ConfigError as exc:
        findings = [Finding("timeouts", ERROR, str(exc),
                            "change the named setting as the message says")]
    else:
        with progress(f"checking {target.bootstrap_servers} for namespace {target.namespace}"):
            findings = diagnose(target, neli)
    errors = sum(f.level == ERROR for f in findings)
    if as_json:
        emit({"namespace": target.namespace, "bootstrap_servers": target.bootstrap_servers,
              "errors": errors, "findings": [asdict(f) for f in findings]})
    else:
        table(None, ["check", "result", "finding", "fix"],
              [(f.check, _STYLE[f.level], f.message, f.fix) for f in findings])
        stdout.print(f"{errors} error(s), {sum(f.level == WARNING for f in findings)} "
                     f"warning(s)", highlight=False)
    return 1 if errors else 0
