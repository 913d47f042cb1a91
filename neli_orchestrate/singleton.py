"""Run each run of a singleton role exactly once across deployments: lead, fence, decide, run.

Usage::

    singleton = Singleton(SingletonConfig(neli=NeliConfig(bootstrap_servers="127.0.0.1:9092"),
                                          namespace="acme", deployment="us-east-1"))
    with singleton.claim(role="daily_flights", run_key="2013-01-05") as run:
        if run.should_run:
            build_table(token=run.token)     # leaving the block records COMPLETED

The steps of one claim (docs/design.md, layer 3): become leader of the role's NELI group → begin the
role's transactional ledger writer (``init_transactions()`` fences every earlier leader at the
broker) → replay the ledger → apply the decision table (:mod:`neli_orchestrate.decision`) →
write the claim with a new, larger token → run the work while a watchdog thread keeps the
member polled → record ``COMPLETED`` or ``FAILED`` → close the member, so the next deployment
does not wait for a session timeout.

The split form serves orchestrators whose gate and work run in different processes (Airflow):
:meth:`Singleton.reserve` writes ``CLAIMED`` with a handoff deadline and releases leadership;
:meth:`Singleton.execute` re-acquires it, checks that the claim is still ours, and runs.

Pass ``metrics=`` (a :data:`~neli_orchestrate.metrics.MetricsHook`) to count claims, skips,
takeovers, fences and leadership changes and to time leadership acquisition.

.. note:: Exactly-once holds for the ledger and for token-checked sinks. A job that writes
   elsewhere must be idempotent for the narrow windows described in ``docs/guarantees.md``
   (e.g. a fence that arrives after the external write but before ``COMPLETED`` is recorded).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from neli_orchestrate.claim import Claim
from neli_orchestrate.core import LeaderFenced, LeaderRevoked, Neli, NeliConfig
from neli_orchestrate.core.kafka import RECONNECT_BACKOFF_MS, ConfluentKafka
from neli_orchestrate.core.namespace import Namespace, derive
from neli_orchestrate.decision import (
    Claimant,
    ClaimStatus,
    Decision,
    DecisionPolicy,
    FailedRetry,
    Outcome,
    check_claim,
    claim_record,
    decide,
    reset_record,
    skipped_reason,
)
from neli_orchestrate.errors import (
    AcquireTimeoutError,
    ConfigError,
    FencedError,
    SkippedRun,
    WorkNotStopped,
    WorkSkipped,
)
from neli_orchestrate.ledger import (
    KafkaLedger,
    KafkaLedgerConfig,
    LedgerRecord,
    LedgerStore,
    LedgerWriter,
    Replay,
    RunState,
    expire,
)
from neli_orchestrate.liveness import DeploymentLiveness, LivenessReader
from neli_orchestrate.metrics import Metric, MetricEvent, MetricsHook, emit

log = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = ["Reservation", "Run", "Singleton", "SingletonConfig"]


@dataclass(frozen=True)
class SingletonConfig:
    """How a deployment takes part in singleton runs; one configuration serves many roles.

    ``namespace`` (required) names every Kafka resource the deployment shares with the others
    (:func:`neli_orchestrate.core.namespace.derive`): role ``r`` contends in the group
    ``<namespace>.<r>`` on the leader topic ``<namespace>.neli``, and runs are recorded in the
    ledger ``<namespace>.ledger`` (``ledger_topic`` overrides it). ``neli`` carries the
    connection and timing settings; its ``group_id`` and ``topic`` must stay unset.

    - ``handoff_timeout``: seconds another deployment's ``CLAIMED`` (and a ``FAILED`` retry of
      the failing deployment) is respected. Must exceed the gate→executor delay of the
      orchestrator plus leadership acquisition.
    - ``acquire_timeout``: seconds to wait for leadership of a role before answering ``WAIT``
      (claim, reserve) or raising :class:`AcquireTimeoutError` (execute).
    - A routine revocation (another member joins, or ours closes) waits for in-flight work
      and its ``COMPLETED`` record up to the member's ``revoke_timeout`` (``NeliConfig``,
      below the rebalance timeout ``max_poll_interval``); past it the member is fenced.
    - ``max_clock_error``: bound on the wall-clock difference between deployments.
    """

    #: Connection and timing settings of each role's NELI member (``group_id`` and ``topic``
    #: stay unset: they derive from ``namespace``).
    neli: NeliConfig
    #: Id of this orchestrator deployment (region), e.g. ``us-east-1``; unique per deployment,
    #: recorded in the ledger.
    deployment: str
    #: Names every shared Kafka resource (groups, leader topic, ledger); required, the same in
    #: every deployment that shares runs.
    namespace: str | None = None
    #: Ledger topic (None: ``<namespace>.ledger``); the same in every deployment.
    ledger_topic: str | None = None
    handoff_timeout: float = 300.0
    acquire_timeout: float = 60.0
    #: Who runs a ``FAILED`` run key again: the failing deployment first, anyone after
    #: ``handoff_timeout`` (``SAME_DEPLOYMENT_FIRST``), anyone at once (``ANY_DEPLOYMENT``), or
    #: only the failing deployment (``SAME_DEPLOYMENT_ONLY``).
    failed_retry: FailedRetry = FailedRetry.SAME_DEPLOYMENT_FIRST
    #: Attempts per run key before it fails for good (``GIVE_UP``; reset it to run again);
    #: None: no limit.
    max_attempts: int | None = None
    max_clock_error: float = 1.0
    #: Partitions of the ledger topic when this deployment creates it (roles hash onto them).
    ledger_partitions: int = 1
    #: Continue ledger replays from a checkpoint (in memory and a file per role on this host)
    #: when safe, instead of reading the role's partition from offset 0 on every claim
    #: (``KafkaLedgerConfig.replay_cache``; docs/ledger.md, "Replay cache").
    ledger_replay_cache: bool = True
    #: Directory of the replay cache files (None: ``$XDG_CACHE_HOME/neli-orchestrate/ledger``;
    #: an empty string: memory only).
    ledger_replay_cache_dir: str | None = None
    #: Poll interval of the watchdog and of leadership acquisition, seconds.
    poll_interval: float = 0.05
    #: Read other deployments' liveness (:mod:`neli_orchestrate.liveness`) when deciding: the
    #: ``CLAIMED``/``FAILED`` record of a deployment Kafka shows gone is taken over at once.
    #: False: the handoff window alone (as before).
    deployment_liveness: bool = True
    #: Seconds of silence after which this deployment counts as gone, when it announces its
    #: liveness (the Airflow scheduler listener, the Dagster sidecar); the liveness group's
    #: session timeout. Longer than a routine restart of the announcing component.
    liveness_timeout: float = 10.0
    policy: DecisionPolicy = field(init=False, repr=False)
    names: Namespace = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.deployment, str) or not self.deployment.strip():
            raise ConfigError("deployment must name this orchestrator deployment, e.g. 'us-east-1'")
        for name in ("group_id", "topic"):
            if getattr(self.neli, name) is not None:
                raise ConfigError(
                    f"SingletonConfig derives each role's group and the leader topic from the "
                    f"namespace: leave NeliConfig.{name} unset and pass "
                    f"SingletonConfig(namespace=...) instead")
        object.__setattr__(self, "names", derive(self.namespace, ledger_topic=self.ledger_topic))
        for name in ("acquire_timeout", "poll_interval", "liveness_timeout"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        # DecisionPolicy validates handoff_timeout, max_attempts and max_clock_error.
        policy = DecisionPolicy(
            handoff_timeout=self.handoff_timeout,
            failed_retry=self.failed_retry,
            max_attempts=self.max_attempts,
            max_clock_error=self.max_clock_error,
        )
        object.__setattr__(self, "policy", policy)

    def role_neli(self, role: str) -> NeliConfig:
        """The NELI configuration of ``role``'s group."""
        return dataclasses.replace(self.neli, group_id=self.names.group_id(role),
                                   topic=self.names.leader_topic)

    def ledger_config(self) -> KafkaLedgerConfig:
        """The ledger's Kafka configuration, sharing the member's client settings."""
        return KafkaLedgerConfig(
            bootstrap_servers=self.neli.bootstrap_servers,
            topic=self.names.ledger_topic,
            partitions=self.ledger_partitions,
            transactional_id_prefix=self.names.transactional_id_prefix,
            kafka_config=ledger_client_settings(self.neli.kafka_config),
            replay_cache=self.ledger_replay_cache,
            replay_cache_dir=self.ledger_replay_cache_dir,
        )


def ledger_client_settings(kafka_config: Any) -> dict[str, Any]:
    """Connection and security settings of a member's kafka_config that the ledger shares."""
    keep = ("security.", "sasl.", "ssl.", "client.", "socket.", "broker.", "metadata.",
            "reconnect.", "retry.", "retries", "debug", "log_level")
    return {k: v for k, v in dict(kafka_config).items() if k.startswith(keep)}


@dataclass(frozen=True)
class Reservation:
    """Answer of :meth:`Singleton.reserve`: whether this deployment now holds the run's claim."""

    role: str
    run_key: str
    outcome: Outcome
    reason: str
    #: The claim's fencing token when :attr:`should_run`, else None.
    token: int | None
    #: The latest ledger record the decision saw (for SKIP_DONE: who completed it, and when).
    record: LedgerRecord | None
    deployment: str
    #: WAIT: wall-clock time after which asking again may give another answer (None: ask at
    #: the caller's own interval; another member leads, or the other deployment must act).
    wait_until: float | None = None

    @property
    def should_run(self) -> bool:
        """True if this deployment holds a fresh claim and its executor should run the work."""
        return self.token is not None

    @property
    def claim(self) -> Claim | None:
        """The claim this deployment holds (the handle its work gets), None unless
        :attr:`should_run`."""
        if self.token is None:
            return None
        return Claim(token=self.token, run_key=self.run_key, role=self.role,
                     deployment=self.deployment)


@dataclass(frozen=True, eq=False, repr=False)
class Run(Reservation):
    """One run of a role inside :meth:`Singleton.claim` or :meth:`Singleton.execute`: the
    answer, held while the work runs, and fenced (:meth:`check`, :meth:`on_fence`) if
    leadership is lost meanwhile.

    ``outcome`` says what the decision table decided; run the work only if :attr:`should_run`.
    """

    def __post_init__(self) -> None:
        object.__setattr__(self, "_lock", threading.Lock())
        object.__setattr__(self, "_fenced", None)
        object.__setattr__(self, "_callbacks", [])

    _lock: threading.Lock = field(init=False, repr=False)
    _fenced: str | None = field(init=False, repr=False)
    _callbacks: list[Callable[[str], object]] = field(init=False, repr=False)

    @property
    def fenced(self) -> bool:
        """True once leadership was lost while the work ran."""
        return self._fenced is not None

    def on_fence(self, callback: Callable[[str], object]) -> None:
        """Call ``callback(reason)`` from the watchdog thread when leadership is lost.

        Use it to stop the work at once (kill spark-submit, cancel a Spark job group). A
        callback registered after the fence runs immediately.

        .. note:: Callbacks run on the watchdog thread; keep them short and thread-safe.
        """
        with self._lock:
            reason = self._fenced
            if reason is None:
                self._callbacks.append(callback)
        if reason is not None:
            _call_quietly(callback, reason)

    def check(self) -> None:
        """Raise :class:`FencedError` if this member no longer holds the run."""
        reason = self._fenced
        if reason is not None:
            raise FencedError(
                f"role {self.role!r} run {self.run_key!r} (token {self.token}) was fenced:"
                f" {reason}",
                role=self.role,
                token=self.token,
            )

    def _fence(self, reason: str) -> None:
        with self._lock:
            if self._fenced is not None:
                return
            object.__setattr__(self, "_fenced", reason)
            callbacks = self._callbacks
            object.__setattr__(self, "_callbacks", [])
        log.error("fenced: role %r run %r token %s: %s", self.role, self.run_key, self.token,
                  reason)
        for callback in callbacks:
            _call_quietly(callback, reason)

    def __repr__(self) -> str:
        return (f"Run(role={self.role!r}, run_key={self.run_key!r}, outcome={self.outcome},"
                f" token={self.token})")


def _call_quietly(callback: Callable[[str], object], reason: str) -> None:
    try:
        callback(reason)
    except Exception:  # noqa: BLE001 - one bad callback must not stop the others
        log.exception("fence callback %r failed", callback)


NeliFactory = Callable[..., Any]


class _Leadership:
    """The NELI member of one role for one claim: acquire, keep polled, watch, release.

    From the moment it leads, a watchdog thread pulses the member (heartbeats stop otherwise,
    and the member would fence itself while the ledger is being replayed). A loss of
    leadership is remembered in :attr:`lost` and fences the attached run.
    """

    def __init__(self, singleton: Singleton, role: str) -> None:
        self.role = role
        self._config = singleton.config
        self._clock = singleton._clock
        self._metric = singleton._metric
        self._lock = threading.Lock()
        self._run: Run | None = None
        self._lost: str | None = None
        self._work_done = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.neli = singleton._neli_factory(self._config.role_neli(role), barrier=self._barrier)

    @property
    def member(self) -> str:
        return str(self.neli.member_id)

    @property
    def lost(self) -> str | None:
        """Why leadership was lost since :meth:`acquire` succeeded, or None."""
        return self._lost

    def acquire(self, timeout: float) -> bool:
        """Poll until this member leads the role or ``timeout`` passes; then start the watchdog."""
        started = self._clock()
        deadline = started + timeout
        while not self.neli.pulse(timeout=self._config.poll_interval):
            if self._clock() >= deadline:
                return False
        self._metric(Metric.LEADER_ACQUIRED, self.role)
        self._metric(Metric.TIME_TO_LEAD, self.role, value=self._clock() - started)
        self._thread = threading.Thread(target=self._watchdog, name=f"neli-watchdog-{self.role}",
                                        daemon=True)
        self._thread.start()
        return True

    def attach(self, run: Run) -> None:
        """Fence ``run`` when leadership is lost (at once if it already was)."""
        with self._lock:
            self._run = run
            reason = self._lost
        if reason is not None:
            run._fence(reason)

    def verify(self) -> None:
        """Check leadership now (not only at the watchdog's next pulse); a loss fences the run."""
        if self._lost is None and not self.neli.is_leader:
            self._lose("leadership lost before the work started (lease lapsed)")

    def work_finished(self) -> None:
        """The work and its end record are done: release a waiting revoke barrier."""
        self._work_done.set()

    def _lose(self, reason: str) -> None:
        with self._lock:
            if self._lost is not None:
                return
            self._lost = reason
            run = self._run
        log.warning("member %s lost leadership of role %r: %s", self.member, self.role, reason)
        self._metric(Metric.LEADER_LOST, self.role)
        if run is not None:
            run._fence(reason)

    def _watchdog(self) -> None:
        while not self._stop.is_set() and self._lost is None:
            try:
                leading = self.neli.pulse(timeout=self._config.poll_interval)
            except Exception as exc:  # noqa: BLE001 - a broken member cannot vouch for the run
                self._lose(f"the NELI member failed: {exc!r}")
                break
            if not leading and not self._stop.is_set() and not self._work_done.is_set():
                self._lose("leadership lost (own heartbeat missing or partition lost)")
                break
        if self._lost is not None and not self._stop.is_set():
            # A fenced member is closed at once (it leaves the group), not left unpolled in it
            # until max_poll_interval: the successor is assigned within the session timeout
            # even while work that cannot be cancelled is still finishing. (Not from inside
            # the barrier: LeaderFenced only flags the loss; this thread closes.)
            self._close_member()

    def _close_member(self) -> None:
        try:
            self.neli.close()
        except Exception:  # noqa: BLE001 - closing is best effort; the group times us out
            log.warning("closing the NELI member of role %r failed", self.role, exc_info=True)

    def _barrier(self, event: object) -> None:
        if isinstance(event, LeaderFenced):
            self._lose(f"fenced: {getattr(event, 'reason', event)}")
        elif isinstance(event, LeaderRevoked):
            # The revoke barrier: the successor is not assigned until this returns, so the
            # work and its COMPLETED record finish under our leadership. Past event.deadline
            # the member fences itself (LeaderFenced, delivered concurrently).
            if self._run is None or self._work_done.is_set():
                return
            remaining = event.deadline - self._clock()
            log.info("role %r revoked: waiting up to %.1f s for run %r to finish", self.role,
                     remaining, self._run.run_key)
            self._work_done.wait(max(0.0, remaining))

    def close(self) -> None:
        self._stop.set()
        self._work_done.set()
        # Close the member first: Neli.close wakes the watchdog's pulse at once (an extra own
        # heartbeat), where joining first waited for the pulse's poll_interval to run out.
        self._close_member()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(5.0, 10 * self._config.poll_interval))


class Singleton:
    """Claim and run singleton work exactly once across deployments (see the module docstring).

    Thread-safe for concurrent claims of different roles. Cheap to construct: Kafka clients
    are created on first use. Call :meth:`close` (or use it as a context manager) when done.
    """

    def __init__(
        self,
        config: SingletonConfig,
        *,
        ledger: LedgerStore | None = None,
        neli_factory: NeliFactory | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        membership: Callable[[str], int] | None = None,
        metrics: MetricsHook | None = None,
        liveness: Callable[[str], DeploymentLiveness] | None = None,
    ) -> None:
        self.config = config
        self._metrics = metrics
        self._ledger = ledger
        self._ledger_lock = threading.Lock()
        self._neli_factory: NeliFactory = neli_factory or Neli
        self._clock = clock
        self._wall = wall_clock
        # How many members a consumer group has (by group id): the broker's answer, unless
        # members are injected (tests, simulations): then groups count as idle unless the
        # caller injects membership as well.
        self._membership: Callable[[str], int] = membership or (
            self._describe_members if neli_factory is None else (lambda group: 0))
        self._admin: Any = None
        self._liveness_admin: Any = None
        # Another deployment's liveness (by deployment): Kafka's answer, unless injected
        # (tests, simulations); None: no information (the handoff window alone).
        self._liveness: Callable[[str], DeploymentLiveness] | None = liveness or (
            self._read_liveness if neli_factory is None else None)

    # -- public API --------------------------------------------------------------------------

    @property
    def ledger(self) -> LedgerStore:
        """The run ledger (created on first use)."""
        with self._ledger_lock:
            if self._ledger is None:
                self._ledger = KafkaLedger(self.config.ledger_config())
            return self._ledger

    def status(self, role: str, run_key: str) -> LedgerRecord | None:
        """The latest ledger record of a run (read-only; no leadership needed)."""
        return self.ledger.replay(role).latest(run_key)

    def role_members(self, role: str) -> int:
        """How many members contend for ``role`` right now; read-only (no join, no rebalance).

        Non-zero means some deployment leads the role or is trying to. Waiting callers (gates,
        sensors) need not: :meth:`reserve`, :meth:`claim` and :meth:`leads` apply the busy-group
        rule themselves. Raises :class:`KafkaUnavailableError` if the cluster does not answer.
        """
        return self._membership(self.config.role_neli(role).resolved.group_id)

    def _describe_members(self, group: str) -> int:
        neli = self.config.neli.resolved
        with self._ledger_lock:
            if self._admin is None:
                # through the Kafka seam, with the short first reconnect of every member
                # client (core.kafka): this client's first request is the gate's busy check
                self._admin = ConfluentKafka().admin(self._admin_settings())
            admin = self._admin
        return int(admin.group_members(group, neli.request_timeout))

    def _admin_settings(self) -> dict[str, Any]:
        neli = self.config.neli.resolved
        return {"reconnect.backoff.ms": RECONNECT_BACKOFF_MS,
                **ledger_client_settings(neli.kafka_config),
                "bootstrap.servers": neli.bootstrap_servers,
                "logger": logging.getLogger(__name__ + ".librdkafka")}

    def _liveness_of(self, latest: LedgerRecord | None, me: Claimant) -> DeploymentLiveness | None:
        """Kafka's reading of the deployment whose unfinished record another one would respect;
        None when the rule does not need it or cannot get it (then the handoff window holds)."""
        if (self._liveness is None or not self.config.deployment_liveness or latest is None
                or latest.deployment == me.deployment
                or latest.state not in (RunState.CLAIMED, RunState.FAILED)):
            return None
        try:
            seen = self._liveness(latest.deployment)
        except Exception as exc:  # noqa: BLE001 - no information: today's rule, never a guess
            log.warning("cannot read the liveness of deployment %r (%s): respecting its %s"
                        " record for the handoff window", latest.deployment, exc, latest.state)
            return None
        log.info("liveness: %s", seen.describe())
        return seen

    def _read_liveness(self, deployment: str) -> DeploymentLiveness:
        from confluent_kafka.admin import AdminClient

        with self._ledger_lock:
            if self._liveness_admin is None:
                # the liveness reader lists, describes and reads offsets of liveness groups:
                # more than the member seam's admin offers (read-only, no join)
                self._liveness_admin = AdminClient(self._admin_settings())
            admin = self._liveness_admin
        reader = LivenessReader(admin, self.config.names.name,
                                request_timeout=self.config.neli.resolved.request_timeout)
        return reader.read(deployment)

    def expire(self, role: str, retention: float) -> list[str]:
        """Tombstone ``role``'s finished run keys last written over ``retention`` seconds ago.

        Leads the role first (only the leader writes the ledger); returns the expired run keys,
        or raises :class:`AcquireTimeoutError`. Running and claimed runs are never expired.
        Compaction then removes them; tokens keep increasing (they are offsets).
        """
        lead = _Leadership(self, role)
        try:
            if not lead.acquire(self.config.acquire_timeout):
                raise AcquireTimeoutError(f"could not lead role {role!r} to expire its ledger")
            writer = self.ledger.begin(role)
            try:
                return expire(writer, self._wall() - retention)
            finally:
                writer.close()
        finally:
            lead.close()

    def leads(self, role: str, timeout: float) -> bool:
        """True if this deployment's member became leader of ``role`` within ``timeout``.

        False at once, without joining, while the role's group is busy (the busy-group rule,
        see :meth:`reserve`).

        .. note:: Leadership ends when this returns (the member leaves the group); use it to
           wait for a region to be able to lead, not as a lock.
        """
        members = self.role_members(role)
        if members:
            log.info("role %r is busy (%d member(s) lead or wait for it): not joining", role,
                     members)
            return False
        lead = _Leadership(self, role)
        try:
            return lead.acquire(timeout)
        finally:
            lead.close()

    @contextlib.contextmanager
    def claim(self, role: str, run_key: str) -> Iterator[Run]:
        """Lead ``role``, decide on ``run_key`` and, if it is ours to run, hold it for the block.

        Inside the block run the work only if ``run.should_run``. Leaving the block normally
        records ``COMPLETED``; an exception records ``FAILED`` (and is re-raised); a fence
        raises :class:`FencedError` (nothing is recorded: the next leader takes over).
        Follows the busy-group rule of :meth:`reserve`.
        """
        busy = self._busy_while_preparing(role, run_key)
        if busy is not None:
            yield busy
            return
        lead = _Leadership(self, role)
        writer: LedgerWriter | None = None
        try:
            run, record, writer = self._lead_and_claim(lead, role, run_key, RunState.RUNNING)
            if record is None or not run.should_run:
                if writer is not None:
                    writer.close()
                    writer = None
                lead.close()  # release at once: a WAIT must not hold the claimant's executor
                yield run
                return
            with contextlib.suppress(WorkSkipped), self._hold(lead, writer, run, record):
                yield run  # a WorkSkipped ends the block: recorded COMPLETED (skipped)
        finally:
            if writer is not None:
                writer.close()
            lead.close()

    def run(self, role: str, run_key: str, work: Callable[[Run], T]) -> T | None:
        """Claim and, if ours, run ``work(run)``; returns its value, or None when not run."""
        with self.claim(role, run_key) as run:
            if not run.should_run:
                return None
            return work(run)

    def reserve(self, role: str, run_key: str) -> Reservation:
        """Gate (split form): decide and, if ours, record ``CLAIMED`` with a handoff deadline.

        Releases leadership before returning, so this deployment's executor (another process)
        can acquire it. ``WAIT`` means another deployment leads the role or holds a live claim:
        ask again later — never skip a run on WAIT.

        The busy-group rule: while anyone leads the role or waits for it (its group has
        members), this does not join the group — every join rebalances the group under the
        running leader, and under classic groups may fence it. It reads the ledger instead:
        ``SKIP_DONE`` (or ``GIVE_UP``) when the run key is finished, else ``WAIT``.
        """
        busy = self._busy_while_preparing(role, run_key)
        if busy is not None:
            return self._reservation(busy)
        lead = _Leadership(self, role)
        writer: LedgerWriter | None = None
        try:
            run, _, writer = self._lead_and_claim(lead, role, run_key, RunState.CLAIMED)
            return self._reservation(run)
        finally:
            if writer is not None:
                writer.close()
            lead.close()

    def execute(
        self,
        role: str,
        run_key: str,
        token: int,
        work: Callable[[Run], T],
        *,
        on_fence: Callable[[str], object] | None = None,
    ) -> T:
        """Executor (split form): re-acquire, verify claim ``token``, run ``work(run)``, record.

        ``token`` is the gate's (an orchestrator passes the same one to every try of the task,
        e.g. from XCom). If its claim is still the run key's current, unstarted claim, this
        records ``RUNNING`` under it. If the run key moved on since (an earlier try ran and
        failed or was fenced, a re-run gate claimed again, another deployment took over),
        this try decides again from the ledger as a gate would: it runs under a new, larger
        token when the decision table allows (``RETRY``/``TAKE_OVER``; the work must use
        ``run.token``, not the reserved one). Then ``COMPLETED`` (returns the value) or
        ``FAILED`` (re-raises). No number of tries strands a run key.

        Raises :class:`SkippedRun` if the run was completed; :class:`AcquireTimeoutError` if
        leadership could not be acquired within ``acquire_timeout`` or another deployment
        holds a live claim on the run (retry the try later); :class:`FencedError` if
        leadership was lost (before or during the work: no work starts once fenced), if the
        run key terminally failed (``max_attempts``), or if ``token`` is not a claim this
        ledger issued for the run key.
        """
        self._warm(role)
        lead = _Leadership(self, role)
        writer: LedgerWriter | None = None
        try:
            if not lead.acquire(self.config.acquire_timeout):
                raise AcquireTimeoutError(
                    f"could not lead role {role!r} within {self.config.acquire_timeout} s to run"
                    f" {run_key!r}; another member holds it (latest record:"
                    f" {_describe(self.status(role, run_key))})"
                )
            writer = self.ledger.begin(role)
            me = Claimant(self.config.deployment, lead.member)
            replay = writer.replay()
            now = self._wall()
            latest = replay.latest(run_key)
            check = check_claim(token, latest, me)
            log.info("role %r run %r: claim %s is %s: %s", role, run_key, token, check.status,
                     check.reason)
            if check.status is ClaimStatus.COMPLETED:
                raise SkippedRun(f"run {run_key!r} of role {role!r} is {check.reason}")
            if check.ok and latest is not None:
                record = latest.advance(RunState.RUNNING, at=now, member=me.member)
                decision_outcome, reason = Outcome.RUN, check.reason
            elif check.decide_again:
                record, decision_outcome, reason = self._decide_again(
                    writer, replay, role, run_key, token, me, now)
            else:
                raise FencedError(
                    f"claim {token} of run {run_key!r} (role {role!r}) is not this ledger's"
                    f" current claim: {check.reason}", role=role, token=token, final=True)
            if lead.lost is not None:
                raise FencedError(f"lost leadership of role {role!r} before running {run_key!r}:"
                                  f" {lead.lost}", role=role, token=token)
            writer.write(record)
            if record.token != token:  # a new claim (decided again), not the gate's
                self._count(role, run_key, decision_outcome)
            run = Run(role=role, run_key=run_key, deployment=self.config.deployment,
                      outcome=decision_outcome, reason=reason, token=record.token,
                      record=latest)
            if on_fence is not None:
                run.on_fence(on_fence)
            with self._hold(lead, writer, run, record):
                return work(run)
        finally:
            if writer is not None:
                writer.close()
            lead.close()

    def _decide_again(
        self, writer: LedgerWriter, replay: Replay, role: str, run_key: str, token: int,
        me: Claimant, now: float,
    ) -> tuple[LedgerRecord, Outcome, str]:
        """An executor try whose claim moved on decides again, as a gate would.

        Returns the RUNNING claim to write (a new, larger token); raises when this try must
        not run: :class:`SkippedRun` (completed), :class:`AcquireTimeoutError` (another
        deployment's claim is live: fail this try cleanly, the orchestrator retries later),
        :class:`FencedError` (``max_attempts`` reached: terminally failed).
        """
        latest = replay.latest(run_key)
        decision = decide(latest, me, now=now, policy=self.config.policy,
                          liveness=self._liveness_of(latest, me))
        self._log_decision(role, run_key, decision)
        if not decision.claims:
            self._count(role, run_key, decision.outcome)
        if decision.claims:
            record = claim_record(decision, replay, run_key=run_key, me=me, now=now,
                                  policy=self.config.policy, state=RunState.RUNNING)
            log.info("role %r run %r: try with claim %s runs again under token %s (%s)", role,
                     run_key, token, record.token, decision.outcome)
            return record, decision.outcome, decision.reason
        if decision.outcome is Outcome.SKIP_DONE:
            raise SkippedRun(f"run {run_key!r} of role {role!r} is {decision.reason}")
        if decision.outcome is Outcome.WAIT:
            until = ("" if decision.wait_until is None else " until " + time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime(decision.wait_until)))
            raise AcquireTimeoutError(
                f"run {run_key!r} of role {role!r} is held by another deployment{until}:"
                f" {decision.reason}. This try does not run; a later try (retry the task)"
                " decides again and runs it if that claim lapses")
        if decision.record_failure:
            # RUNNING at max_attempts: record the terminal failure, as a gate would.
            failure = claim_record(decision, replay, run_key=run_key, me=me, now=now,
                                   policy=self.config.policy)
            writer.write(failure)
        raise FencedError(
            f"run {run_key!r} of role {role!r} may not run again: {decision.outcome}:"
            f" {decision.reason}. Reset it to run it again (Singleton.reset)",
            role=role, token=token, final=True)

    def reset(self, role: str, run_key: str, reason: str) -> LedgerRecord:
        """Reset a finished run key so that its next run starts over (audited; leader only).

        Writes a ``RESET`` record with ``reason`` (who asks and why), this deployment and a new
        token: the decision table treats it as no record (the next gate or claim anywhere
        runs the run key again, attempt 1, under a still larger token). Only ``COMPLETED`` or
        ``FAILED`` run keys may be reset; a ``CLAIMED`` or ``RUNNING`` one is in progress.
        Returns the record written. Raises :class:`ConfigError` (no reason, or the run key
        is in progress or has nothing to reset) or :class:`AcquireTimeoutError`.

        .. note:: Whatever the earlier run wrote stays; a token-checked sink replaces it when
           the re-run publishes with its larger token.
        """
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError("Singleton.reset needs a reason (who asks, and why), for the audit"
                              " trail")
        lead = _Leadership(self, role)
        try:
            if not lead.acquire(self.config.acquire_timeout):
                raise AcquireTimeoutError(
                    f"could not lead role {role!r} within {self.config.acquire_timeout} s to"
                    f" reset {run_key!r}; another member holds it, try again when it is idle")
            writer = self.ledger.begin(role)
            try:
                me = Claimant(self.config.deployment, lead.member)
                replay = writer.replay()
                latest = replay.latest(run_key)
                try:
                    record = reset_record(latest, replay, run_key=run_key, me=me,
                                          now=self._wall(), reason=reason)
                except ValueError as exc:
                    raise ConfigError(str(exc)) from None
                if lead.lost is not None:
                    raise FencedError(f"lost leadership of role {role!r} before resetting"
                                      f" {run_key!r}: {lead.lost}", role=role)
                writer.write(record)
            finally:
                writer.close()
        finally:
            lead.close()
        log.warning("role %r run %r reset by %s (token %s; was %s): %s", role, run_key,
                    self.config.deployment, record.token, _describe(latest), record.reason)
        return record

    def close(self) -> None:
        """Release the ledger's Kafka clients."""
        with self._ledger_lock:
            if self._ledger is not None:
                self._ledger.close()
                self._ledger = None

    def __enter__(self) -> Singleton:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------

    def _lead_and_claim(
        self, lead: _Leadership, role: str, run_key: str, state: RunState
    ) -> tuple[Run, LedgerRecord | None, LedgerWriter | None]:
        """Acquire, fence earlier leaders, replay, decide and write the claim (as ``state``).

        Returns the run, the claim record written (None if the decision claims nothing) and
        the open writer (None if leadership was not acquired).
        """
        if not lead.acquire(self.config.acquire_timeout):
            return self._not_leading(role, run_key), None, None
        writer = self.ledger.begin(role)  # init_transactions(): fences every earlier leader
        try:
            me = Claimant(self.config.deployment, lead.member)
            replay = writer.replay()
            now = self._wall()
            latest = replay.latest(run_key)
            decision = decide(latest, me, now=now, policy=self.config.policy,
                              liveness=self._liveness_of(latest, me))
            self._log_decision(role, run_key, decision)
            if not decision.claims:
                self._count(role, run_key, decision.outcome)
            if not decision.writes:
                return self._run_for(role, run_key, decision, token=None), None, writer
            record = claim_record(decision, replay, run_key=run_key, me=me, now=now,
                                  policy=self.config.policy, state=state)
            if lead.lost is not None:
                # Never write a claim without leadership; whoever leads now decides instead.
                run = Run(role=role, run_key=run_key, deployment=self.config.deployment,
                          outcome=Outcome.WAIT, reason=f"lost leadership while deciding:"
                          f" {lead.lost}", token=None, record=decision.latest)
                return run, None, writer
            writer.write(record)
            if decision.claims:
                self._count(role, run_key, decision.outcome)
        except BaseException:
            writer.close()
            raise
        token = record.token if decision.claims else None
        return self._run_for(role, run_key, decision, token=token), record, writer

    def _busy_while_preparing(self, role: str, run_key: str) -> Run | None:
        """:meth:`_busy`, while the ledger prepares (:meth:`_warm`) on a helper thread: their
        round trips are independent, and a new process pays both (two Kafka clients)."""
        prepared: Future[None] = Future()

        def prepare() -> None:
            try:
                self._warm(role)
            except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
                prepared.set_exception(exc)
            else:
                prepared.set_result(None)

        threading.Thread(target=prepare, name=f"neli-prepare-{role}", daemon=True).start()
        try:
            busy = self._busy(role, run_key)
        finally:
            prepared.exception()  # wait: nothing joins the group before the ledger is ready
        prepared.result()
        return busy

    def _warm(self, role: str) -> None:
        """Before joining: a first replay from offset 0 runs here, not against the lease, and
        the ledger producer connects (``KafkaLedger.prepare``)."""
        ledger = self.ledger
        if isinstance(ledger, KafkaLedger):
            ledger.prepare(role)

    @contextlib.contextmanager
    def _hold(self, lead: _Leadership, writer: LedgerWriter, run: Run,
              record: LedgerRecord) -> Iterator[Run]:
        """Around the work: watchdog on; then record COMPLETED, FAILED, or raise FencedError.

        No work starts under a fenced run: once the run is attached (a fence from now on
        reaches it), leadership is checked again, so a fence that landed between the claim
        check and here (e.g. during a slow ``RUNNING`` write) fails the try before the work.
        """
        run.on_fence(lambda reason: self._metric(Metric.FENCE, run.role, run.run_key))
        lead.attach(run)
        try:
            lead.verify()
            run.check()
            try:
                yield run
            except WorkSkipped as exc:
                # The work skipped itself: terminal (COMPLETED, "skipped by the task"), never
                # FAILED, which another region would take over and skip again, for ever.
                run.check()
                self._write_end(writer, run, record.advance(
                    RunState.COMPLETED, at=self._wall(), reason=skipped_reason(str(exc))))
                raise
            except BaseException as exc:
                if isinstance(exc, FencedError):
                    raise
                run.check()  # fenced: the work failed because it was stopped; record nothing
                reason = f"{type(exc).__name__}: {exc}"[:2000]
                unstopped = exc.application if isinstance(exc, WorkNotStopped) else ""
                self._write_end(writer, run, record.advance(RunState.FAILED, at=self._wall(),
                                                            reason=reason, unstopped=unstopped))
                raise
            run.check()
            self._write_end(writer, run, record.advance(RunState.COMPLETED, at=self._wall()))
        finally:
            lead.work_finished()

    def _write_end(self, writer: LedgerWriter, run: Run, record: LedgerRecord) -> None:
        try:
            writer.write(record)
        except FencedError as exc:
            run._fence(f"the ledger refused the {record.state} record: {exc}")
            raise FencedError(
                f"role {run.role!r} run {run.run_key!r} (token {run.token}): a newer leader"
                f" fenced this member before it could record {record.state}",
                role=run.role, token=run.token) from exc
        log.info("role %r run %r %s (token %s)", run.role, run.run_key, record.state,
                 record.token)

    def _busy(self, role: str, run_key: str) -> Run | None:
        """The answer without joining when ``role``'s group is busy; None when it is idle."""
        members = self.role_members(role)
        if not members:
            return None
        latest = self.status(role, run_key)
        decision = decide(latest, Claimant(self.config.deployment, "-"), now=self._wall(),
                          policy=self.config.policy)
        busy = f"role {role!r} is busy ({members} member(s) lead or wait for it): not joining"
        outcome: Outcome
        until: float | None
        if decision.outcome in (Outcome.SKIP_DONE, Outcome.GIVE_UP):
            outcome, reason, until = decision.outcome, decision.reason, None
        elif decision.outcome is Outcome.WAIT:
            outcome, reason, until = Outcome.WAIT, f"{busy}; {decision.reason}", \
                decision.wait_until
        else:
            outcome, reason, until = Outcome.WAIT, f"{busy}; latest record: {_describe(latest)}", \
                None
        log.info("role %r run %r: %s: %s", role, run_key, outcome, reason)
        self._count(role, run_key, outcome)
        return Run(role=role, run_key=run_key, deployment=self.config.deployment,
                   outcome=outcome, reason=reason, token=None, record=latest, wait_until=until)

    def _not_leading(self, role: str, run_key: str) -> Run:
        latest = self.status(role, run_key)
        if latest is not None and latest.state is RunState.COMPLETED:
            outcome, reason = Outcome.SKIP_DONE, f"completed: {_describe(latest)}"
        else:
            outcome = Outcome.WAIT
            reason = (f"another member leads role {role!r} (not acquired within"
                      f" {self.config.acquire_timeout} s); latest record: {_describe(latest)}")
        log.info("role %r run %r: %s: %s", role, run_key, outcome, reason)
        self._count(role, run_key, outcome)
        return Run(role=role, run_key=run_key, deployment=self.config.deployment,
                   outcome=outcome, reason=reason, token=None, record=latest)

    def _run_for(self, role: str, run_key: str, decision: Decision, token: int | None) -> Run:
        return Run(role=role, run_key=run_key, deployment=self.config.deployment,
                   outcome=decision.outcome, reason=decision.reason, token=token,
                   record=decision.latest, wait_until=decision.wait_until)

    def _reservation(self, run: Run) -> Reservation:
        return Reservation(**{f.name: getattr(run, f.name)
                              for f in dataclasses.fields(Reservation)})

    def _metric(self, name: Metric, role: str, run_key: str | None = None, *,
                outcome: Outcome | None = None, value: float = 1.0) -> None:
        emit(self._metrics, MetricEvent(name=name, role=role, deployment=self.config.deployment,
                                        run_key=run_key, outcome=outcome, value=value))

    def _count(self, role: str, run_key: str, outcome: Outcome) -> None:
        """The metrics of one decision (a claim written, a skip, a wait, a give-up)."""
        self._metric(_OUTCOME_METRIC[outcome], role, run_key, outcome=outcome)
        if outcome is Outcome.TAKE_OVER:
            self._metric(Metric.TAKEOVER, role, run_key, outcome=outcome)

    @staticmethod
    def _log_decision(role: str, run_key: str, decision: Decision) -> None:
        log.info("role %r run %r: %s: %s", role, run_key, decision.outcome, decision.reason)


_OUTCOME_METRIC = {
    Outcome.RUN: Metric.CLAIM,
    Outcome.RETRY: Metric.CLAIM,
    Outcome.TAKE_OVER: Metric.CLAIM,
    Outcome.SKIP_DONE: Metric.SKIP,
    Outcome.WAIT: Metric.WAIT,
    Outcome.GIVE_UP: Metric.GIVE_UP,
}


def _describe(record: LedgerRecord | None) -> str:
    return "none" if record is None else record.describe()
