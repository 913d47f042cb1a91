"""Start-up checks at the broker: the leader topic exists and fits, the group's timings are set.

Run once when a member is created, before it joins the group, so a misconfiguration is a clear
error at start-up rather than a member that silently never leads.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Mapping

from neli_orchestrate.core.config import GroupProtocol, ResolvedConfig, _resolve_assignor
from neli_orchestrate.core.kafka import LeaderTopicAdmin
from neli_orchestrate.errors import (
    ConfigError,
    KafkaUnavailableError,
    SessionTimeoutRejectedError,
    TopicMismatchError,
)

__all__ = ["GROUP_HEARTBEAT_KEY", "GROUP_SESSION_KEY", "check_at_broker", "check_session_limits",
           "choose_group_protocol", "prepare_group", "prepare_leader_topic", "resolve_protocol"]

log = logging.getLogger(__name__)

GROUP_SESSION_KEY = "consumer.session.timeout.ms"
GROUP_HEARTBEAT_KEY = "consumer.heartbeat.interval.ms"

# Heartbeats are worthless after seconds; keep the leader topic small.
DEFAULT_TOPIC_CONFIG = {"retention.ms": "3600000", "segment.ms": "3600000",
                        "cleanup.policy": "delete"}


_UNREAD: Mapping[str, str] = {}   # marker: not read (yet)


class _EarlyGroupRead:
    """Reads a group's settings on a thread while the caller checks the topic and the broker."""

    def __init__(self, admin: LeaderTopicAdmin, r: ResolvedConfig) -> None:
        self._admin, self._r = admin, r
        self.value: Mapping[str, str] | None = _UNREAD
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"neli-start-{r.group_id}")
        self._thread.start()

    def _run(self) -> None:
        try:
            self.value = self._admin.group_config(self._r.group_id, self._r.request_timeout)
        except Exception:  # noqa: BLE001 - prepare_group reads again and reports what fails
            log.debug("reading the settings of group %r early failed", self._r.group_id,
                      exc_info=True)

    def result(self) -> Mapping[str, str] | None:
        """The settings read, None if not readable, ``_UNREAD`` if the read failed."""
        self.join()
        return self.value

    def join(self) -> None:
        # bounded like the read itself (the admin call times out after request_timeout)
        self._thread.join(self._r.request_timeout + 10)


def check_at_broker(admin: LeaderTopicAdmin, r: ResolvedConfig) -> tuple[int, ResolvedConfig]:
    """Every start-up check at the broker; return the partition count and ``r`` with the group
    protocol chosen.

    In order: the leader topic (:func:`prepare_leader_topic`), the group protocol and the
    broker's session limits (:func:`resolve_protocol`), the KIP-848 group settings
    (:func:`prepare_group`). Each raises as it does alone, and the caller creates the consumer
    (joins the group) only after all of them passed. One read starts early: when the protocol
    may be KIP-848, the group's settings are read on a thread while the topic is checked, so
    that round trip overlaps the others (measured in ``integration/bench/member_start.py``).
    The group's settings are still written, if at all, after the topic and broker checks.
    """
    early = _EarlyGroupRead(admin, r) if r.group_protocol != "classic" else None
    try:
        partitions = prepare_leader_topic(admin, r)
        broker = admin.broker_config(r.topic, r.request_timeout)
        r = resolve_protocol(broker, r)
        write_timeout = _ms_setting(broker, COORDINATOR_WRITE_TIMEOUT_KEY)
        if write_timeout is not None and write_timeout != r.coordinator_write_timeout:
            r = dataclasses.replace(r, coordinator_write_timeout=write_timeout)
        if r.group_protocol == "consumer":
            effective = prepare_group(
                admin, r, current=early.result() if early is not None else _UNREAD)
            if effective is not None and effective != (r.session_timeout,
                                                       r.group_heartbeat_interval):
                # the ride-through bound uses what the coordinator really applies
                r = dataclasses.replace(r, group_timings_at_broker=effective)
    finally:
        if early is not None:
            early.join()   # no request left running on the admin client the caller closes
    return partitions, r


def prepare_leader_topic(admin: LeaderTopicAdmin, r: ResolvedConfig) -> int:
    """Make sure the leader topic exists and suits the config; return its partition count."""
    count = admin.partition_count(r.topic, r.request_timeout)
    if count is None:
        if not r.create_topic:
            raise TopicMismatchError(
                f"leader topic {r.topic!r} does not exist and NeliConfig.create_topic is False; "
                f"create it (e.g. {r.partitions_to_create} partition(s)) or allow creation"
            )
        settings = dict(DEFAULT_TOPIC_CONFIG)
        if r.mode == "full":
            # Full NELI ages records by the broker's clock (the paper's BTime)
            settings["message.timestamp.type"] = "LogAppendTime"
        settings.update(r.topic_config)
        log.info("creating leader topic %r with %d partition(s)", r.topic, r.partitions_to_create)
        admin.create_topic(r.topic, r.partitions_to_create, settings, r.request_timeout)
        # A new topic (ours, or one another member created a moment ago) reaches the
        # brokers' metadata shortly after the controller accepted it: wait for it.
        deadline = time.monotonic() + r.request_timeout
        count = admin.partition_count(r.topic, r.request_timeout)
        while count is None and time.monotonic() < deadline:
            time.sleep(0.05)
            count = admin.partition_count(r.topic, r.request_timeout)
        if count is None:
            raise KafkaUnavailableError(
                f"leader topic {r.topic!r} was created but the cluster does not list it yet; "
                f"retry, or raise NeliConfig.request_timeout"
            )
    if r.partitions is not None and count != r.partitions:
        raise TopicMismatchError(
            f"leader topic {r.topic!r} has {count} partition(s) but NeliConfig.partitions="
            f"{r.partitions}: every member must map roles to the same partitions (role j -> "
            f"partition j mod M); set partitions={count} (or None to accept the topic), or "
            f"recreate the topic with {r.partitions} partition(s) while no member runs"
        )
    if r.mode == "full":
        topic_settings = admin.topic_config(r.topic, r.request_timeout)
        if topic_settings is None:
            log.warning("cannot read the settings of leader topic %r; Full NELI needs "
                        "message.timestamp.type=LogAppendTime and will ignore records with "
                        "producer timestamps", r.topic)
        elif topic_settings.get("message.timestamp.type") != "LogAppendTime":
            raise TopicMismatchError(
                f"leader topic {r.topic!r} uses message.timestamp.type="
                f"{topic_settings.get('message.timestamp.type')!r}; Full NELI needs the "
                f"broker's clock: set it to LogAppendTime (kafka-configs --alter --entity-type "
                f"topics --entity-name {r.topic} --add-config "
                f"message.timestamp.type=LogAppendTime) or use another topic"
            )
    return count


def prepare_group(admin: LeaderTopicAdmin, r: ResolvedConfig,
                  current: Mapping[str, str] | None = _UNREAD) -> tuple[float, float] | None:
    """For KIP-848 groups, apply (or read) the broker-side session and heartbeat settings.

    With ``group.protocol=consumer`` the session timeout and heartbeat interval are group
    settings on the broker, not client settings. When ``apply_group_config`` is set the member
    writes its own values to the group (idempotent: every member writes the same). It then
    reads back the effective values and checks them against ``heartbeat_timeout``: a broker
    whose session is shorter than the lease would break exclusivity, so that is a ConfigError.
    Returns the effective (session_timeout, heartbeat_interval) in seconds, or None if unknown.
    ``current``: the group's settings if the caller has read them already.
    """
    if r.group_protocol != "consumer":
        return None
    wanted = {
        GROUP_SESSION_KEY: str(max(1, round(r.session_timeout * 1000))),
        GROUP_HEARTBEAT_KEY: str(max(1, round(r.group_heartbeat_interval * 1000))),
    }
    applied = False
    if current is _UNREAD:
        current = admin.group_config(r.group_id, r.request_timeout)
    # Every member of the group writes the same values: only the first needs to. Reading is
    # one round trip to a broker; a change goes through the controller (slower start).
    already = current is not None and bool(current) and all(
        current.get(k) == v for k, v in wanted.items())
    if r.apply_group_config and not already:
        try:
            admin.alter_group_config(r.group_id, wanted, r.request_timeout)
            applied = True
        except SessionTimeoutRejectedError:
            raise  # the broker's limits refuse our values: waiting or falling back hides it
        except KafkaUnavailableError as exc:
            log.warning("could not set the session and heartbeat of group %r (%s); the "
                        "broker's values apply", r.group_id, exc)
        current = admin.group_config(r.group_id, r.request_timeout)
    # Dynamic configs travel through the controller's metadata log: the broker may show the
    # old values for a moment after an accepted change. Wait for ours to become visible.
    deadline = time.monotonic() + r.request_timeout
    while applied and current and time.monotonic() < deadline and any(
            current.get(key) != value for key, value in wanted.items()):
        time.sleep(0.05)
        current = admin.group_config(r.group_id, r.request_timeout)
    if not current or GROUP_SESSION_KEY not in current:
        log.warning("cannot read the session timeout of group %r; assuming "
                    "session_timeout=%g s as configured", r.group_id, r.session_timeout)
        return None
    try:
        session = int(current[GROUP_SESSION_KEY]) / 1000
        heartbeat = int(current.get(GROUP_HEARTBEAT_KEY, wanted[GROUP_HEARTBEAT_KEY])) / 1000
    except ValueError:
        return None
    if r.exclusive and r.heartbeat_timeout + r.clock_error + heartbeat >= session:
        raise ConfigError(
            f"consumer group {r.group_id!r} has {GROUP_SESSION_KEY}={session * 1000:g} and "
            f"{GROUP_HEARTBEAT_KEY}={heartbeat * 1000:g} at the broker: heartbeat_timeout "
            f"({r.heartbeat_timeout:g} s) + clock_error ({r.clock_error:g} s) + heartbeat "
            f"interval must stay below the session timeout for exclusive leadership; lower "
            f"heartbeat_timeout or raise the group's session timeout"
        )
    if not r.exclusive and r.heartbeat_timeout <= session + r.clock_error:
        raise ConfigError(
            f"consumer group {r.group_id!r} has {GROUP_SESSION_KEY}={session * 1000:g} at the "
            f"broker: non-exclusive mode needs heartbeat_timeout ({r.heartbeat_timeout:g} s) "
            f"above it plus clock_error ({r.clock_error:g} s)"
        )
    if abs(session - r.session_timeout) > 1e-3:
        log.warning("group %r runs with a %g s session timeout at the broker (configured %g s);"
                    " crash failover takes about the broker's value", r.group_id, session,
                    r.session_timeout)
    return session, heartbeat


#: How long the group coordinator lets a write (a commit, a heartbeat behind pending writes)
#: wait for the offsets topic's high watermark before it answers REQUEST_TIMED_OUT.
COORDINATOR_WRITE_TIMEOUT_KEY = "offsets.commit.timeout.ms"


def _ms_setting(broker: Mapping[str, str] | None, key: str) -> float | None:
    try:
        return int(broker[key]) / 1000 if broker is not None and key in broker else None
    except (TypeError, ValueError):
        return None


# Broker settings (Kafka >= 3.7) that say whether KIP-848 groups exist and what they accept.
_PROTOCOLS_KEY = "group.coordinator.rebalance.protocols"
_LIMITS: Mapping[str, tuple[str, str, str, str]] = {
    # protocol: (min session, max session, min heartbeat, max heartbeat) broker settings
    "classic": ("group.min.session.timeout.ms", "group.max.session.timeout.ms", "", ""),
    "consumer": ("group.consumer.min.session.timeout.ms", "group.consumer.max.session.timeout.ms",
                 "group.consumer.min.heartbeat.interval.ms",
                 "group.consumer.max.heartbeat.interval.ms"),
}


def _limit(broker: Mapping[str, str], key: str) -> float | None:
    try:
        return int(broker[key]) / 1000 if key and key in broker else None
    except ValueError:
        return None


def _session_problem(broker: Mapping[str, str], protocol: str, r: ResolvedConfig) -> str | None:
    """Why the broker would refuse this member's session (or heartbeat) under ``protocol``."""
    if protocol == "consumer" and not r.apply_group_config:
        return None  # the group's values at the broker apply; prepare_group checks them
    lo_s, hi_s, lo_h, hi_h = (_limit(broker, key) for key in _LIMITS[protocol])
    keys = _LIMITS[protocol]
    if lo_s is not None and r.session_timeout < lo_s:
        return (f"session_timeout={r.session_timeout:g} s is below the broker's {keys[0]}="
                f"{lo_s * 1000:.0f}")
    if hi_s is not None and r.session_timeout > hi_s:
        return (f"session_timeout={r.session_timeout:g} s is above the broker's {keys[1]}="
                f"{hi_s * 1000:.0f}")
    if lo_h is not None and r.group_heartbeat_interval < lo_h:
        return (f"group_heartbeat_interval={r.group_heartbeat_interval:g} s is below the "
                f"broker's {keys[2]}={lo_h * 1000:.0f}")
    if hi_h is not None and r.group_heartbeat_interval > hi_h:
        return (f"group_heartbeat_interval={r.group_heartbeat_interval:g} s is above the "
                f"broker's {keys[3]}={hi_h * 1000:.0f}")
    return None


def check_session_limits(broker: Mapping[str, str] | None, protocol: str,
                         r: ResolvedConfig) -> None:
    """Raise :class:`SessionTimeoutRejectedError` at once if the broker would refuse the session.

    Without this the member would never join (classic: JoinGroup fails with
    INVALID_SESSION_TIMEOUT on every attempt), and callers would wait as if another member led.
    """
    problem = None if broker is None else _session_problem(broker, protocol, r)
    if problem is not None:
        raise SessionTimeoutRejectedError(
            f"the broker refuses the {protocol} group {r.group_id!r}: {problem}; change "
            f"NeliConfig.session_timeout / group_heartbeat_interval (or the profile) to fit, or "
            f"ask the Kafka operators to widen the broker's limits"
        )


def check_protocol_offered(broker: Mapping[str, str] | None, protocol: str,
                           r: ResolvedConfig) -> None:
    """Raise :class:`ConfigError` at start if ``protocol`` is one the broker does not offer.

    Without this a ``consumer`` (KIP-848) member on a broker that offers only classic groups
    (Kafka 3.x, or 4.x with ``group.coordinator.rebalance.protocols=classic``) fails inside
    librdkafka on its first group heartbeat, far from the setting that caused it.
    """
    if broker is None or protocol != "consumer":
        return  # classic is offered by every broker; an unreadable config cannot be judged
    offered = broker.get(_PROTOCOLS_KEY)
    if offered is not None and "consumer" in [p.strip() for p in offered.split(",")]:
        return
    shown = "not set: the broker predates KIP-848" if offered is None else offered
    raise ConfigError(
        f"the cluster lacks the KIP-848 consumer group protocol that group {r.group_id!r} asks"
        f" for (group_protocol='consumer'; the broker's {_PROTOCOLS_KEY}={shown}): use"
        f" group_protocol='auto' or 'classic', or run Kafka 4.0+ with 'consumer' in"
        f" {_PROTOCOLS_KEY}")


def choose_group_protocol(broker: Mapping[str, str] | None,
                          r: ResolvedConfig) -> tuple[GroupProtocol, str]:
    """The group protocol this member uses, and why (for the log).

    An explicit ``group_protocol`` wins. ``"auto"`` takes KIP-848 (``consumer``) when the
    broker enables it and accepts this member's session timeout, else classic: KIP-848 joins
    do not stop the leader's group heartbeats, so a contender joining and leaving cannot
    stall or fence the leader; classic works with every broker and with short sessions that a
    production broker's KIP-848 minimum (45 s by default) refuses.
    """
    if r.group_protocol != "auto":
        return r.group_protocol, "configured (NeliConfig.group_protocol)"
    if broker is None:
        return "classic", ("the broker's configuration is not readable (DescribeConfigs on the "
                           "cluster denied or unsupported); classic works with every broker; "
                           "set group_protocol='consumer' to use KIP-848")
    protocols = broker.get(_PROTOCOLS_KEY)
    if protocols is None:
        return "classic", (f"the broker predates KIP-848 (no {_PROTOCOLS_KEY} setting; Kafka "
                           f"4.0 or later has it)")
    if "consumer" not in [p.strip() for p in protocols.split(",")]:
        return "classic", f"the broker does not enable KIP-848 ({_PROTOCOLS_KEY}={protocols})"
    problem = _session_problem(broker, "consumer", r)
    if problem is not None:
        return "classic", (f"the broker supports KIP-848 but refuses this member's timing there "
                           f"({problem}); to use KIP-848, set that setting within the "
                           f"broker's limit, or ask the Kafka operators to widen the limit")
    return "consumer", f"the broker supports KIP-848 ({_PROTOCOLS_KEY}={protocols})"


_told: set[tuple[str, str, str]] = set()


def resolve_protocol(broker: Mapping[str, str] | None, r: ResolvedConfig) -> ResolvedConfig:
    """``r`` with the group protocol chosen (and checked against the broker's limits)."""
    protocol, why = choose_group_protocol(broker, r)
    check_protocol_offered(broker, protocol, r)
    check_session_limits(broker, protocol, r)
    # Said once per cluster and reason at INFO (a member is created per claim), then at DEBUG.
    first = (r.bootstrap_servers, protocol, why) not in _told
    _told.add((r.bootstrap_servers, protocol, why))
    log.log(logging.INFO if first else logging.DEBUG,
            "group %r uses the %s group protocol: %s", r.group_id, protocol, why)
    if protocol == r.group_protocol:
        return r
    return dataclasses.replace(r, group_protocol=protocol,
                               assignor=_resolve_assignor(protocol, None))
