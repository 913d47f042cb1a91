"""The read model: who leads each role, its members, and the ledger's entries, as data.

Usage::

    cluster = ClusterSettings(bootstrap_servers="kafka:9092", namespace="acme")
    for role in collect_status(cluster, roles=[]):          # every role group of the namespace
        print(role.role, role.leader_deployment, role.leader_since)
    view = collect_overview(cluster, deployment="us-east-1")  # leaders + recent ledger entries
    rows = [entry_data(e) for r in view.roles for e in r.runs]

Read-only: describes the role groups, reads the tail of the leader topic and the ledger; never
joins a group (joining would rebalance the group the running leader is in). The command line
(``neli-orchestrate status`` / ``ledger``), the Airflow UI page and the Dagster resource
(:meth:`NeliResource.overview <neli_orchestrate.dagster.NeliResource.overview>`) all read
through here.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, TypeGuard

from neli_orchestrate.core.config import NeliConfig
from neli_orchestrate.core.confluent import COORDINATOR_REQUEST_TIMEOUT
from neli_orchestrate.core.heartbeat import decode_heartbeat
from neli_orchestrate.core.namespace import Namespace
from neli_orchestrate.core.roles import partition_for
from neli_orchestrate.core.topic import COORDINATOR_WRITE_TIMEOUT_KEY, choose_group_protocol
from neli_orchestrate.errors import KafkaUnavailableError
from neli_orchestrate.ledger.cache import end_is_known
from neli_orchestrate.settings import ClusterSettings

if TYPE_CHECKING:
    # The read model's vocabulary, named here (``X as X``: an explicit, type-only re-export)
    # so that the front doors annotate with it without importing the ledger or liveness: the
    # import-linter contract "front-doors-through-the-api" (pyproject.toml) forbids that.
    from neli_orchestrate.core.config import ResolvedConfig as ResolvedConfig
    from neli_orchestrate.ledger.history import HistoryEntry as HistoryEntry
    from neli_orchestrate.ledger.history import LedgerHistory as LedgerHistory
    from neli_orchestrate.ledger.record import LedgerRecord as LedgerRecord
    from neli_orchestrate.ledger.transactions import OpenTransaction
    from neli_orchestrate.liveness import DeploymentLiveness as DeploymentLiveness

__all__ = ["BrokerTimeouts", "LeaderSpell", "MemberStatus", "Overview", "RoleOverview",
           "RoleStatus", "broker_config", "broker_timeouts", "collect_liveness",
           "collect_overview", "collect_status", "describe_config", "entry_data", "group_prefix",
           "group_protocol", "is_completed", "iso_time", "latest_runs", "ledger_time",
           "open_ledger_transaction", "outcome_phrase", "read_ledger", "ride_through",
           "role_of_group", "run_states", "skipped_by_task", "unstopped_note", "unstopped_notes"]

#: Ledger rows an overview keeps per role (newest first).
LEDGER_ROWS = 50


def iso_time(epoch: float | None) -> str:
    """Epoch seconds as an ISO-8601 UTC time (to the millisecond), '' for None."""
    if epoch is None:
        return ""
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")


def _timeouts(target: ClusterSettings) -> dict[str, Any]:
    """A reader's clients give up on a broker after ``connect_timeout``."""
    return {"socket.timeout.ms": int(target.connect_timeout * 1000)}


def group_prefix(names: Namespace) -> str:
    """What every role group id of ``names`` starts with (for prefixed ACLs and discovery)."""
    return names.group_id("\0").split("\0", 1)[0]


def role_of_group(names: Namespace, group_id: str) -> str | None:
    """The role whose NELI group is ``group_id``, or None if it is not one of ``names``."""
    prefix = group_prefix(names)
    if group_id.startswith(prefix) and len(group_id) > len(prefix):
        return group_id[len(prefix):]
    return None


def describe_config(admin: Any, restype: str, name: str, timeout: float) -> dict[str, str] | None:
    """Settings of a broker/topic/group resource, or None if they cannot be read."""
    ck = _ck()
    resource = ck.admin.ConfigResource(getattr(ck.admin.ResourceType, restype), name)
    try:
        entries = admin.describe_configs([resource], request_timeout=timeout)[resource].result(
            timeout=timeout + 5)
    except Exception:  # noqa: BLE001 - not allowed, not supported: the caller reports it
        return None
    return {key: entry.value for key, entry in entries.items() if entry.value is not None}


def broker_config(admin: Any, timeout: float) -> dict[str, str] | None:
    """The settings of one broker of the cluster (the first listed), or None."""
    try:
        metadata = admin.list_topics(timeout=timeout)
    except Exception:  # noqa: BLE001
        return None
    if not metadata.brokers:
        return None
    return describe_config(admin, "BROKER", str(min(metadata.brokers)), timeout)


@dataclass(frozen=True)
class BrokerTimeouts:
    """The broker timeouts that bound a leader's ride-through of a broker crash (protocol.md,
    8a), in seconds: Kafka's defaults where the broker's configuration is unreadable."""

    #: The broker settings read, with Kafka's defaults (milliseconds, as the broker writes them).
    DEFAULTS: ClassVar[dict[str, str]] = {
        "broker.session.timeout.ms": "9000", "replica.lag.time.max.ms": "30000",
        COORDINATOR_WRITE_TIMEOUT_KEY: "5000"}
    #: The name of the setting behind :attr:`coordinator_write` (for messages).
    COORDINATOR_WRITE_KEY: ClassVar[str] = COORDINATOR_WRITE_TIMEOUT_KEY

    #: ``broker.session.timeout.ms``: how long the controller waits before fencing a dead broker.
    session: float
    #: ``replica.lag.time.max.ms``: how long a live follower that stops fetching stays in sync.
    replica_lag: float
    #: ``offsets.commit.timeout.ms``: a KIP-848 group coordinator's write bound.
    coordinator_write: float
    #: False when these are Kafka's defaults because the broker's configuration was unreadable.
    read: bool


def broker_timeouts(broker: Mapping[str, str] | None) -> BrokerTimeouts:
    """:class:`BrokerTimeouts` of a broker's configuration (:func:`broker_config`; None if
    unreadable); a value that is not a whole number of milliseconds counts as Kafka's default."""
    conf = {**BrokerTimeouts.DEFAULTS, **(broker or {})}

    def seconds(key: str) -> float:
        try:
            return int(conf[key]) / 1000
        except (TypeError, ValueError):
            return int(BrokerTimeouts.DEFAULTS[key]) / 1000

    return BrokerTimeouts(session=seconds("broker.session.timeout.ms"),
                          replica_lag=seconds("replica.lag.time.max.ms"),
                          coordinator_write=seconds(COORDINATOR_WRITE_TIMEOUT_KEY),
                          read=broker is not None)


def group_protocol(broker: Mapping[str, str] | None, config: ResolvedConfig) -> tuple[str, str]:
    """The group protocol members of ``config`` use on a broker with this configuration, and
    why: the members' own choice (:func:`neli_orchestrate.core.topic.choose_group_protocol`)."""
    return choose_group_protocol(broker, config)


def ride_through(config: ResolvedConfig, protocol: str, timeouts: BrokerTimeouts) -> float:
    """The ride-through bound ``R`` (seconds) of ``config``'s members in ``protocol`` groups
    on a broker with ``timeouts``: how long a stall of the heartbeat partition and the offsets
    topic a leader outlasts (:attr:`~neli_orchestrate.core.config.ResolvedConfig.ride_through`)."""
    return replace(config, group_protocol=protocol,  # type: ignore[arg-type]
                   coordinator_write_timeout=timeouts.coordinator_write).ride_through


def open_ledger_transaction(target: ClusterSettings, admin: Any,
                            partition: int) -> OpenTransaction | None:
    """The transaction holding ledger partition ``partition``'s last stable offset below its
    high watermark (writer, role, since when: :class:`~neli_orchestrate.ledger.transactions.
    OpenTransaction`), or None when none does. Raises ``KafkaException`` or ``TimeoutError``
    when the broker does not answer: that is no answer, never "none open"."""
    from neli_orchestrate.ledger.transactions import find_open_transaction

    names = target.names
    return find_open_transaction(
        admin, lambda settings: target.consumer_client(**settings), names.ledger_topic,
        partition, names.transactional_id_prefix, timeout=target.connect_timeout)


#: How many records of the leader topic's tail are read per partition to find heartbeats.
TAIL_RECORDS = 5000
#: How many spells of leadership (newest last) a role's timeline keeps.
TIMELINE_SPELLS = 20


@dataclass
class LeaderSpell:
    """One stretch of leadership seen in the leader topic: a member's run of heartbeats.

    ``start`` and ``end`` are the wall times (broker timestamps) of its first and last
    heartbeat read; a gap longer than the heartbeat lease starts a new spell.
    """

    member: str
    deployment: str | None
    start: float
    end: float
    heartbeats: int


@dataclass
class MemberStatus:
    member_id: str
    client_id: str
    host: str
    partitions: list[int]
    #: The member's NELI id (``name#suffix``) seen in its newest heartbeat, if any.
    neli_member: str | None = None
    heartbeat_age: float | None = None


@dataclass
class RoleStatus:
    role: str
    group: str
    state: str
    protocol: str
    partition: int | None
    members: list[MemberStatus] = field(default_factory=list)
    leader_member: str | None = None
    leader_deployment: str | None = None
    leader_heartbeat_age: float | None = None
    #: Wall time of the first heartbeat of the leader's current spell (None: no leader).
    leader_since: float | None = None
    session_timeout_ms: int | None = None
    heartbeat_interval_ms: int | None = None
    session_source: str = ""
    committed_offset: int | None = None
    end_offset: int | None = None
    lag: int | None = None
    notes: list[str] = field(default_factory=list)
    #: Who led the role, oldest first, from the heartbeats in the leader topic's tail of the
    #: members known to belong to the role (its group's members and its ledger records).
    timeline: list[LeaderSpell] = field(default_factory=list)
    #: The role's most recent run in the ledger: ``"run K: <outcome_phrase> (token t, at T)"``,
    #: e.g. ``run '2013-01-05': skipped by the task in us-east-1 (token 4, at ...)``.
    last_run: str | None = None


def collect_liveness(target: ClusterSettings, admin: Any | None = None) -> list[DeploymentLiveness]:
    """Every deployment of the namespace that ever announced its liveness, by name (read-only:
    nobody joins). ``admin``: the seam's admin (or a test's fake); made here if None."""
    from neli_orchestrate.liveness import LivenessReader

    if admin is None:
        from neli_orchestrate.core.confluent import ConfluentKafka

        admin = ConfluentKafka().admin(target.client_config())
    return LivenessReader(admin, target.namespace,
                          request_timeout=target.connect_timeout).read_all()


def _ck() -> Any:
    import confluent_kafka
    import confluent_kafka.admin  # noqa: F401

    return confluent_kafka


def _enum_name(value: Any) -> str:
    name = getattr(value, "name", None)
    return str(name if name is not None else value).lower()


def _role_groups(admin: Any, target: ClusterSettings) -> dict[str, str]:
    """{role: group id} of every consumer group of the namespace the cluster knows."""
    names = target.names
    result = admin.list_consumer_groups(request_timeout=target.connect_timeout).result(
        timeout=target.connect_timeout + 5)
    roles = {}
    for listing in result.valid:
        if names.is_liveness_group(listing.group_id):
            continue  # a deployment's liveness group, not a role's
        role = role_of_group(names, listing.group_id)
        if role is not None:
            roles[role] = listing.group_id
    return roles


def _heartbeat_ends(admin: Any, target: ClusterSettings, topic: str, count: int
                    ) -> tuple[dict[int, int], dict[int, str]]:
    """The end offset of each heartbeat partition, and why a partition's could not be read.

    A sentinel (-1001 while the partition's leader changes) or an error is asked again until
    the connect timeout, and never read as an empty partition: a partition whose end stays
    unknown is reported as unread, not as "no heartbeat" (which would say its leader is fenced).
    """
    ck = _ck()
    ends: dict[int, int] = {}
    unread: dict[int, str] = {}
    deadline = time.monotonic() + target.connect_timeout
    while count:
        tps = [ck.TopicPartition(topic, p) for p in range(count) if p not in ends]
        unread = {}
        try:
            offsets = admin.list_offsets({tp: ck.admin.OffsetSpec.latest() for tp in tps},
                                         request_timeout=target.connect_timeout)
        except ck.KafkaException as exc:
            unread = {tp.partition: str(exc) for tp in tps}
            offsets = {}
        for tp, future in offsets.items():
            try:
                end = int(future.result(timeout=target.connect_timeout + 5).offset)
            except Exception as exc:  # noqa: BLE001 - per partition, asked again below
                unread[tp.partition] = f"{type(exc).__name__}: {exc}"
                continue
            if end_is_known(end):
                ends[tp.partition] = end
            else:
                unread[tp.partition] = f"the broker answered offset {end}"
        if not unread or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    return ends, unread


def _heartbeats(target: ClusterSettings, topic: str, partitions: Sequence[int],
                ends: dict[int, int]) -> list[tuple[float, str, int]]:
    """Every heartbeat in the topic's tail: (wall time, NELI member id, partition), by time."""
    ck = _ck()
    todo = {p: ends[p] for p in partitions if ends.get(p, 0) > 0}
    seen: list[tuple[float, str, int]] = []
    if not todo:
        return seen
    consumer = target.consumer_client(**_timeouts(target), **{
        "group.id": f"neli-status-{uuid.uuid4().hex}",  # assign() only: never joins
        "enable.auto.commit": False, "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
    })
    deadline = time.monotonic() + target.connect_timeout
    try:
        consumer.assign([ck.TopicPartition(topic, p, max(0, end - TAIL_RECORDS))
                         for p, end in todo.items()])
        while todo and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=1000, timeout=0.2):
                error = message.error()
                if error is not None:
                    if error.code() == ck.KafkaError._PARTITION_EOF:
                        todo.pop(message.partition(), None)
                    continue
                if message.offset() + 1 >= todo.get(message.partition(), 0):
                    todo.pop(message.partition(), None)
                beat = decode_heartbeat(message.key(), message.value())
                if beat is None:
                    continue
                _, ts = message.timestamp()
                wall = ts / 1000 if ts and ts > 0 else beat.sent_wall
                seen.append((wall, beat.member, message.partition()))
    finally:
        consumer.close()
    seen.sort()
    return seen


def _newest(beats: Sequence[tuple[float, str, int]]) -> dict[str, tuple[float, int]]:
    """{NELI member id: (wall time of its newest heartbeat, partition)}."""
    newest: dict[str, tuple[float, int]] = {}
    for wall, member, partition in beats:
        newest[member] = (wall, partition)  # beats are in time order
    return newest


def _timeline(beats: Sequence[tuple[float, str, int]], partition: int, members: set[str],
              deployments: dict[str, str], lease: float) -> list[LeaderSpell]:
    """Spells of leadership on ``partition`` by ``members``: a new one on a change of member or
    after a gap longer than the lease (the member lost it, or fenced itself, and came back)."""
    spells: list[LeaderSpell] = []
    for wall, member, p in beats:
        if p != partition or member not in members:
            continue
        last = spells[-1] if spells else None
        if last is not None and last.member == member and wall - last.end <= lease:
            last.end = wall
            last.heartbeats += 1
        else:
            spells.append(LeaderSpell(member=member, deployment=deployments.get(member),
                                      start=wall, end=wall, heartbeats=1))
    return spells[-TIMELINE_SPELLS:]


def read_ledger(target: ClusterSettings, roles: Sequence[str] | None = None) -> LedgerHistory:
    """The ledger of ``roles`` (every role if None), read to its end. Raises
    :class:`~neli_orchestrate.errors.KafkaUnavailableError` when it cannot be read: an
    unreadable ledger is never an empty one."""
    from neli_orchestrate.ledger.history import read_history

    return read_history(target.ledger_config(), roles=roles)


def run_states() -> list[str]:
    """The ledger's run states, in their lifecycle order: ``CLAIMED``, ``RUNNING``, ..."""
    from neli_orchestrate.ledger.record import RunState

    return [state.value for state in RunState]


def ledger_time(at: float | None) -> str:
    """A ledger timestamp as the ledger's own log lines write it (``2013-01-05T06:00:00Z``),
    for messages that quote a record beside :meth:`LedgerRecord.describe`."""
    from neli_orchestrate.ledger.record import format_epoch

    return format_epoch(at)


def is_completed(record: LedgerRecord | None) -> TypeGuard[LedgerRecord]:
    """True for a ``COMPLETED`` record: the run key ran (or its work skipped itself)."""
    from neli_orchestrate.ledger.record import RunState

    return record is not None and record.state is RunState.COMPLETED


def skipped_by_task(record: LedgerRecord | None) -> bool:
    """True for a ``COMPLETED`` record whose work skipped itself: it produced nothing, so no
    front door materializes or emits asset events for it by proxy (the decision table's rule,
    :func:`neli_orchestrate.decision.skipped_by_work`)."""
    from neli_orchestrate.decision import skipped_by_work

    return skipped_by_work(record)


def _read_ledger(target: ClusterSettings, roles: Sequence[str],
                 history: LedgerHistory | None = None) -> LedgerHistory | None:
    """``history`` if given, else the ledger of ``roles``; None if it cannot be read."""
    if history is None:
        try:
            history = read_ledger(target, roles)
        except KafkaUnavailableError:
            return None
    return history


def _ledger_members(history: LedgerHistory | None) -> dict[tuple[str, str], str]:
    """{(role, NELI member id): deployment} from the ledger; empty if it cannot be read."""
    if history is None:
        return {}
    return {(e.role, e.record.member): e.record.deployment for e in history.entries
            if e.record is not None and e.role is not None}


def unstopped_note(entry: HistoryEntry) -> str | None:
    """"run R: <application> may still be running (...)" for a record that names a remote
    application nobody confirmed stopped (the record's ``unstopped``: a failed try's
    unconfirmed kill, or an earlier token's application a later claim inherited); else None."""
    record = entry.record
    if record is None or not record.unstopped:
        return None
    return (f"run {record.run_key!r}: {', '.join(record.unstopped)} may still be running "
            f"(not confirmed stopped as of the {record.state} record of token {record.token} "
            f"at {iso_time(record.at)} in deployment {record.deployment!r}); check the cluster "
            f"manager and kill it if so")


def unstopped_notes(history: LedgerHistory | None) -> dict[str, list[str]]:
    """{role: notes} of every run whose latest record names an application which may still be
    running (:func:`unstopped_note`), oldest first."""
    latest: dict[tuple[str, str], HistoryEntry] = {}
    for entry in history.entries if history is not None else ():
        if entry.role is not None and entry.run_key is not None:
            latest.pop((entry.role, entry.run_key), None)  # keep the ledger's order
            latest[(entry.role, entry.run_key)] = entry
    notes: dict[str, list[str]] = {}
    for (role, _), entry in latest.items():
        note = unstopped_note(entry)
        if note is not None:
            notes.setdefault(role, []).append(note)
    return notes


#: How each state reads after "run K: ".
_STATE_PHRASES = {"CLAIMED": "claimed by", "RUNNING": "running in", "COMPLETED": "completed in",
                  "FAILED": "failed in", "RESET": "reset by"}


def outcome_phrase(record: LedgerRecord) -> str:
    """How a run key stands, in the words every front door uses: ``"completed in us-east-1"``,
    ``"skipped by the task in us-east-1"`` (a ``COMPLETED`` record whose work skipped itself:
    it produced nothing, so no region emits asset events or materializations by proxy for it),
    ``"failed in eu-west-1"``, ``"running in ..."``, ``"claimed by ..."``, ``"reset by ..."``."""
    from neli_orchestrate.decision import SKIPPED_BY_TASK

    if skipped_by_task(record):
        return f"{SKIPPED_BY_TASK} in {record.deployment}"
    state = str(record.state.value)
    return f"{_STATE_PHRASES.get(state, state.lower())} {record.deployment}"


def latest_runs(history: LedgerHistory | None) -> dict[str, str]:
    """{role: "run K: <outcome_phrase> (token t, at T)"} of each role's most recent record."""
    newest: dict[str, LedgerRecord] = {}
    for entry in history.entries if history is not None else ():
        record = entry.record
        if record is None or entry.role is None:
            continue
        known = newest.get(entry.role)
        if known is None or record.at >= known.at:
            newest[entry.role] = record
    return {role: (f"run {r.run_key!r}: {outcome_phrase(r)} (token {r.token}, at "
                   f"{iso_time(r.at)})") for role, r in newest.items()}


def _group_session(admin: Any, target: ClusterSettings, group: str,
                   broker: dict[str, str]) -> tuple[int | None, int | None, str]:
    settings = describe_config(admin, "GROUP", group, target.connect_timeout) or {}
    session = settings.get("consumer.session.timeout.ms")
    heartbeat = settings.get("consumer.heartbeat.interval.ms")
    if session is not None:
        return int(session), int(heartbeat) if heartbeat else None, "group config"
    session = broker.get("group.consumer.session.timeout.ms")
    heartbeat = broker.get("group.consumer.heartbeat.interval.ms")
    return (int(session) if session else None, int(heartbeat) if heartbeat else None,
            "broker default")


def collect_status(target: ClusterSettings, roles: Sequence[str], *, profile: str = "default",
                   now: float | None = None,
                   history: LedgerHistory | None = None) -> list[RoleStatus]:
    """The status of ``roles`` (all roles with a consumer group if empty).

    ``history``: the ledger as already read by the caller (it names each member's deployment);
    read here if not given.
    """
    ck = _ck()
    names = target.names
    lease = NeliConfig(profile=profile).resolved.heartbeat_timeout
    admin = target.admin_client(**_timeouts(target))
    try:
        # first: an unreachable cluster must be an error, not "no roles"
        metadata = admin.list_topics(topic=names.leader_topic, timeout=target.connect_timeout)
        groups = ({role: names.group_id(role) for role in roles} if roles
                  else _role_groups(admin, target))
        if not groups:
            return []
        # librdkafka never times a coordinator request out itself: a late coordinator would
        # abort the process (core.confluent.COORDINATOR_REQUEST_TIMEOUT); the waits below do
        described = admin.describe_consumer_groups(
            list(groups.values()), request_timeout=COORDINATOR_REQUEST_TIMEOUT)
    except ck.KafkaException as exc:
        raise KafkaUnavailableError(
            f"cannot read the groups of namespace {target.namespace!r} at "
            f"{target.bootstrap_servers}: {exc}") from exc
    meta = metadata.topics.get(names.leader_topic)
    count = len(meta.partitions) if meta is not None and meta.error is None else 0
    ends, unread = _heartbeat_ends(admin, target, names.leader_topic, count)
    all_beats = _heartbeats(target, names.leader_topic, list(range(count)), ends)
    beats = _newest(all_beats)
    history = _read_ledger(target, list(groups), history)
    deployments = _ledger_members(history)
    unstopped = unstopped_notes(history)
    last_runs = latest_runs(history)
    broker = broker_config(admin, target.connect_timeout) or {}
    wall = time.time() if now is None else now

    result = []
    for role, group in sorted(groups.items()):
        try:
            description = described[group].result(timeout=target.connect_timeout)
        except Exception as exc:  # noqa: BLE001 - shown per role
            result.append(RoleStatus(role=role, group=group, state="unknown", protocol="?",
                                     partition=None, notes=[f"cannot describe group: {exc}"]))
            continue
        protocol = _enum_name(description.type)
        partition = partition_for(0, count) if count else None
        st = RoleStatus(role=role, group=group, state=_enum_name(description.state),
                        protocol=protocol, partition=partition)
        for m in description.members or []:
            tps = getattr(m.assignment, "topic_partitions", None) or []
            member = MemberStatus(
                member_id=m.member_id, client_id=m.client_id, host=m.host,
                partitions=sorted(tp.partition for tp in tps if tp.topic == names.leader_topic))
            name = m.client_id[len("neli-"):] if m.client_id.startswith("neli-") else None
            mine = [(at, neli) for neli, (at, p) in beats.items()
                    if name is not None and neli.rsplit("#", 1)[0] == name and p == partition]
            if mine:
                at, member.neli_member = max(mine)
                member.heartbeat_age = round(max(0.0, wall - at), 3)
            st.members.append(member)
            if partition in member.partitions and member.heartbeat_age is not None and \
                    member.heartbeat_age < lease:
                st.leader_member = member.neli_member
                st.leader_heartbeat_age = member.heartbeat_age
                st.leader_deployment = deployments.get((role, member.neli_member or ""))
        if partition is not None:
            by_member = {m: d for (r, m), d in deployments.items() if r == role}
            known = set(by_member) | {m.neli_member for m in st.members if m.neli_member}
            st.timeline = _timeline(all_beats, partition, known, by_member, lease)
            if st.leader_member is not None:
                spells = [sp for sp in st.timeline if sp.member == st.leader_member]
                st.leader_since = spells[-1].start if spells else None
        holders = [m for m in st.members if partition in m.partitions]
        if partition in unread:
            st.notes.append(f"who leads is not known: the end of heartbeat partition {partition} "
                            f"could not be read ({unread[partition]}); ask again")
        elif holders and st.leader_member is None:
            st.notes.append(f"partition {partition} is assigned but no fresh heartbeat "
                            f"(within {lease:g} s) was seen: the holder is starting or fenced")
        if not st.members:
            st.notes.append("no members: no deployment is leading or waiting for this role")
        st.notes += unstopped.get(role, [])
        st.last_run = last_runs.get(role)
        if protocol == "consumer":
            st.session_timeout_ms, st.heartbeat_interval_ms, st.session_source = _group_session(
                admin, target, group, broker)
        else:
            st.session_source = "client setting of each member (classic protocol)"
        if partition is not None:
            try:
                spec = ck.ConsumerGroupTopicPartitions(
                    group, [ck.TopicPartition(names.leader_topic, partition)])
                future = admin.list_consumer_group_offsets(
                    [spec], request_timeout=COORDINATOR_REQUEST_TIMEOUT)
                committed = future[group].result(timeout=target.connect_timeout)
                offset = committed.topic_partitions[0].offset
                st.end_offset = ends.get(partition)
                if offset is not None and offset >= 0:
                    st.committed_offset = offset
                    st.lag = max(0, (st.end_offset or 0) - offset)
            except Exception as exc:  # noqa: BLE001
                st.notes.append(f"cannot read committed offsets: {exc}")
        result.append(st)
    return result


def entry_data(entry: HistoryEntry) -> dict[str, Any]:
    """One ledger entry as JSON-safe data (times as ISO-8601 UTC)."""
    record = entry.record
    data: dict[str, Any] = {
        "role": entry.role, "run_key": entry.run_key, "partition": entry.partition,
        "offset": entry.offset, "timestamp": iso_time(entry.timestamp),
    }
    if record is not None:
        data.update({
            "state": record.state.value, "token": record.token,
            "deployment": record.deployment, "member": record.member,
            "attempt": record.attempt, "at": iso_time(record.at),
            "handoff_deadline": iso_time(record.handoff_deadline) or None,
            "reason": record.reason,
            # a remote application nobody confirmed stopped (a failed try's, or inherited)
            "unstopped": list(record.unstopped) or None,
            # the remote application this claim's try submitted
            "application": record.application or None,
        })
    elif entry.error is not None:
        data["error"] = entry.error
    else:
        data["tombstone"] = True
    return data


@dataclass
class RoleOverview:
    """What is known of one role: its status and the latest entry of each of its run keys."""

    status: RoleStatus
    #: The latest entry of each run key of the role, newest first.
    runs: list[HistoryEntry] = field(default_factory=list)


@dataclass
class Overview:
    """Leaders, members and recent ledger entries of a namespace, read at ``read_at``."""

    namespace: str
    bootstrap_servers: str
    deployment: str
    ledger_topic: str
    roles: list[RoleOverview]
    #: Every record of the run asked for (``run_key``), oldest first.
    run_history: list[HistoryEntry] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    read_at: float = 0.0


def collect_overview(target: ClusterSettings, deployment: str, roles: Sequence[str] = (),
                     run_key: str | None = None, limit: int = LEDGER_ROWS) -> Overview:
    """Read leaders, ledger and timeline of ``roles`` (every role of the namespace if empty)."""
    from neli_orchestrate.ledger.history import read_history

    warnings: list[str] = []
    history: LedgerHistory | None
    try:
        history = read_history(target.ledger_config(), roles=list(roles) or None)
    except KafkaUnavailableError as exc:
        history = None
        warnings.append(str(exc))
    statuses = collect_status(target, list(roles), history=history)
    latest = history.latest() if history is not None else {}
    known = {s.role for s in statuses}
    # roles that ran but have no group right now (no deployment is up for them)
    extra = sorted({role for role, _ in latest} - known) if not roles else []
    statuses += [RoleStatus(role=r, group=target.names.group_id(r), state="empty", protocol="-",
                            partition=None, notes=["no consumer group: no deployment is "
                                                   "leading or waiting for this role",
                                                   *unstopped_notes(history).get(r, [])])
                 for r in extra]
    overviews = []
    for st in statuses:
        runs = [e for (role, _), e in latest.items() if role == st.role]
        runs.sort(key=lambda e: (e.record.at if e.record else 0.0, e.offset), reverse=True)
        overviews.append(RoleOverview(status=st, runs=runs[:limit]))
    run_history = []
    if run_key is not None and history is not None:
        run_history = [e for e in history.entries if e.run_key == run_key
                       and (not roles or e.role in roles)]
    if history is not None:
        warnings += [f"unreadable ledger record at offset {e.offset} (role {e.role!r}, run key "
                     f"{e.run_key!r}): {e.error}" for e in history.malformed()]
    return Overview(namespace=target.namespace, bootstrap_servers=target.bootstrap_servers,
                    deployment=deployment, ledger_topic=target.names.ledger_topic,
                    roles=overviews, run_history=run_history, warnings=warnings,
                    read_at=time.time())
