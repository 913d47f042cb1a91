"""NeliConfig: every setting of a NELI member, its defaults (computed in one place) and checks.

Usage::

    config = NeliConfig(bootstrap_servers="127.0.0.1:9092", group_id="billing.neli-group")
    config.resolved.topic                     # "billing.neli-group.neli"
    fast = NeliConfig(bootstrap_servers=..., profile="fast")
    other = dataclasses.replace(config, group_id="billing.compaction")   # re-derives the topic

Fields left ``None`` are derived when the config is built (see :meth:`NeliConfig.resolved`);
``dataclasses.replace`` keeps them ``None``, so derived values follow the fields you change.
Every violation raises :class:`~neli_orchestrate.errors.ConfigError` naming the field, the
allowed range and the relationship broken; nothing is clamped silently.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from neli_orchestrate.core.roles import Role, check_roles
from neli_orchestrate.errors import ConfigError

__all__ = [
    "GroupProtocol",
    "Mode",
    "NeliConfig",
    "PROFILES",
    "PROTECTED_KAFKA_SETTINGS",
    "ResolvedConfig",
    "TimingProfile",
]

Mode = Literal["fast", "full"]
#: ``"auto"`` (the default) chooses at start-up: KIP-848 when the broker supports it and accepts
#: the session timeout, else classic (:func:`neli_orchestrate.core.topic.choose_group_protocol`).
GroupProtocol = Literal["auto", "classic", "consumer"]


@dataclass(frozen=True)
class TimingProfile:
    """A named set of timing defaults; any field set on :class:`NeliConfig` overrides it.

    All values are seconds. ``heartbeat_timeout`` is not part of a profile: it is derived from
    the session timeout (a third of it, or three times it for non-exclusive Full NELI).
    """

    description: str
    session_timeout: float
    group_heartbeat_interval: float
    heartbeat_interval: float
    min_poll_interval: float
    max_poll_interval: float
    fetch_wait_max: float
    clock_error: float


PROFILES: Mapping[str, TimingProfile] = MappingProxyType({
    # Conservative: tolerates WAN latency, GC pauses, busy brokers and one broker's crash (L3:
    # a leader rides through the 7-13 s stall of a 3-broker cluster on Kafka's defaults).
    # The session is Kafka's own default (session.timeout.ms, group.consumer.session.timeout.ms:
    # 45 s); on a stock broker `auto` picks classic groups (the 1 s group heartbeat is below its
    # KIP-848 minimum of 5 s), which ride through with more margin. Failover after a crash takes
    # about the session timeout; a graceful hand-over about one group heartbeat.
    "default": TimingProfile(
        description="conservative, for clusters across regions (WAN); rides through "
                    "a broker's crash",
        session_timeout=45.0,
        group_heartbeat_interval=1.0,
        heartbeat_interval=0.5,
        min_poll_interval=0.1,
        max_poll_interval=300.0,
        fetch_wait_max=0.5,
        clock_error=0.5,
    ),
    # Loopback / one data centre: hand-over in tens of milliseconds. Needs a broker that allows
    # short sessions (group.min.session.timeout.ms, and for group_protocol="consumer"
    # group.consumer.min.session.timeout.ms / group.consumer.min.heartbeat.interval.ms).
    "fast": TimingProfile(
        description="low latency, for loopback or one data centre",
        session_timeout=1.0,
        group_heartbeat_interval=0.05,
        heartbeat_interval=0.05,
        min_poll_interval=0.01,
        max_poll_interval=30.0,
        fetch_wait_max=0.01,
        clock_error=0.05,
    ),
})

# Kafka client settings the protocol owns. Each maps to the reason shown when a user tries to
# set it through kafka_config.
PROTECTED_KAFKA_SETTINGS: Mapping[str, str] = MappingProxyType({
    "bootstrap.servers": "set NeliConfig.bootstrap_servers instead",
    "metadata.broker.list": "set NeliConfig.bootstrap_servers instead",
    "group.id": "set NeliConfig.group_id instead",
    "group.instance.id": (
        "static membership sends no LeaveGroup on close, so a graceful hand-over would wait "
        "for the session timeout"
    ),
    "group.protocol": "set NeliConfig.group_protocol ('auto', 'classic' or 'consumer') instead",
    "partition.assignment.strategy": (
        "set NeliConfig.assignor instead (eager assignors revoke the leader on every join)"
    ),
    "group.remote.assignor": "set NeliConfig.assignor instead",
    "session.timeout.ms": "set NeliConfig.session_timeout (seconds) instead; it is validated "
                          "against heartbeat_timeout",
    "heartbeat.interval.ms": "set NeliConfig.group_heartbeat_interval (seconds) instead",
    "max.poll.interval.ms": "set NeliConfig.max_poll_interval (seconds) instead; it bounds the "
                            "revoke barrier",
    "enable.auto.commit": "offsets are committed only by the protocol, as membership proofs",
    "enable.auto.offset.store": "offsets are committed only by the protocol",
    "auto.commit.interval.ms": "offsets are committed only by the protocol",
    "auto.offset.reset": "the protocol positions the consumer on each assigned partition itself",
    "fetch.wait.max.ms": "set NeliConfig.fetch_wait_max (seconds) instead",
    "enable.partition.eof": "the protocol reads the leader topic as an endless stream",
    "on_commit": "the protocol uses commit results as membership proofs",
    "on_delivery": "the protocol tracks heartbeat delivery itself",
    "transactional.id": "heartbeats are not transactional",
    "acks": "heartbeats need acks=all to prove the partition is writable",
    "linger.ms": "heartbeats are sent at once (linger.ms=0)",
    "queue.buffering.max.ms": "heartbeats are sent at once (linger.ms=0)",
    "message.timeout.ms": "heartbeat delivery is bounded by NeliConfig.heartbeat_timeout",
    "delivery.timeout.ms": "heartbeat delivery is bounded by NeliConfig.heartbeat_timeout",
    "enable.idempotence": "heartbeats are fire-and-forget; idempotence adds latency",
})

_EAGER_ASSIGNORS = {"range", "roundrobin", "sticky"}
_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_SECRET_KEY = re.compile(r"password|secret|token|credential|private|sasl\.jaas", re.IGNORECASE)


def _program_name() -> str:
    """The program's file name without extension, as goNELI does for its group id."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    base = os.path.basename(argv0)
    if base in ("", "-c", "-m", "__main__.py"):
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        base = spec.name.rsplit(".", 1)[-1] if spec is not None and spec.name else ""
    stem = base.rsplit(".", 1)[0] if base.endswith((".py", ".pyz", ".pyc")) else base
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", stem).strip("._-")
    return cleaned or "neli"


def _default_name() -> str:
    return f"{socket.gethostname()}_{os.getpid()}_{int(time.time())}"


@dataclass(frozen=True)
class ResolvedConfig:
    """The values a member actually runs with: every default applied, every field concrete."""

    bootstrap_servers: str
    group_id: str
    topic: str
    name: str
    profile: str
    mode: Mode
    exclusive: bool
    roles: tuple[Role, ...]
    partitions: int | None
    partitions_to_create: int
    create_topic: bool
    topic_config: Mapping[str, str]
    group_protocol: GroupProtocol
    assignor: str | None
    session_timeout: float
    group_heartbeat_interval: float
    heartbeat_timeout: float
    heartbeat_interval: float
    min_poll_interval: float
    max_poll_interval: float
    revoke_timeout: float
    fetch_wait_max: float
    clock_error: float
    apply_group_config: bool
    request_timeout: float
    kafka_config: Mapping[str, Any]
    release_hints: bool = True
    #: The broker's offsets.commit.timeout.ms (Kafka's default until read at start-up).
    coordinator_write_timeout: float = 5.0
    #: KIP-848: (session, heartbeat interval) the coordinator applies, when read at start-up
    #: and different from the configured ones.
    group_timings_at_broker: tuple[float, float] | None = None

    @property
    def grace_period(self) -> float:
        """Full NELI, exclusive: how long a new assignee waits before it leads (T, the paper's)."""
        return self.heartbeat_timeout if (self.mode == "full" and self.exclusive) else 0.0

    @property
    def stop_budget(self) -> float:
        """Time reserved between the end of a lease and the earliest successor for stopping
        the work (``neli-orchestrate run``'s grace): half of what the session leaves after
        the heartbeat timeout."""
        return max(0.0, (self.session_timeout - self.heartbeat_timeout) / 2)

    @property
    def ride_through(self) -> float:
        """Fast NELI: how long after its newest *accepted* offset commit a leader whose
        evidence stalls (a broker's crash) may keep leading (docs/internals/protocol.md, 8a).

        Classic groups: ``session_timeout - clock_error - stop_budget``. The coordinator
        reschedules a member's session when it accepts its offset commit, so it cannot remove
        the member sooner than ``session_timeout`` after it, whatever happens to the member
        afterwards; the stop budget leaves the work time to stop if the ride ends in a fence.

        KIP-848 groups: a commit does not touch the session, so the bound rests on the group
        heartbeats instead: the one before the commit was at most one interval earlier, and
        while the offsets topic stalls its answer is held back up to the coordinator's write
        timeout (``offsets.commit.timeout.ms``) before the next one is sent:
        ``session - heartbeat interval - write timeout - clock_error - stop_budget``, with the
        timings the coordinator applies. A value at or below ``heartbeat_timeout`` means no
        ride-through (0 is returned), as for Full NELI, whose lease is the paper's ``T``.
        """
        if self.mode != "fast" or not self.exclusive:
            return 0.0
        session, group_hb = self.session_timeout, self.group_heartbeat_interval
        if self.group_timings_at_broker is not None:
            session = min(session, self.group_timings_at_broker[0])
            group_hb = max(group_hb, self.group_timings_at_broker[1])
        classic = session - self.clock_error - self.stop_budget
        consumer = classic - group_hb - self.coordinator_write_timeout
        ride = {"classic": classic, "consumer": consumer}.get(self.group_protocol,
                                                               min(classic, consumer))
        return ride if ride > self.heartbeat_timeout else 0.0

    @property
    def fence_margin(self) -> float:
        """After a fence for an overrunning revoke barrier, how long the partition is still held."""
        return max(0.0, (self.max_poll_interval - self.revoke_timeout) / 2)


@dataclass(frozen=True, repr=False)
class NeliConfig:
    """Settings of a NELI member; validated when built, derived values in :attr:`resolved`.

    Time values are seconds (floats). ``None`` means "derive it": from the ``profile`` for
    timings, from the program name for ``group_id``, from ``group_id`` for ``topic``, from
    host, pid and start time for ``name``.

    .. note:: Settings the protocol depends on cannot be passed through ``kafka_config``
       (see :data:`PROTECTED_KAFKA_SETTINGS`); use the named fields. ``kafka_config`` is shared
       by the member's consumer, producer and admin client (security settings go here).
    """

    #: Kafka bootstrap servers, ``host:port[,host:port]``.
    bootstrap_servers: str = "localhost:9092"
    #: Consumer group of the member (None: ``<program name>.neli-group``). SingletonConfig derives
    #: it from the namespace.
    group_id: str | None = None
    #: Leader (heartbeat) topic (None: ``<group_id>.neli``).
    topic: str | None = None
    #: Member name carried in heartbeats and ``client.id`` (None: ``host_pid_time``).
    name: str | None = None
    #: Seconds a leader may go without reading back its own heartbeat before it fences itself (None:
    #: a third of the session timeout; three times it for non-exclusive Full NELI).
    heartbeat_timeout: float | None = None
    #: Longest pause between polls while pulsing, seconds (None: from the profile, at most a quarter
    #: of heartbeat_timeout).
    min_poll_interval: float | None = None
    #: Extra librdkafka settings shared by the member's consumer, producer and admin client
    #: (security.protocol, sasl.*, ssl.*); protocol-owned settings are refused.
    kafka_config: Mapping[str, Any] = field(default_factory=dict, hash=False)
    #: Timing profile the unset timings come from: ``default`` (WAN) or ``fast`` (one data centre).
    profile: str = "default"
    #: ``fast`` (Fast NELI, own heartbeat proves leadership) or ``full`` (the paper's timestamp
    #: vector).
    mode: Mode = "fast"
    #: At most one leader (True), or at least one leader (False, Full NELI only).
    exclusive: bool = True
    #: Roles this member contends for; role j leads through partition j mod M.
    roles: tuple[Role, ...] = (0,)
    #: Partition count the leader topic must have (None: accept the topic's; create it with one per
    #: role).
    partitions: int | None = None
    #: Create the leader topic if it is missing.
    create_topic: bool = True
    #: Topic settings used when creating the leader topic.
    topic_config: Mapping[str, str] = field(default_factory=dict, hash=False)
    #: ``auto`` (KIP-848 when the broker supports it, else classic), ``classic`` or ``consumer``
    #: (KIP-848; session and heartbeat become group settings at the broker).
    group_protocol: GroupProtocol = "auto"
    #: Partition assignor: cooperative-sticky (classic), or uniform/range/None (consumer).
    assignor: str | None = None
    #: Group session timeout, seconds (None: from the profile); a crashed member is replaced after
    #: about this long.
    session_timeout: float | None = None
    #: Group heartbeat interval, seconds (None: from the profile).
    group_heartbeat_interval: float | None = None
    #: How often the leader writes a heartbeat, seconds (None: from the profile, at most a quarter
    #: of heartbeat_timeout).
    heartbeat_interval: float | None = None
    #: Rebalance timeout (``max.poll.interval.ms``), seconds (None: from the profile, at least the
    #: session timeout).
    max_poll_interval: float | None = None
    #: How long the revoke barrier may hold a routine hand-over, seconds (None: 0.8 x
    #: max_poll_interval); past it the member is fenced.
    revoke_timeout: float | None = None
    #: ``fetch.wait.max.ms`` in seconds (None: from the profile).
    fetch_wait_max: float | None = None
    #: Allowed clock error between hosts, seconds (None: from the profile).
    clock_error: float | None = None
    #: KIP-848: write the session and heartbeat settings to the group at the broker.
    apply_group_config: bool = True
    #: Seconds for admin requests at start-up (topic and group checks).
    request_timeout: float = 10.0
    release_hints: bool = True
    """Fast NELI: a closing leader writes a release hint after leaving the group, and
    followers that read it ask the coordinator for their assignment at once (a graceful
    hand-over then takes milliseconds whatever the group heartbeat interval). A hint is only
    a nudge; leadership still needs the assignment and the member's own heartbeat."""

    def __post_init__(self) -> None:
        # Freeze the mappings so a caller's later edits cannot change a validated config.
        if not isinstance(self.kafka_config, Mapping):
            raise ConfigError(
                f"NeliConfig.kafka_config must be a mapping of librdkafka settings, "
                f"not {type(self.kafka_config).__name__}"
            )
        if not isinstance(self.topic_config, Mapping):
            raise ConfigError(
                f"NeliConfig.topic_config must be a mapping of topic settings, "
                f"not {type(self.topic_config).__name__}"
            )
        object.__setattr__(self, "kafka_config", MappingProxyType(dict(self.kafka_config)))
        object.__setattr__(self, "topic_config", MappingProxyType(dict(self.topic_config)))
        roles = check_roles(self.roles)
        object.__setattr__(self, "roles", roles)
        object.__setattr__(self, "_resolved", _resolve(self))

    @property
    def resolved(self) -> ResolvedConfig:
        """The effective settings: every default applied (computed once, at construction)."""
        return self._resolved  # type: ignore[attr-defined, no-any-return]

    def __repr__(self) -> str:
        parts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "kafka_config":
                value = {k: ("***" if _SECRET_KEY.search(k) else v) for k, v in value.items()}
            elif isinstance(value, MappingProxyType):
                value = dict(value)
            parts.append(f"{f.name}={value!r}")
        return f"NeliConfig({', '.join(parts)})"

    def describe(self) -> str:
        """A multi-line, human-readable summary of the effective settings (secrets masked)."""
        r = self.resolved
        lines = [
            f"group {r.group_id!r} on topic {r.topic!r} at {r.bootstrap_servers}",
            f"member name {r.name!r}; mode {r.mode} "
            f"({'exclusive' if r.exclusive else 'non-exclusive'}); "
            f"roles {list(r.roles)}; group protocol {r.group_protocol}"
            f"{'' if r.assignor is None else f' ({r.assignor})'}",
            f"profile {r.profile!r}: session {r.session_timeout:g} s, group heartbeat "
            f"{r.group_heartbeat_interval:g} s, heartbeat timeout {r.heartbeat_timeout:g} s, "
            f"heartbeat every {r.heartbeat_interval:g} s, poll at least every "
            f"{r.min_poll_interval:g} s, max poll {r.max_poll_interval:g} s, revoke barrier "
            f"{r.revoke_timeout:g} s, fetch wait {r.fetch_wait_max:g} s, clock error "
            f"{r.clock_error:g} s",
        ]
        return "\n".join(lines)


def _seconds(name: str, value: object, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"NeliConfig.{name} must be a number of seconds, not {value!r}")
    number = float(value)
    if number != number or number in (float("inf"), float("-inf")):
        raise ConfigError(f"NeliConfig.{name} must be a finite number of seconds, not {value!r}")
    if number < 0 or (number == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"NeliConfig.{name}={value!r} must be {bound} seconds")
    return number


def _check_kafka_config(settings: Mapping[str, Any]) -> None:
    for key in settings:
        if not isinstance(key, str):
            raise ConfigError(f"NeliConfig.kafka_config keys must be strings, not {key!r}")
        normal = key.strip().lower()
        if normal in PROTECTED_KAFKA_SETTINGS:
            shown = repr(key) if key == normal else f"{key!r} ({normal})"
            raise ConfigError(
                f"NeliConfig.kafka_config sets {shown}, which the NELI protocol controls: "
                f"{PROTECTED_KAFKA_SETTINGS[normal]}"
            )


def _resolve(c: NeliConfig) -> ResolvedConfig:
    """Apply every default and check every field and relationship; the one place for both."""
    if c.profile not in PROFILES:
        raise ConfigError(
            f"NeliConfig.profile={c.profile!r} is unknown; choose one of {sorted(PROFILES)}"
        )
    p = PROFILES[c.profile]

    if not isinstance(c.bootstrap_servers, str) or not c.bootstrap_servers.strip():
        raise ConfigError("NeliConfig.bootstrap_servers must name at least one broker host:port")
    _check_kafka_config(c.kafka_config)
    for key, value in c.topic_config.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ConfigError(
                f"NeliConfig.topic_config must map str to str (Kafka topic settings); "
                f"got {key!r}: {value!r}"
            )

    if c.mode not in ("fast", "full"):
        raise ConfigError(f"NeliConfig.mode={c.mode!r} must be 'fast' (Fast NELI) or 'full'")
    if not isinstance(c.exclusive, bool):
        raise ConfigError(f"NeliConfig.exclusive must be True or False, not {c.exclusive!r}")
    if c.mode == "fast" and not c.exclusive:
        raise ConfigError(
            "NeliConfig.exclusive=False needs mode='full': Fast NELI is exclusive only; "
            "non-exclusive leadership (overlap allowed, never zero leaders) is Full NELI"
        )

    if c.group_protocol not in ("auto", "classic", "consumer"):
        raise ConfigError(
            f"NeliConfig.group_protocol={c.group_protocol!r} must be 'auto' (KIP-848 when the "
            f"broker supports it), 'classic' or 'consumer' (KIP-848)"
        )
    assignor = _resolve_assignor(c.group_protocol, c.assignor)

    group_id = c.group_id if c.group_id is not None else f"{_program_name()}.neli-group"
    if not isinstance(group_id, str) or not group_id.strip():
        raise ConfigError("NeliConfig.group_id must be a non-empty string")
    topic = c.topic if c.topic is not None else f"{group_id}.neli"
    if not isinstance(topic, str) or not _TOPIC_NAME.match(topic) or topic in (".", ".."):
        raise ConfigError(
            f"NeliConfig.topic={topic!r} is not a legal Kafka topic name (1-249 of "
            f"[A-Za-z0-9._-], not '.' or '..')"
            + ("; it was derived from group_id: set topic explicitly" if c.topic is None else "")
        )
    name = c.name if c.name is not None else _default_name()
    if not isinstance(name, str) or not name.strip():
        raise ConfigError("NeliConfig.name must be a non-empty string")

    if c.partitions is not None and (
        isinstance(c.partitions, bool) or not isinstance(c.partitions, int) or c.partitions < 1
    ):
        raise ConfigError(f"NeliConfig.partitions={c.partitions!r} must be an int >= 1 or None")
    partitions_to_create = c.partitions if c.partitions is not None else len(c.roles)

    session = _seconds("session_timeout", c.session_timeout
                       if c.session_timeout is not None else p.session_timeout)
    group_hb = _seconds("group_heartbeat_interval", c.group_heartbeat_interval
                        if c.group_heartbeat_interval is not None else p.group_heartbeat_interval)
    clock_error = _seconds("clock_error", c.clock_error
                           if c.clock_error is not None else p.clock_error, allow_zero=True)
    if c.heartbeat_timeout is not None:
        hb_timeout = _seconds("heartbeat_timeout", c.heartbeat_timeout)
    elif c.mode == "full" and not c.exclusive:
        hb_timeout = 3.0 * session  # the paper's example: T = 30 s for a 10 s session
    else:
        hb_timeout = session / 3.0  # goNELI: a third of the session timeout or less
    hb_interval = _seconds("heartbeat_interval", c.heartbeat_interval
                           if c.heartbeat_interval is not None
                           else min(p.heartbeat_interval, hb_timeout / 4))
    min_poll = _seconds("min_poll_interval", c.min_poll_interval
                        if c.min_poll_interval is not None
                        else min(p.min_poll_interval, hb_timeout / 4))
    max_poll = _seconds("max_poll_interval", c.max_poll_interval
                        if c.max_poll_interval is not None else max(p.max_poll_interval, session))
    revoke = _seconds("revoke_timeout", c.revoke_timeout
                      if c.revoke_timeout is not None else 0.8 * max_poll)
    fetch_wait = _seconds("fetch_wait_max", c.fetch_wait_max
                          if c.fetch_wait_max is not None
                          else min(p.fetch_wait_max, hb_timeout / 4))
    request_timeout = _seconds("request_timeout", c.request_timeout)
    for flag in ("create_topic", "apply_group_config", "release_hints"):
        if not isinstance(getattr(c, flag), bool):
            raise ConfigError(f"NeliConfig.{flag} must be True or False")

    # Relationships. The names and numbers go into the message so the fix is obvious.
    if group_hb >= session:
        raise ConfigError(
            f"NeliConfig.group_heartbeat_interval={group_hb:g} s must be below "
            f"session_timeout={session:g} s (Kafka recommends at most a third of it)"
        )
    if c.exclusive:
        budget = session - clock_error - group_hb
        if hb_timeout >= budget:
            raise ConfigError(
                f"NeliConfig.heartbeat_timeout={hb_timeout:g} s is too long for "
                f"session_timeout={session:g} s: exclusive mode needs heartbeat_timeout + "
                f"clock_error ({clock_error:g} s) + group_heartbeat_interval ({group_hb:g} s) "
                f"< session_timeout, so a leader fences itself before the group can give its "
                f"partition to another member; choose heartbeat_timeout < {budget:g} s or "
                f"raise session_timeout"
            )
    elif hb_timeout <= session + clock_error:
        raise ConfigError(
            f"NeliConfig.heartbeat_timeout={hb_timeout:g} s (T) must exceed session_timeout "
            f"({session:g} s) + clock_error ({clock_error:g} s) in non-exclusive mode, so the "
            f"outgoing leader still leads when its successor takes over (never zero leaders); "
            f"the paper suggests about three times the session timeout"
        )
    if 2 * hb_interval > hb_timeout:
        raise ConfigError(
            f"NeliConfig.heartbeat_interval={hb_interval:g} s must be at most half of "
            f"heartbeat_timeout={hb_timeout:g} s, so at least two heartbeats fit in a lease"
        )
    if 2 * min_poll > hb_timeout:
        raise ConfigError(
            f"NeliConfig.min_poll_interval={min_poll:g} s must be at most half of "
            f"heartbeat_timeout={hb_timeout:g} s, or own heartbeats are read too late to "
            f"keep the lease"
        )
    if fetch_wait >= hb_timeout:
        raise ConfigError(
            f"NeliConfig.fetch_wait_max={fetch_wait:g} s must be below "
            f"heartbeat_timeout={hb_timeout:g} s"
        )
    if max_poll < session:
        raise ConfigError(
            f"NeliConfig.max_poll_interval={max_poll:g} s must be at least "
            f"session_timeout={session:g} s (a Kafka rule)"
        )
    if revoke >= max_poll:
        raise ConfigError(
            f"NeliConfig.revoke_timeout={revoke:g} s must be below max_poll_interval="
            f"{max_poll:g} s: the revoke barrier must end, with a fence, before the group "
            f"removes the member (the rebalance timeout)"
        )

    return ResolvedConfig(
        bootstrap_servers=c.bootstrap_servers.strip(),
        group_id=group_id,
        topic=topic,
        name=name,
        profile=c.profile,
        mode=c.mode,
        exclusive=c.exclusive,
        roles=c.roles,
        partitions=c.partitions,
        partitions_to_create=partitions_to_create,
        create_topic=c.create_topic,
        topic_config=c.topic_config,
        group_protocol=c.group_protocol,
        assignor=assignor,
        session_timeout=session,
        group_heartbeat_interval=group_hb,
        heartbeat_timeout=hb_timeout,
        heartbeat_interval=hb_interval,
        min_poll_interval=min_poll,
        max_poll_interval=max_poll,
        revoke_timeout=revoke,
        fetch_wait_max=fetch_wait,
        clock_error=clock_error,
        apply_group_config=c.apply_group_config,
        request_timeout=request_timeout,
        kafka_config=c.kafka_config,
        release_hints=c.release_hints and c.mode == "fast",
    )


def _resolve_assignor(protocol: str, assignor: str | None) -> str | None:
    if protocol == "auto":
        if assignor is not None:
            raise ConfigError(
                f"NeliConfig.assignor={assignor!r} depends on the group protocol: set "
                f"group_protocol='classic' or 'consumer' explicitly to choose an assignor"
            )
        return None
    if protocol == "classic":
        if assignor is None:
            return "cooperative-sticky"
        names = [a.strip().lower() for a in str(assignor).split(",") if a.strip()]
        eager = [a for a in names if a in _EAGER_ASSIGNORS]
        if eager:
            raise ConfigError(
                f"NeliConfig.assignor={assignor!r} includes the eager assignor {eager[0]!r}: "
                f"it revokes every partition whenever a member joins, so the leader would "
                f"lose its role on every join; use 'cooperative-sticky' or "
                f"group_protocol='consumer'"
            )
        if names != ["cooperative-sticky"]:
            raise ConfigError(
                f"NeliConfig.assignor={assignor!r} is not supported with the classic group "
                f"protocol; use 'cooperative-sticky'"
            )
        return "cooperative-sticky"
    if assignor is None:
        return None
    if assignor not in ("uniform", "range"):
        raise ConfigError(
            f"NeliConfig.assignor={assignor!r}: with group_protocol='consumer' the broker "
            f"assigns partitions; choose 'uniform', 'range' or None (broker default)"
        )
    return assignor
