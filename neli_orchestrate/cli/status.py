"""``neli-orchestrate status``: per role, who is in the group, who leads, and how the group runs.

Read-only: describes the role groups, reads the tail of the leader topic and the ledger; never
joins a group (joining would rebalance the group the running leader is in).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import click

from neli_orchestrate.cli._context import Target, connection_options, role_of_group
from neli_orchestrate.cli._output import emit, fail, json_option, progress, table, when
from neli_orchestrate.cli.liveness import (
    collect_liveness,
    is_liveness_group,
    liveness_json,
    print_liveness,
)
from neli_orchestrate.core.config import PROFILES, NeliConfig
from neli_orchestrate.core.heartbeat import decode_heartbeat
from neli_orchestrate.core.roles import partition_for
from neli_orchestrate.errors import KafkaUnavailableError

if TYPE_CHECKING:
    from neli_orchestrate.ledger.history import LedgerHistory

__all__ = ["LeaderSpell", "MemberStatus", "RoleStatus", "collect_status", "status"]

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


def _ck() -> Any:
    import confluent_kafka
    import confluent_kafka.admin  # noqa: F401

    return confluent_kafka


def _enum_name(value: Any) -> str:
    name = getattr(value, "name", None)
    return str(name if name is not None else value).lower()


def _role_groups(admin: Any, target: Target) -> dict[str, str]:
    """{role: group id} of every consumer group of the namespace the cluster knows."""
    names = target.names
    result = admin.list_consumer_groups(request_timeout=target.timeout).result(
        timeout=target.timeout + 5)
    roles = {}
    for listing in result.valid:
        if is_liveness_group(target, listing.group_id):
            continue  # a deployment's liveness group, not a role's
        role = role_of_group(names, listing.group_id)
        if role is not None:
            roles[role] = listing.group_id
    return roles


def _heartbeats(target: Target, topic: str, partitions: Sequence[int],
                ends: dict[int, int]) -> list[tuple[float, str, int]]:
    """Every heartbeat in the topic's tail: (wall time, NELI member id, partition), by time."""
    ck = _ck()
    todo = {p: ends[p] for p in partitions if ends.get(p, 0) > 0}
    seen: list[tuple[float, str, int]] = []
    if not todo:
        return seen
    consumer = ck.Consumer(target.client_config(**{
        "group.id": f"neli-status-{uuid.uuid4().hex}",  # assign() only: never joins
        "enable.auto.commit": False, "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
    }))
    deadline = time.monotonic() + target.timeout
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


def _ledger_members(target: Target, roles: Sequence[str],
                    history: LedgerHistory | None = None) -> dict[tuple[str, str], str]:
    """{(role, NELI member id): deployment} from the ledger; empty if it cannot be read."""
    from neli_orchestrate.ledger.history import read_history

    if history is None:
        try:
            history = read_history(target.ledger_config(), roles=roles)
        except KafkaUnavailableError:
            return {}
    return {(e.role, e.record.member): e.record.deployment for e in history.entries
            if e.record is not None and e.role is not None}


def _group_session(admin: Any, target: Target, group: str,
                   broker: dict[str, str]) -> tuple[int | None, int | None, str]:
    from neli_orchestrate.cli.doctor import describe_config

    settings = describe_config(admin, "GROUP", group, target.timeout) or {}
    session = settings.get("consumer.session.timeout.ms")
    heartbeat = settings.get("consumer.heartbeat.interval.ms")
    if session is not None:
        return int(session), int(heartbeat) if heartbeat else None, "group config"
    session = broker.get("group.consumer.session.timeout.ms")
    heartbeat = broker.get("group.consumer.heartbeat.interval.ms")
    return (int(session) if session else None, int(heartbeat) if heartbeat else None,
            "broker default")


def collect_status(target: Target, roles: Sequence[str], *, profile: str = "default",
                   now: float | None = None,
                   history: LedgerHistory | None = None) -> list[RoleStatus]:
    """The status of ``roles`` (all roles with a consumer group if empty).

    ``history``: the ledger as already read by the caller (it names each member's deployment);
    read here if not given.
    """
    from neli_orchestrate.cli.doctor import broker_config

    ck = _ck()
    names = target.names
    lease = NeliConfig(profile=profile).resolved.heartbeat_timeout
    admin = ck.admin.AdminClient(target.client_config())
    try:
        # first: an unreachable cluster must be an error, not "no roles"
        metadata = admin.list_topics(topic=names.leader_topic, timeout=target.timeout)
        groups = ({role: names.group_id(role) for role in roles} if roles
                  else _role_groups(admin, target))
        if not groups:
            return []
        described = admin.describe_consumer_groups(list(groups.values()),
                                                   request_timeout=target.timeout)
    except ck.KafkaException as exc:
        raise KafkaUnavailableError(
            f"cannot read the groups of namespace {target.namespace!r} at "
            f"{target.bootstrap_servers}: {exc}") from exc
    meta = metadata.topics.get(names.leader_topic)
    count = len(meta.partitions) if meta is not None and meta.error is None else 0
    ends: dict[int, int] = {}
    if count:
        tps = [ck.TopicPartition(names.leader_topic, p) for p in range(count)]
        offsets = admin.list_offsets({tp: ck.admin.OffsetSpec.latest() for tp in tps},
                                     request_timeout=target.timeout)
        ends = {tp.partition: int(f.result(timeout=target.timeout + 5).offset)
                for tp, f in offsets.items()}
    all_beats = _heartbeats(target, names.leader_topic, list(range(count)), ends)
    beats = _newest(all_beats)
    deployments = _ledger_members(target, list(groups), history)
    broker = broker_config(admin, target.timeout) or {}
    wall = time.time() if now is None else now

    result = []
    for role, group in sorted(groups.items()):
        try:
            description = described[group].result(timeout=target.timeout + 5)
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
        if holders and st.leader_member is None:
            st.notes.append(f"partition {partition} is assigned but no fresh heartbeat "
                            f"(within {lease:g} s) was seen: the holder is starting or fenced")
        if not st.members:
            st.notes.append("no members: no deployment is leading or waiting for this role")
        if protocol == "consumer":
            st.session_timeout_ms, st.heartbeat_interval_ms, st.session_source = _group_session(
                admin, target, group, broker)
        else:
            st.session_source = "client setting of each member (classic protocol)"
        if partition is not None:
            try:
                spec = ck.ConsumerGroupTopicPartitions(
                    group, [ck.TopicPartition(names.leader_topic, partition)])
                future = admin.list_consumer_group_offsets([spec],
                                                           request_timeout=target.timeout)
                committed = future[group].result(timeout=target.timeout + 5)
                offset = committed.topic_partitions[0].offset
                st.end_offset = ends.get(partition)
                if offset is not None and offset >= 0:
                    st.committed_offset = offset
                    st.lag = max(0, (st.end_offset or 0) - offset)
            except Exception as exc:  # noqa: BLE001
                st.notes.append(f"cannot read committed offsets: {exc}")
        result.append(st)
    return result


def _age(value: float | None) -> str:
    return "" if value is None else f"{value:.1f} s ago"


@click.command()
@connection_options
@click.option("--role", "-r", "roles", multiple=True,
              help="only this role (repeatable; default: every role group of the namespace)")
@click.option("--profile", type=click.Choice(sorted(PROFILES)), default="default",
              show_default=True,
              help="timing profile the deployments use (how fresh a leader's heartbeat must be)")
@json_option
def status(target: Target, roles: tuple[str, ...], profile: str, as_json: bool) -> int:
    """Per role: members, who leads (from heartbeats), group protocol, session, lag."""
    try:
        with progress(f"describing namespace {target.namespace} at {target.bootstrap_servers}"):
            found = collect_status(target, list(roles), profile=profile)
    except KafkaUnavailableError as exc:
        raise fail(str(exc)) from None
    if as_json:
        try:
            deployments: Any = liveness_json(collect_liveness(target))
        except KafkaUnavailableError as exc:
            deployments = {"error": str(exc)}
        emit({"namespace": target.namespace, "leader_topic": target.names.leader_topic,
              "roles": [asdict(s) for s in found], "deployments": deployments})
        return 0
    print_liveness(target)
    if not found:
        click.echo(f"no role groups in namespace {target.namespace!r} at "
                   f"{target.bootstrap_servers}")
        return 0
    table(f"namespace {target.namespace}: {len(found)} role(s)",
          ["role", "group", "state", "protocol", "members", "leader", "deployment",
           "since", "heartbeat", "session", "lag"],
          [(s.role, s.group, s.state, s.protocol, len(s.members), s.leader_member or "-",
            s.leader_deployment or ("-" if s.leader_member is None else "unknown"),
            when(s.leader_since), _age(s.leader_heartbeat_age),
            (f"{s.session_timeout_ms} ms ({s.session_source})" if s.session_timeout_ms
             else s.session_source), "" if s.lag is None else s.lag)
           for s in found])
    rows = [(s.role, m.neli_member or m.client_id, m.host,
             ",".join(map(str, m.partitions)) or "-", _age(m.heartbeat_age))
            for s in found for m in s.members]
    if rows:
        table("members", ["role", "member", "host", "partitions", "last heartbeat"], rows)
    for s in found:
        for note in s.notes:
            click.echo(f"{s.role}: {note}")
    return 0
