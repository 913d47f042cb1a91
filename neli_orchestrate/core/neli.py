"""Neli: a member that contends for leadership of roles through a Kafka consumer group.

Usage::

    with Neli(NeliConfig(bootstrap_servers="127.0.0.1:9092", group_id="billing"),
              barrier=on_event) as neli:
        while running:
            if neli.pulse(timeout=0.05):      # poll once, then: am I the leader?
                do_a_bit_of_leader_work()

Fast NELI (the default, exclusive): the member that the group coordinator assigns a role's
partition writes heartbeats to that partition and reads them back; it leads while it owns the
partition and its *own* newest heartbeat, and its newest accepted offset commit (proof of
group membership), are younger than ``heartbeat_timeout``. See ``docs/internals/protocol.md``.

Release hints (Fast NELI, ``release_hints=True``, KIP-848 groups): a member that closes tells
its followers, which then ask the coordinator for the partition at once; the hint grants
nothing (:mod:`neli_orchestrate.core.hints`).

Threads: ``pulse``/``background`` poll Kafka, and the barrier runs on the polling thread
(the revoke barrier on a helper thread, see :meth:`Neli.pulse`). ``is_leader``/``leads``
may be read from any thread: they are computed from the clock when read. ``close()`` may be
called from any thread except from inside the barrier.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from neli_orchestrate.core.clock import SYSTEM_CLOCK, Clock
from neli_orchestrate.core.config import NeliConfig, ResolvedConfig
from neli_orchestrate.core.confluent import (
    ConfluentKafka,
    admin_settings,
    consumer_settings,
    producer_settings,
    watcher_settings,
)
from neli_orchestrate.core.events import (
    REASON_BARRIER_OVERRAN,
    REASON_FATAL,
    REASON_MAX_POLL,
    REASON_PARTITION_LOST,
    Barrier,
    LeaderEvent,
    LeaderFenced,
    LeaderRevoked,
)
from neli_orchestrate.core.fast import FastNeliState
from neli_orchestrate.core.full import FullNeliState
from neli_orchestrate.core.heartbeat import (
    ReleaseHint,
)
from neli_orchestrate.core.hints import HINT_FLUSH, HintWatch, write_release_hints
from neli_orchestrate.core.kafka import (
    MAX_POLL_EXCEEDED,
    OFFSET_END,
    ConsumerFault,
    GroupConsumer,
    HeartbeatProducer,
    KafkaClients,
    Record,
    authorization_denied,
)
from neli_orchestrate.core.pulser import Pulser
from neli_orchestrate.core.roles import Role
from neli_orchestrate.core.state import LeadershipState
from neli_orchestrate.core.topic import check_at_broker
from neli_orchestrate.errors import (
    AuthorizationError,
    ConfigError,
    KafkaUnavailableError,
    NeliError,
    SessionTimeoutRejectedError,
)

__all__ = ["Neli", "NeliLike"]

log = logging.getLogger(__name__)

_MAX_POLL_SLICE = 0.1   # close() waits at most this long for a pulse in progress
_DRAIN = 500            # records handled per poll before the loop re-evaluates


@runtime_checkable
class NeliLike(Protocol):
    """The API shared by :class:`Neli` and :class:`~neli_orchestrate.core.mock.MockNeli`."""

    @property
    def is_leader(self) -> bool: ...

    @property
    def closed(self) -> bool: ...

    @property
    def member_id(self) -> str: ...

    @property
    def roles(self) -> tuple[Role, ...]: ...

    def leads(self, role: Role) -> bool: ...

    def pulse(self, timeout: float = 0.0) -> bool: ...

    def background(self, task: Callable[[], object] | None = None) -> Pulser: ...

    def close(self) -> None: ...


class _Listener:
    """Adapts consumer callbacks to the member (kept separate so the seam stays narrow)."""

    def __init__(self, neli: Neli) -> None:
        self._neli = neli

    def on_assign(self, partitions: Sequence[int]) -> Mapping[int, int]:
        return self._neli._on_assign(partitions)

    def on_revoke(self, partitions: Sequence[int]) -> None:
        self._neli._on_revoke(partitions)

    def on_lost(self, partitions: Sequence[int]) -> None:
        self._neli._on_lost(partitions)

    def on_commit(self, offsets: Mapping[int, int], error: str | None) -> None:
        self._neli._on_commit(offsets, error)


class Neli:
    """A NELI member: contends for its roles and tells the barrier when leadership changes.

    Creating it checks the broker (topic exists or is created, partition count fits, KIP-848
    group timings) and joins the group; it raises
    :class:`~neli_orchestrate.errors.KafkaUnavailableError` if the cluster cannot be reached
    or refuses, :class:`~neli_orchestrate.errors.ConfigError` for settings the broker or the
    client reject.

    .. note:: Leadership is only as good as the stated timing assumptions (see
       ``docs/internals/protocol.md``): a check that passes can be stale by the time work starts.
       Guard side effects with a fencing token (the run ledger) when exactly-once matters.
    """

    def __init__(self, config: NeliConfig, barrier: Barrier | None = None, *,
                 clock: Clock | None = None, kafka: KafkaClients | None = None) -> None:
        if not isinstance(config, NeliConfig):
            raise ConfigError(f"Neli needs a NeliConfig, not {type(config).__name__}")
        self._config = config
        r = self._r = config.resolved
        self._clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self._barrier = barrier
        # The name may repeat (two processes configured alike); the suffix makes the member id
        # unique per instance, so no one else's heartbeat can ever pass for ours.
        self._member_id = f"{r.name}#{secrets.token_hex(4)}"
        self._io_lock = threading.RLock()
        self._closing = threading.Event()
        self._closed = threading.Event()
        self._local = threading.local()
        self._pulser: Pulser | None = None
        self._fatal: NeliError | None = None
        self._last_poll = -math.inf
        self._events_emitted = 0
        self._warned: dict[str, int] = {}
        self._consumer: GroupConsumer | None = None
        self._producer: HeartbeatProducer | None = None
        self._hinted: set[int] = set()          # partitions whose release hint is written

        clients: KafkaClients = kafka if kafka is not None else ConfluentKafka()
        try:
            admin = clients.admin(admin_settings(r))
        except NeliError:
            raise
        except Exception as exc:
            raise ConfigError(
                f"the Kafka admin client rejected the settings (check NeliConfig.kafka_config): "
                f"{exc}"
            ) from exc
        try:
            self._partitions, r = check_at_broker(admin, r)
            self._r = r
        finally:
            admin.close()

        state_args = dict(
            member=self._member_id, roles=r.roles, partitions=self._partitions,
            lease=r.heartbeat_timeout, heartbeat_interval=r.heartbeat_interval,
            revoke_timeout=r.revoke_timeout, exclusive=r.exclusive, grace=r.grace_period,
            group=r.group_id,
        )
        self._state: LeadershipState
        if r.mode == "full":
            self._state = FullNeliState(clock_error=r.clock_error, **state_args)
        else:
            self._state = FastNeliState(**state_args,  # type: ignore[arg-type]
                                        ride_through=r.ride_through)
        self._hints = HintWatch(self._state, r, self._member_id, clock=self._clock,
                                rejoin=self._rejoin, on_hint=self._on_hint, warn=self._warn_once)

        try:
            self._producer = clients.producer(producer_settings(r), r.topic)
            self._consumer = clients.consumer(consumer_settings(r), r.topic)
            if r.release_hints and r.group_protocol == "consumer":
                # Classic groups get no hint watcher: the only way to make librdkafka rejoin a
                # classic group at once is to change the subscription, and doing that while a
                # join is in flight aborts the process (rd_kafka_cgrp_modify_subscription
                # assertion, seen under load). Classic hand-over waits for the group heartbeat.
                # Positioned at the first pulse: nothing is read before, and start stays short.
                self._hints.open(clients.watcher(watcher_settings(r), r.topic))
            self._consumer.subscribe(_Listener(self))
        except Exception as exc:
            self._release_clients()
            if isinstance(exc, NeliError):
                raise
            raise ConfigError(
                f"the Kafka client rejected the settings (check NeliConfig.kafka_config): {exc}"
            ) from exc
        log.info("member %s joined group %r on topic %r (%d partition(s), roles %s, %s NELI, "
                 "profile %s)", self._member_id, r.group_id, r.topic, self._partitions,
                 list(r.roles), r.mode, r.profile)

    # -- read-only facts ----------------------------------------------------------------------

    @property
    def config(self) -> NeliConfig:
        return self._config

    @property
    def resolved(self) -> ResolvedConfig:
        """The effective settings this member runs with."""
        return self._r

    @property
    def member_id(self) -> str:
        """This member's unique id (``name#suffix``), carried in every heartbeat."""
        return self._member_id

    @property
    def roles(self) -> tuple[Role, ...]:
        return self._r.roles

    @property
    def partitions(self) -> int:
        """Partition count of the leader topic (fixed while the member runs)."""
        return self._partitions

    def partition_for(self, role: Role) -> int:
        """The leader-topic partition through which ``role`` is led."""
        return self._state.role_partition[self._check_role(role)]

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has begun; a closing member leads nothing."""
        return self._closing.is_set()

    @property
    def stats(self) -> dict[str, object]:
        """Counters for monitoring and tests (heartbeats sent/read, commits, membership proof)."""
        data: dict[str, object] = dict(self._state.counters)
        data["membership_proven_at"] = self._state.membership_proven_at
        data["assigned_partitions"] = self._state.assigned_partitions()
        data["events"] = self._events_emitted
        data["watched_partitions"] = list(self._hints.watched)
        return data

    # -- leadership ----------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """True if this member leads its first role right now (computed when read)."""
        return self.leads(self._r.roles[0])

    def leads(self, role: Role) -> bool:
        """True if this member leads ``role`` right now.

        Evaluated against the monotonic clock at every call, from any thread: once the lease
        lapses it reads False even if the polling thread is stuck.
        """
        role = self._check_role(role)
        if self._closing.is_set():
            return False
        return self._state.leads(role, self._clock.monotonic())

    def leadership_deadline(self, role: Role | None = None) -> float | None:
        """Monotonic instant at which the current lease on ``role`` ends; None if not leading.

        Pulsing renews the lease; a watchdog can use this to cancel work just before it ends.
        """
        role = self._r.roles[0] if role is None else self._check_role(role)
        if self._closing.is_set():
            return None
        return self._state.lease_expiry(role, self._clock.monotonic())

    def _check_role(self, role: Role) -> Role:
        if role not in self._state.role_partition:
            raise NeliError(
                f"role {role!r} is not one this member contends for; NeliConfig.roles="
                f"{list(self._r.roles)}"
            )
        return role

    # -- pulse ---------------------------------------------------------------------------------

    def pulse(self, timeout: float = 0.0) -> bool:
        """Poll Kafka, send due heartbeats, deliver events; return :attr:`is_leader`.

        Polls for up to ``timeout`` seconds, returning early when a leadership event was
        delivered. With ``timeout=0`` it polls without blocking, at most once per
        ``min_poll_interval`` (more frequent calls only re-evaluate the lease). Call it
        regularly (or use :meth:`background`): heartbeats are sent and read back only while
        pulsing, so a member that stops pulsing for ``heartbeat_timeout`` is fenced.
        Returns False at once after :meth:`close`.

        Barrier: events are delivered on this thread, in order. A ``LeaderRevoked`` barrier
        runs on a helper thread while this one waits (the partition stays with this member,
        holding the successor back) up to ``event.deadline``
        (``revoke_timeout``, below ``max_poll_interval``); if it overruns, a
        ``LeaderFenced`` (reason ``revoke-barrier-overran``) is delivered *concurrently* on
        this thread and the partition is released shortly after. Do not call ``pulse`` or
        ``close`` from inside the barrier.

        Raises :class:`~neli_orchestrate.errors.KafkaUnavailableError` on a fatal client
        error (after fencing every role).
        """
        if not (timeout >= 0 and math.isfinite(timeout)):
            raise ValueError(f"pulse timeout must be a finite number >= 0, not {timeout!r}")
        self._refuse_in_barrier("pulse()")
        if self._closing.is_set():
            return False
        with self._io_lock:
            if self._closing.is_set():
                return False
            self._raise_if_fatal()
            hints = self._hints
            hints.start()
            clock = self._clock
            start = clock.monotonic()
            if timeout == 0 and start - self._last_poll < self._r.min_poll_interval:
                self._emit(self._state.evaluate(start, clock.time()))
                return self.is_leader
            emitted_before = self._events_emitted
            deadline = start + timeout
            while True:
                now = clock.monotonic()
                self._emit(self._state.evaluate(now, clock.time()))
                self._send_heartbeats(now)
                hints.nudge_if_due(now)
                wake = self._state.next_wakeup(now)
                step = min(deadline - now, _MAX_POLL_SLICE)
                if wake is not None:
                    step = min(step, wake - now)
                if hints.next_nudge is not None:
                    step = min(step, hints.next_nudge - now)
                if hints.watch_first(now):
                    # An idle follower: block on the watched partitions, where a hint (or the
                    # leader's heartbeat) arrives; then serve the group's callbacks.
                    hints.poll(max(0.0, step))
                    self._poll(0.0)
                else:
                    self._poll(max(0.0, step))
                    hints.poll(0.0)
                assert self._producer is not None
                self._producer.poll(0)
                now = clock.monotonic()
                self._emit(self._state.evaluate(now, clock.time()))
                self._raise_if_fatal()
                if (self._events_emitted != emitted_before or self._closing.is_set()
                        or now >= deadline):
                    break
            return self.is_leader

    def background(self, task: Callable[[], object] | None = None) -> Pulser:
        """Start a thread that pulses this member and calls ``task()`` while it leads.

        Returns the :class:`~neli_orchestrate.core.pulser.Pulser`; it ends when the member is
        closed, when ``pulser.stop()`` is called, or when the task raises (the member is
        then closed so another can lead; the exception is in ``pulser.error``).
        """
        if self._closing.is_set():
            raise NeliError("this member is closed; create a new Neli to contend again")
        if self._pulser is not None and self._pulser.running:
            raise NeliError("a background pulser already drives this member")
        self._pulser = Pulser(self, task, poll_timeout=max(self._r.min_poll_interval, 0.1))
        return self._pulser.start()

    # -- close ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Hand leadership over and leave the group at once; idempotent, any thread.

        Runs the revoke barrier (``LeaderRevoked``) for every role led, writes a release hint
        (followers then ask for the partition at once) and leaves the group, so that a
        successor is assigned within milliseconds (no static membership, no session wait,
        no wait for the successor's group heartbeat). A pulse in progress on another thread is
        woken with an extra own heartbeat; close waits for it (and for a running barrier).
        Must not be called from inside the barrier.
        """
        self._refuse_in_barrier("close()")
        self._closing.set()
        self._wake_poller()
        with self._io_lock:
            if self._closed.is_set():
                return
            held = [p for p in self._state.assigned_partitions()
                    if p in self._state.partition_roles]
            left = False
            try:
                if self._consumer is not None:
                    self._consumer.close()  # on_revoke -> barrier -> LeaveGroup
                    left = True
            except Exception:  # noqa: BLE001 - closing continues; leadership ends regardless
                log.warning("closing the consumer of member %s failed", self._member_id,
                            exc_info=True)
            finally:
                rest = [p for p in held if p not in self._hinted]
                if left and rest and self._r.release_hints:
                    self._write_release_hints(rest)
                if self._hinted and self._producer is not None:
                    try:
                        self._producer.flush(min(HINT_FLUSH, self._r.request_timeout))
                    except Exception:  # noqa: BLE001 - a lost hint only slows a hand-over
                        log.debug("flushing release hints failed", exc_info=True)
                self._emit(self._state.close(self._clock.monotonic(), self._clock.time()))
                self._release_clients(consumer_closed=True)
                self._closed.set()
        log.info("member %s closed", self._member_id)

    def __enter__(self) -> Neli:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closing.is_set() else (
            "leader" if self.is_leader else "follower")
        return (f"Neli(member={self._member_id!r}, group={self._r.group_id!r}, "
                f"topic={self._r.topic!r}, {state})")

    def _wake_poller(self) -> None:
        """End a pulse that blocks in the Kafka poll on another thread, so close() need not wait.

        The consumer cannot be woken from another thread (its calls block while it polls), but
        it wakes up for a record on a partition it reads: an extra heartbeat of our own.
        """
        if self._closed.is_set() or self._producer is None \
                or not isinstance(self._state, FastNeliState):
            return
        now, wall = self._clock.monotonic(), self._clock.time()
        try:
            for p in self._state.assigned_partitions():
                if p in self._state.partition_roles:
                    key, value = self._state.heartbeat_for(p, now, wall).encode()
                    self._producer.send(p, key, value)
        except Exception:  # noqa: BLE001 - then close() waits for the poll slice instead
            log.debug("waking the polling thread of member %s failed", self._member_id,
                      exc_info=True)

    def _write_release_hints(self, partitions: Sequence[int]) -> None:
        """Tell followers watching ``partitions`` to ask the coordinator for them now."""
        if self._producer is None:
            return
        hint = ReleaseHint(member=self._member_id, sent_wall=self._clock.time(),
                           group=self._r.group_id)
        self._hinted.update(write_release_hints(self._producer, partitions, hint))

    def _release_clients(self, consumer_closed: bool = False) -> None:
        if self._consumer is not None and not consumer_closed:
            try:
                self._consumer.close()
            except Exception:  # noqa: BLE001
                log.debug("closing consumer failed", exc_info=True)
        self._consumer = None
        self._hints.close()
        if self._producer is not None:
            try:
                self._producer.close()
            except Exception:  # noqa: BLE001
                log.debug("closing producer failed", exc_info=True)
        self._producer = None

    # -- internals: polling --------------------------------------------------------------------

    def _poll(self, timeout: float) -> None:
        assert self._consumer is not None
        result = self._consumer.poll(timeout)
        self._last_poll = self._clock.monotonic()
        handled = 0
        while result is not None:
            self._handle(result)
            handled += 1
            if handled >= _DRAIN or self._fatal is not None:
                break
            result = self._consumer.poll(0)
            self._last_poll = self._clock.monotonic()

    # -- internals: release hints (core/hints.py) ---------------------------------------------

    def _on_hint(self, partition: int, hint: ReleaseHint, now: float) -> None:
        """Another member's release hint for ``partition`` was read: nudge (grants nothing)."""
        self._hints.hint_read(partition, hint, now)

    def _rejoin(self) -> None:
        if self._consumer is not None:
            self._consumer.rejoin()

    def _handle(self, result: Record | ConsumerFault) -> None:
        now, wall = self._clock.monotonic(), self._clock.time()
        self._emit(self._state.evaluate(now, wall))
        if isinstance(result, Record):
            self._state.record(result, now, wall)
            return
        if authorization_denied(result.code, result.message):
            self._fail(self._denied(result.code, result.message))
        elif result.code == MAX_POLL_EXCEEDED:
            log.error("member %s did not pulse within max_poll_interval=%g s and left the "
                      "group: fencing every role", self._member_id, self._r.max_poll_interval)
            self._emit(self._state.lose_all(now, wall, REASON_MAX_POLL))
        elif result.code == "INVALID_SESSION_TIMEOUT":
            # The broker refuses our session on every join: the member would never lead, and
            # callers would wait as if someone else did. Fail now, saying what to change.
            self._fail(SessionTimeoutRejectedError(
                f"the broker refuses session_timeout={self._r.session_timeout:g} s for group "
                f"{self._r.group_id!r} ({result.message}); choose one within the broker's "
                f"group.min.session.timeout.ms and group.max.session.timeout.ms"))
        elif result.fatal:
            self._fail(KafkaUnavailableError(
                f"fatal Kafka error in member {self._member_id}: {result.code}: "
                f"{result.message}"))
        else:
            self._warn_once(result.code, "consumer of member %s: %s: %s", self._member_id,
                            result.code, result.message)

    def _fail(self, error: NeliError) -> None:
        now, wall = self._clock.monotonic(), self._clock.time()
        self._fatal = error
        log.error("%s", error)
        self._emit(self._state.lose_all(now, wall, REASON_FATAL))
        self._emit(self._state.close(now, wall, REASON_FATAL))

    def _denied(self, code: str, message: str) -> AuthorizationError:
        r = self._r
        return AuthorizationError(
            f"Kafka denied member {self._member_id} ({code}: {message}): its principal needs "
            f"READ on consumer group {r.group_id!r} and READ and WRITE on leader topic "
            f"{r.topic!r} (kafka-acls --add ...; docs/guide/security.md lists every ACL)")

    def _raise_if_fatal(self) -> None:
        if self._fatal is not None:
            raise self._fatal

    def _send_heartbeats(self, now: float) -> None:
        beats = self._state.due_heartbeats(now, self._clock.time())
        if not beats:
            return
        assert self._producer is not None
        for partition, beat in beats:
            key, value = beat.encode()
            self._producer.send(partition, key, value, self._delivery_report(partition))
        self._commit(self._state.commit_offsets(), now)

    def _commit(self, offsets: Mapping[int, int], issued_at: float) -> None:
        if not offsets or self._consumer is None:
            return
        try:
            self._consumer.commit(offsets)
        except Exception as exc:  # noqa: BLE001 - no proof this round; the lease says the rest
            self._warn_once("commit", "offset commit of member %s not sent: %s",
                            self._member_id, exc)
            return
        self._state.commit_issued(offsets, issued_at)

    def _delivery_report(self, partition: int) -> Callable[[int | None, str | None], None]:
        def report(offset: int | None, error: str | None) -> None:
            if error is not None and authorization_denied(error):
                if self._fatal is None:
                    self._fail(self._denied(error, "heartbeat refused"))
            elif error is not None:
                self._warn_once(f"delivery:{error}", "heartbeat of member %s to partition %d "
                                "not delivered: %s", self._member_id, partition, error)
        return report

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        # The same problem repeats every heartbeat; log it the first time and then rarely.
        count = self._warned.get(key, 0)
        self._warned[key] = count + 1
        if count == 0 or count % 1000 == 0:
            log.warning(message, *args)
        else:
            log.debug(message, *args)

    # -- internals: events and the barrier -----------------------------------------------------

    def _emit(self, events: Sequence[LeaderEvent]) -> None:
        for event in events:
            self._events_emitted += 1
            self._log_event(event)
            if self._barrier is not None:
                self._call_barrier(event)

    def _log_event(self, event: LeaderEvent) -> None:
        level = logging.WARNING if isinstance(event, LeaderFenced) else logging.INFO
        log.log(level, "member %s: %s role %r (partition %d)%s", self._member_id,
                type(event).__name__, event.role, event.partition,
                f": {event.reason}" if event.reason else "")

    def _call_barrier(self, event: LeaderEvent) -> None:
        assert self._barrier is not None
        depth = getattr(self._local, "barrier_depth", 0)
        self._local.barrier_depth = depth + 1
        try:
            self._barrier(event)
        except Exception:  # noqa: BLE001 - a faulty barrier must not stop the protocol
            log.exception("barrier of member %s raised on %s", self._member_id,
                          type(event).__name__)
        finally:
            self._local.barrier_depth = depth

    def _refuse_in_barrier(self, what: str) -> None:
        if getattr(self._local, "barrier_depth", 0):
            raise NeliError(
                f"{what} must not be called from inside the barrier callback (it runs within "
                f"the Kafka poll); signal another thread to do it instead"
            )

    def _run_revoke_barrier(self, events: Sequence[LeaderRevoked]) -> None:
        self._events_emitted += len(events)
        for event in events:
            self._log_event(event)
        if self._barrier is None or not events:
            return
        done = threading.Event()

        def run() -> None:
            try:
                for event in events:
                    self._call_barrier(event)
            finally:
                done.set()

        helper = threading.Thread(target=run, name=f"neli-revoke-barrier-{self._member_id}",
                                  daemon=True)
        helper.start()
        deadline = min(event.deadline for event in events)
        if self._clock.wait(done, deadline):
            return
        # Fence before the group's rebalance timeout would remove the member: stop now.
        now, wall = self._clock.monotonic(), self._clock.time()
        log.error("revoke barrier of member %s still running after %g s: fencing and "
                  "releasing the partition(s)", self._member_id, self._r.revoke_timeout)
        self._emit([
            LeaderFenced(role=e.role, partition=e.partition, member=self._member_id,
                         timestamp=now, wall_time=wall, reason=REASON_BARRIER_OVERRAN)
            for e in events
        ])
        if not self._clock.wait(done, now + self._r.fence_margin):
            log.error("revoke barrier of member %s ignored the fence; the partition is "
                      "released anyway", self._member_id)

    # -- internals: consumer callbacks (polling thread) ---------------------------------------

    def _on_assign(self, partitions: Sequence[int]) -> Mapping[int, int]:
        now, wall = self._clock.monotonic(), self._clock.time()
        self._emit(self._state.evaluate(now, wall))
        try:
            self._state.assign(partitions, now)
        except NeliError as exc:
            self._fail(exc)
            return {}
        log.info("member %s assigned partition(s) %s", self._member_id, list(partitions))
        starts: dict[int, int] = {}
        for p in partitions:
            offset = None
            if isinstance(self._state, FastNeliState) and p in self._state.partition_roles:
                offset = self._first_heartbeat(p, now, wall)
            starts[p] = offset if offset is not None else OFFSET_END
        known = {p: o for p, o in starts.items() if o >= 0}
        for p, o in known.items():
            self._state.set_position(p, o)
        self._commit(known, now)
        self._hints.rewatch()
        return starts

    def _first_heartbeat(self, partition: int, now: float, wall: float) -> int | None:
        """Write the first heartbeat and wait for its offset: reading starts exactly there.

        Starting at our own first heartbeat (rather than "latest", resolved later) means the
        read-back can never skip it, and nothing older is read.
        """
        assert isinstance(self._state, FastNeliState) and self._producer is not None
        beat = self._state.heartbeat_for(partition, now, wall)
        written: list[int] = []

        def report(offset: int | None, error: str | None) -> None:
            if offset is not None:
                written.append(offset)
            elif error is not None:
                self._warn_once(f"delivery:{error}", "first heartbeat of member %s to "
                                "partition %d not delivered: %s", self._member_id, partition,
                                error)

        key, value = beat.encode()
        self._producer.send(partition, key, value, report)
        self._producer.flush(min(self._r.heartbeat_timeout, self._r.request_timeout))
        return written[0] if written else None

    def _on_revoke(self, partitions: Sequence[int]) -> None:
        now, wall = self._clock.monotonic(), self._clock.time()
        self._emit(self._state.evaluate(now, wall))
        log.info("member %s: partition(s) %s revoked", self._member_id, list(partitions))
        self._run_revoke_barrier(self._state.revoke(partitions, now, wall,
                                                    closing=self._closing.is_set()))
        if not self._closing.is_set():
            self._hints.rewatch()
        elif self._r.release_hints:
            # Closing: the barrier is done and LeaveGroup follows this callback. Hint now, so
            # followers ask for the partition while the leave is on its way.
            self._write_release_hints([p for p in partitions if p in self._state.partition_roles])

    def _on_lost(self, partitions: Sequence[int]) -> None:
        now, wall = self._clock.monotonic(), self._clock.time()
        self._emit(self._state.evaluate(now, wall))
        log.warning("member %s: partition(s) %s lost (another member may own them)",
                    self._member_id, list(partitions))
        self._emit(self._state.lose(partitions, now, wall, REASON_PARTITION_LOST))
        if not self._closing.is_set():
            self._hints.rewatch()

    def _on_commit(self, offsets: Mapping[int, int], error: str | None) -> None:
        now, wall = self._clock.monotonic(), self._clock.time()
        self._emit(self._state.evaluate(now, wall))
        self._state.commit_done(offsets, error)
        if error is not None:
            log.debug("member %s: offset commit %s rejected: %s", self._member_id,
                      dict(offsets), error)
