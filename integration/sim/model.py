"""The simulated system: NELI members, gate and executor tasks, schedulers, sink, faults.

Everything protocol-shaped is the real code: :func:`neli_orchestrate.decision.decide`,
:func:`~neli_orchestrate.decision.claim_record`, :func:`~neli_orchestrate.decision.check_claim`,
:class:`~neli_orchestrate.ledger.record.LedgerRecord` (encoded and decoded on every write and
replay), :class:`~neli_orchestrate.ledger.replay.ReplayBuilder` and the token rule, all driven
through the :class:`~neli_orchestrate.ledger.store.LedgerStore` seam. What is modelled: the
broker, the network, process scheduling, the NELI member (Fast NELI, exclusive), the
orchestrators and the token-checked sink.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Generator
from typing import Any

from integration.sim.broker import COMMITTED, DATA, UNKNOWN, Broker
from integration.sim.config import SimConfig
from integration.sim.kernel import (
    CALL,
    PARK,
    SLEEP,
    STEP,
    Deployment,
    Kernel,
    Proc,
    Thread,
    Violation,
)
from integration.sim.store import (
    HostCache,
    ReplayCache,
    SimLedgerStore,
    SimLedgerWriter,
    WriteAudit,
)
from neli_orchestrate.decision import (
    Claimant,
    ClaimCheck,
    ClaimStatus,
    Decision,
    DecisionPolicy,
    Outcome,
    check_claim,
    claim_record,
    decide,
    is_terminal,
)
from neli_orchestrate.errors import FencedError, KafkaUnavailableError, UnreadableRecordError
from neli_orchestrate.ledger.record import LedgerError, LedgerRecord, RunState
from neli_orchestrate.ledger.replay import Replay
from neli_orchestrate.liveness import DeploymentLiveness, Liveness

Gen = Generator[Any, Any, Any]
DecideFn = Callable[..., Decision]
CheckClaimFn = Callable[..., ClaimCheck]

GATE_STEPS = ("gate.leading", "gate.begun", "gate.replayed", "gate.decided", "gate.claimed")
EXEC_STEPS = (
    "exec.leading", "exec.begun", "exec.replayed", "exec.verified", "exec.running",
    "exec.work_started", "exec.work_done", "exec.finished",
)
#: The Dagster-like step (Singleton.claim): decide, write RUNNING, work, record, in one task.
STEP_STEPS = (
    "step.leading", "step.begun", "step.replayed", "step.verified", "step.running",
    "step.work_started", "step.work_done", "step.finished",
)
#: Steps right before a ledger write, where a crash may leave the transaction open.
WRITE_STEPS = ("gate.decided", "exec.verified", "exec.work_done", "step.verified",
               "step.work_done")
#: Orchestrator retries of a mortal deployment's task (Airflow ``retries``, Dagster
#: ``RetryPolicy.max_retries``); the immortal deployment's tries never run out.
MORTAL_RETRIES = (0, 3)
UNBOUNDED = 1 << 30
#: The deployment that runs a newer neli-orchestrate (ledger schema v2) in some schedules.
NEWER = "newer"
#: Results of a task try that end the DAG run (or the Dagster run) successfully.
_FINISHED = ("completed", "skipped", "gave_up")


class Member:
    """A NELI member (Fast NELI, exclusive mode) with the core's leadership rule.

    Leader at time t iff alive, assigned (as far as it knows) and
    ``t < min(H, M) + heartbeat_timeout``, where H is the send time of the newest own heartbeat
    read back and M the send time of the newest group request that proved membership (the
    core uses offset commits; here the session heartbeat's acknowledgement), and no revoke
    barrier is past its deadline (docs/internals/protocol.md, "Leadership rule"). Times are the
    member's own monotonic clock.
    """

    def __init__(self, sim: Simulation, proc: Proc, role: str) -> None:
        self.sim = sim
        self.proc = proc
        self.role = role
        self.name = proc.name
        self.active = True
        self.assigned = False
        self.last_hb: int | None = None
        self.last_ack_sent = -1
        self.last_response_sent = -1
        self.barrier_since: int | None = None
        #: True while in-flight work must finish before a revoke is acknowledged.
        self.busy = False
        self.lead_since: int | None = None
        self.released_at: int | None = None
        self.belief_until: int | None = None
        #: Led at the last input (the core's announced state): only a leader rides through.
        self.announced = False
        #: The task thread parked in acquire(), woken when this member starts leading.
        self.waiter: Thread | None = None
        #: The task thread parked in its watchdog, woken when leadership is lost.
        self.watcher: Thread | None = None

    def leader(self, t: int) -> bool:
        if not self.proc.alive or not self.assigned or self.last_hb is None:
            return False
        cfg = self.sim.config
        if t >= self._lease_end():
            return False
        return not (
            self.barrier_since is not None and t > self.barrier_since + cfg.barrier_deadline
        )

    def _lease_end(self) -> int:
        assert self.last_hb is not None
        cfg = self.sim.config
        mutation = cfg.mutation
        if mutation == "no_self_fence":  # goNELI-like flag: leads while it thinks it is assigned
            return 1 << 62
        if mutation == "no_membership_proof":  # own heartbeats alone renew the lease
            return self.last_hb + cfg.heartbeat_timeout
        end = min(self.last_hb, self.last_ack_sent) + cfg.heartbeat_timeout
        if self.announced and cfg.ride_through > cfg.heartbeat_timeout:
            # Ride-through (protocol.md, 8a): a leader keeps leading through a stall until its
            # newest acknowledged session heartbeat + ride_through; the broker renewed the
            # session when it received that heartbeat, so no one can be assigned before.
            if mutation == "unbounded_ride_through":
                return 1 << 62
            end = max(end, min(self.last_hb, self.last_ack_sent) + cfg.ride_through)
        return end

    def belief_end(self) -> int | None:
        """When the most recent leadership belief ended (or will end if nothing renews it)."""
        if self.belief_until is None:
            return None
        if self.proc.died_at >= 0:
            return min(self.belief_until, self.proc.died_at)
        return self.belief_until

    def _note(self) -> None:
        """Track where the current belief ends (for the handover-gap statistic)."""
        now = self.sim.kernel.now
        self.announced = self.leader(now)
        if self.announced:
            end = self._lease_end()
            if self.sim.config.mutation == "no_self_fence":
                end = now
            if self.barrier_since is not None:
                end = min(end, self.barrier_since + self.sim.config.barrier_deadline)
            self.belief_until = max(end, now)
        elif self.belief_until is not None and self.belief_until > now:
            self.belief_until = now

    # -- the member's background loop (librdkafka's heartbeat thread plus NELI pulses) ----

    def start(self) -> None:
        self.sim.kernel.start(self.proc, self._loop(), "member")

    def _loop(self) -> Gen:
        cfg = self.sim.config
        broker = self.sim.broker
        while self.active:
            try:
                yield (CALL, broker.join, (self.role, self.name))
                break
            except KafkaUnavailableError:
                yield (SLEEP, cfg.session_interval)
        while self.active:
            self._tick()
            yield (SLEEP, cfg.session_interval)

    def _tick(self) -> None:
        """Every interval: a session heartbeat, and while assigned a NELI heartbeat; both go out
        whatever happened to earlier ones, each as its own request."""
        kernel = self.sim.kernel
        now = kernel.now
        kernel.send(self.proc, self.sim.broker.heartbeat, (self.role, self.name),
                    self._on_session, now)
        if self.assigned:
            kernel.send(self.proc, self.sim.broker.neli_heartbeat, (self.role, self.name),
                        self._on_neli, now)
        self._check_barrier()
        if self.watcher is not None and not self.leader(now):
            kernel.wake(self.watcher)  # LeaderFenced reaches the watchdog

    def _on_session(self, answer: Any, exc: BaseException | None, sent: int) -> None:
        if exc is not None or not self.active or sent < self.last_response_sent:
            return  # failed, or an older answer overtaken by a newer one
        self.last_response_sent = sent
        kernel = self.sim.kernel
        now = kernel.now
        before = self.leader(now)
        self.announced = before   # a lapse is noted before new evidence (core: evaluate first)
        if answer == UNKNOWN:
            if self.assigned:
                self._release("lost (session expired)")
            kernel.send(self.proc, self.sim.broker.join, (self.role, self.name), _ignore)
            return
        assigned, revoke = answer
        if assigned:
            if not self.assigned:
                self.assigned = True
                self.last_hb = None
                self.barrier_since = None
                kernel.log(self.name, "assigned", self.role)
                # Pulse at once on assignment rather than at the next tick.
                kernel.send(self.proc, self.sim.broker.neli_heartbeat, (self.role, self.name),
                            self._on_neli, now)
            # Accepted while assigned: proof of membership at or after ``sent`` (a rebalance
            # in progress proves it too, as REBALANCE_IN_PROGRESS does for the core).
            self.last_ack_sent = sent
            if revoke and self.barrier_since is None:
                if before and self.busy:
                    # Routine revoke while leading with work in flight: the barrier waits.
                    self.barrier_since = now
                    kernel.log(self.name, "revoke requested", "barrier starts")
                else:
                    # Nothing in flight, or not leading (e.g. lapsed during a pause): a member
                    # asked to give the role up never takes it back; hand over now.
                    self._release("revoked")
                    kernel.send(self.proc, self.sim.broker.revoke_done, (self.role, self.name),
                                _ignore)
        elif self.assigned:
            self._release("lost (partition moved)")
        if not before and self.leader(now):
            self.sim.on_leader(self)
        elif before and not self.leader(now) and self.watcher is not None:
            kernel.wake(self.watcher)
        self._note()

    def _check_barrier(self) -> None:
        if self.barrier_since is None or not self.assigned:
            return
        now = self.sim.kernel.now
        if self.busy and now <= self.barrier_since + self.sim.config.barrier_deadline:
            return
        # Barrier done (nothing in flight) or past its deadline (fenced first): hand over.
        self._release("revoked" if not self.busy else "revoke barrier deadline: fenced")
        self.sim.kernel.send(self.proc, self.sim.broker.revoke_done, (self.role, self.name),
                             _ignore)

    def _on_neli(self, ok: Any, exc: BaseException | None, sent: int) -> None:
        if exc is not None or not self.active or not self.assigned:
            return
        now = self.sim.kernel.now
        before = self.leader(now)
        self.announced = before
        if self.last_hb is None or sent > self.last_hb:
            self.last_hb = sent
        if not before and self.leader(now):
            self.sim.on_leader(self)
        self._note()

    def _release(self, why: str) -> None:
        if self.assigned:
            self.sim.kernel.log(self.name, "released", why)
        self.assigned = False
        self.announced = False
        self.barrier_since = None
        self.released_at = self.sim.kernel.now
        self._note()

    # -- used by tasks --------------------------------------------------------------------

    def acquire(self, timeout: int) -> Gen:
        """Wait (parked) until this member leads, up to ``timeout``; returns whether it does."""
        kernel = self.sim.kernel
        deadline = kernel.now + timeout
        main = self.proc.main
        assert main is not None
        if not self.leader(kernel.now):
            self.waiter = main
            kernel.wake_at(deadline, main)
            while not self.leader(kernel.now):
                if kernel.now >= deadline:
                    self.waiter = None
                    return False
                yield (PARK,)
            self.waiter = None
        return True

    def leave(self) -> Gen:
        self._release("leave")
        self.active = False
        self.watcher = None
        try:
            yield (CALL, self.sim.broker.leave, (self.role, self.name))
        except KafkaUnavailableError:
            return  # the session expires instead
        self.sim.release_hint(self)

    def on_hint(self, sender: str) -> None:
        """A release hint (docs/internals/protocol.md, section 5): ask the coordinator now.

        A nudge only.
        """
        if not self.active or not self.proc.alive or self.proc.paused:
            return
        kernel = self.sim.kernel
        now = kernel.now
        if self.sim.config.mutation == "hint_grants":
            before = self.leader(now)
            self.assigned, self.last_hb, self.last_ack_sent = True, now, now
            if not before and self.leader(now):
                self.sim.on_leader(self)
            self._note()
            return
        kernel.send(self.proc, self.sim.broker.heartbeat, (self.role, self.name),
                    self._on_session, now)


def _ignore(result: Any, exc: BaseException | None, *extra: Any) -> None:
    pass


class Work:
    """The singleton job (spark-submit): a child process of the executor."""

    __slots__ = (
        "wid", "role", "run_key", "token", "proc", "fails", "killed", "done", "failed",
        "finish_at",
    )

    def __init__(
        self, wid: int, role: str, run_key: str, token: int, proc: Proc, fails: bool
    ) -> None:
        self.wid = wid
        self.role = role
        self.run_key = run_key
        self.token = token
        self.proc = proc
        self.fails = fails
        self.killed = False
        self.done = False
        self.failed = False
        self.finish_at = 0


@dataclasses.dataclass
class StepFault:
    deployment: str
    label: str
    occurrence: int
    action: tuple[Any, ...]
    fired: bool = False


@dataclasses.dataclass
class Stats:
    """What happened in one schedule (summed over seeds by the runner)."""

    fault_free: int = 0
    events: int = 0
    end_time: int = 0
    works: int = 0
    claims: int = 0
    completed: int = 0
    terminal_failed: int = 0
    fenced_writes: int = 0
    stale_sink_commits: int = 0
    leader_gains: int = 0
    faults: int = 0
    #: Executor tries (with the gate's token) that met their own deployment's later claim.
    own_later_tries: int = 0
    #: Tries failed by a fence; of them, fenced between the RUNNING write and the work.
    fenced_tries: int = 0
    fenced_before_start: int = 0
    #: Failed DAG runs an operator cleared (re-ran from the gate / re-executed).
    manual_clears: int = 0
    #: Tries that refused to decide because the run key's newest record was unreadable.
    unreadable_refused: int = 0
    #: Replays that continued a host's checkpoint (read only the log above it).
    checkpoint_replays: int = 0
    #: Ledger records removed by compaction (superseded by a later record of their key).
    compacted: int = 0
    min_handover_gap: int | None = None
    #: Faults that fired, by kind (``crash@gate.begun``, ``cut``, ``outage``, ...).
    fired: dict[str, int] = dataclasses.field(default_factory=dict)

    def count(self, what: str) -> None:
        self.faults += 1
        self.fired[what] = self.fired.get(what, 0) + 1

    def note(self, what: str) -> None:
        """Count an event that is not a fault (shown with the faults, by kind)."""
        self.fired[what] = self.fired.get(what, 0) + 1


class Simulation:
    """One seeded schedule: build, run, check. Raises :class:`Violation` on the first failure."""

    def __init__(
        self,
        seed: int,
        config: SimConfig | None = None,
        *,
        decide_fn: DecideFn | None = None,
        check_claim_fn: CheckClaimFn | None = None,
    ) -> None:
        self.seed = seed
        self.config = cfg = config or SimConfig()
        self.kernel = kernel = Kernel(
            seed,
            min_delay=cfg.min_delay,
            max_delay=cfg.max_delay,
            request_timeout=cfg.request_timeout,
            trace=cfg.trace,
        )
        rng = kernel.rng
        self.decide: DecideFn = decide_fn or _mutated_decide(cfg.mutation)
        self.check_claim: CheckClaimFn = check_claim_fn or check_claim
        self.partitions = rng.choice(cfg.ledger_partitions)
        self.broker = Broker(
            kernel,
            partitions=self.partitions,
            session_timeout=cfg.session_timeout,
            rebalance_timeout=cfg.rebalance_timeout,
            transaction_timeout=cfg.transaction_timeout,
        )
        #: The checker's view of the ledger (every committed message, folded once).
        self.cache = ReplayCache(self.broker)
        #: What each deployment's processes replay through: its host's checkpoints.
        self.host_caches: dict[str, HostCache] = {}
        self.audit = WriteAudit()
        self.audit.on_begin = self._on_begin
        self.fault_free = rng.random() < cfg.fault_free_fraction
        # Faulty schedules sometimes use a handoff window shorter than a pause, so live claims
        # get taken over and executors meet superseded claims.
        handoff = cfg.handoff_timeout
        if not self.fault_free:
            handoff = rng.choice((cfg.handoff_timeout, cfg.handoff_timeout // 4))
        self.policy = DecisionPolicy(
            handoff_timeout=handoff / 1000,
            max_attempts=cfg.max_attempts,
            max_clock_error=2 * cfg.clock_error / 1000,
        )
        n_deployments = rng.randint(*cfg.deployments)
        immortal = rng.randrange(n_deployments)
        self.deployments = [
            Deployment(
                f"d{i}", i, rng.randint(-cfg.clock_error, cfg.clock_error), i == immortal
            )
            for i in range(n_deployments)
        ]
        self.immortal = self.deployments[immortal]
        #: Deployments whose orchestrator is Dagster-like (the others are Airflow-like).
        self.dagster = {d.name for d in self.deployments if rng.random() < 0.4}
        self.roles = [f"role{r}" for r in range(rng.randint(*cfg.roles))]
        self.run_keys = [
            (role, f"2013-01-0{k + 1}")
            for role in self.roles
            for k in range(rng.randint(*cfg.run_keys_per_role))
        ]
        self.work_fail_prob = 0.0 if self.fault_free else rng.choice((0.0, 0.2, 0.5))
        self.orphan_prob = 0.5
        self.members: dict[str, list[Member]] = {role: [] for role in self.roles}
        self.past_belief_end: dict[str, int] = {}
        self.done: dict[tuple[str, str, str], bool] = {}
        self.procs: list[Proc] = []
        self.step_faults: list[StepFault] = []
        self.stats = Stats(fault_free=int(self.fault_free))
        self.works: dict[int, Work] = {}
        self.work_of_proc: dict[int, Work] = {}
        self.work_starts: dict[tuple[str, str], int] = {}
        #: Deployments that claimed each run key, with how often.
        self.claimers: dict[tuple[str, str], dict[str, int]] = {}
        self.sink: dict[tuple[str, str], tuple[int, int]] = {}
        #: The sink's high-water mark: highest token staged (registered) or published.
        self.sink_hwm: dict[tuple[str, str], int] = {}
        #: Highest token whose work started, per run key (ground truth for the checks).
        self.max_started_token: dict[tuple[str, str], int] = {}
        #: DAG runs whose tries ran out (and were not cleared since).
        self.exhausted: dict[tuple[str, str, str], bool] = {}
        #: Airflow runs of which a try ended on WAIT (only under the wait_fails_try mutation).
        self.tries_lost_to_wait: dict[tuple[str, str, str], bool] = {}
        #: Executor processes running their DAG run's last try.
        self.last_try: dict[int, bool] = {}
        self.completed: dict[tuple[str, str], int] = {}
        self.max_claim_token: dict[str, int] = {}
        self.key_claim_token: dict[tuple[str, str], int] = {}
        self.begin_seq: dict[str, int] = {}
        self.step_counts: dict[tuple[str, str], int] = {}
        #: Run keys a newer-version deployment completed: the truth behind their unreadable
        #: newest record (the checker knows it; the members cannot read it).
        self.newer_completed: dict[tuple[str, str], LedgerRecord] = {}
        self.newer_values: set[bytes] = set()
        #: DAG runs failed by an unreadable newest record (a permanent error).
        self.unreadable_runs: set[tuple[str, str, str]] = set()
        #: Deployment liveness: when each announcing deployment's heartbeat last reached the
        #: broker (the coordinator's view), and windows in which its heartbeats are withheld
        #: (lost or delayed) while the deployment itself runs on: a false GONE verdict.
        self.liveness_seen: dict[str, int] = {}
        self.liveness_muted: dict[str, list[tuple[int, int]]] = {}
        self.announcing: set[str] = set()
        self.broker.on_commit = self._on_commit
        kernel.on_step = self._on_step
        self._plan_faults()
        self._plan_liveness()
        self._plan_leader_changes()

    # -- clocks and helpers ---------------------------------------------------------------

    def wall(self, proc: Proc) -> float:
        """The wall clock of the process's host, epoch seconds (bounded error per deployment)."""
        return (1_700_000_000_000 + self.kernel.now + proc.deployment.clock_offset) / 1000

    def log(self, who: str, event: str, detail: str = "") -> None:
        self.kernel.log(who, event, detail)

    def fail(self, invariant: str, message: str) -> None:
        self.log("checker", f"VIOLATION {invariant}", message)
        raise Violation(invariant, message)

    # -- faults ---------------------------------------------------------------------------

    def _plan_faults(self) -> None:
        rng = self.kernel.rng
        cfg = self.config
        kernel = self.kernel
        clocks = ", ".join(
            f"{d.name} {'dagster' if d.name in self.dagster else 'airflow'}"
            f" {d.clock_offset:+d} ms" for d in self.deployments)
        self.log("plan", "deployments", f"{clocks}; immortal {self.immortal.name}")
        self.log(
            "plan", "runs",
            f"{', '.join(f'{r}/{k}' for r, k in self.run_keys)}; {self.partitions} ledger"
            f" partition(s); handoff {self.policy.handoff_timeout} s; work fails with p="
            f"{self.work_fail_prob}",
        )
        if self.fault_free:
            self.log("plan", "fault-free schedule")
            return
        horizon = cfg.fault_horizon
        for dep in self.deployments:
            if dep.immortal:
                continue
            for _ in range(rng.choice((0, 1, 1, 2))):
                label = rng.choice(GATE_STEPS + EXEC_STEPS + STEP_STEPS)
                roll = rng.random()
                if label in WRITE_STEPS and roll < 0.25:
                    action: tuple[Any, ...] = ("midway",)
                elif roll < 0.6:
                    action = ("crash",)
                else:
                    action = ("pause", rng.randint(100, 3 * cfg.session_timeout))
                fault = StepFault(dep.name, label, rng.randint(1, 2), action)
                self.step_faults.append(fault)
                self.log("plan", "step fault", f"{dep.name} {label} #{fault.occurrence} {action}")
            # Cuts of one deployment are spaced by more than a session timeout: a deployment
            # reaches the whole cluster or none of it (the stated network assumption).
            t = 0
            for _ in range(rng.choice((0, 0, 1, 2))):
                t += rng.randint(cfg.session_timeout + 1, horizon // 2)
                duration = rng.randint(100, 3 * cfg.session_timeout)
                kernel.at(t, self._cut, dep, duration)
                t += duration
            for _ in range(rng.choice((0, 1, 2))):
                kernel.at(
                    rng.randint(0, horizon), self._pause_some, dep,
                    rng.randint(100, 3 * cfg.session_timeout),
                )
            if rng.random() < 0.1:
                down_for = rng.choice((None, rng.randint(1000, 4 * cfg.session_timeout)))
                kernel.at(rng.randint(0, horizon), self._outage, dep, down_for)
        for role in self.roles:
            for _ in range(rng.choice((0, 0, 1, 2))):
                kernel.at(rng.randint(0, horizon), self._force_rebalance, role)
        # Its own stream, so the other faults of every seed stay as they were.
        newer = random.Random(f"newer-{self.seed}")
        if newer.random() < cfg.newer_writer_fraction:
            role, run_key = newer.choice(self.run_keys)
            at = newer.randint(0, cfg.session_interval)
            kernel.at(at, self._newer_completes, role, run_key)
            self.log("plan", "newer deployment", f"completes {role}/{run_key} at {at} ms"
                     " (schema v2)")
        # A broker's crash as the survivors see it (issue 31); its own stream as well.
        stall = random.Random(f"stall-{self.seed}")
        if stall.random() < cfg.broker_stall_fraction:
            at, duration = stall.randint(0, horizon), stall.randint(*cfg.broker_stall)
            kernel.at(at, self._broker_stall, duration)
            self.log("plan", "broker stall", f"{duration} ms at {at} ms")

    def _plan_liveness(self) -> None:
        """Who announces liveness, and liveness losses: heartbeats withheld for a while from
        a deployment that keeps running (its own random stream: the other faults of every
        seed stay as they were)."""
        rng = random.Random(f"liveness-{self.seed}")
        cfg = self.config
        for dep in self.deployments:
            if rng.random() < cfg.liveness_fraction:
                self.announcing.add(dep.name)
            windows = []
            if not self.fault_free and rng.random() < 0.35:
                t = 0
                for _ in range(rng.choice((1, 1, 2))):
                    t += rng.randint(0, cfg.fault_horizon // 2)
                    length = rng.randint(cfg.liveness_interval, 4 * cfg.liveness_timeout)
                    windows.append((t, t + length))
                    t += length
            self.liveness_muted[dep.name] = windows
        self.log("plan", "liveness", "; ".join(
            f"{d.name} {'announces' if d.name in self.announcing else 'silent (older)'}"
            + "".join(f" lost {a}-{b} ms" for a, b in self.liveness_muted[d.name])
            for d in self.deployments))

    def _plan_leader_changes(self) -> None:
        """Leader changes of ledger partitions (a broker crash): for 50-1500 ms the partition's
        end offset is asked for and -1001 comes back (issue 31). Its own random stream: the
        other faults of every seed stay as they were."""
        if self.fault_free:
            return
        rng = random.Random(f"leader-{self.seed}")
        for partition in range(self.partitions):
            if rng.random() < 0.4:
                t = 0
                for _ in range(rng.choice((1, 1, 2, 3))):
                    t += rng.randint(0, self.config.fault_horizon // 2)
                    length = rng.randint(50, 1500)
                    self.broker.leader_changes.append((partition, t, t + length))
                    t += length
        if self.broker.leader_changes:
            self.log("plan", "ledger leader changes", "; ".join(
                f"partition {p} {a}-{b} ms" for p, a, b in self.broker.leader_changes))

    def _announce(self, proc: Proc, dep: Deployment) -> Gen:
        """The scheduler's liveness announcer (the Airflow listener's child, the Dagster
        daemon's sidecar): a heartbeat every interval while the scheduler runs and reaches
        Kafka; withheld during a liveness loss."""
        cfg = self.config
        while True:
            now = self.kernel.now
            if any(a <= now < b for a, b in self.liveness_muted[dep.name]):
                self.stats.note("liveness heartbeat withheld")
            else:
                self.kernel.send(proc, self._liveness_beat, (dep.name,), _ignore)
            yield (SLEEP, cfg.liveness_interval)

    def _liveness_beat(self, deployment: str) -> None:
        """At the broker: the coordinator renews the liveness member's session."""
        self.liveness_seen[deployment] = self.kernel.now

    def _read_liveness(self, deployment: str) -> DeploymentLiveness:
        """At the broker: ``LivenessReader.read`` (describe the liveness group)."""
        seen = self.liveness_seen.get(deployment)
        if seen is None:
            return DeploymentLiveness(deployment, Liveness.UNKNOWN)
        if self.kernel.now - seen > self.config.liveness_timeout:
            self.stats.note("liveness GONE verdict")
            dep = next((d for d in self.deployments if d.name == deployment), None)
            if dep is not None and not dep.down:
                self.stats.note("liveness GONE verdict, deployment up (false)")
            return DeploymentLiveness(deployment, Liveness.GONE,
                                      timeout=self.config.liveness_timeout / 1000)
        return DeploymentLiveness(deployment, Liveness.ALIVE, members=1)

    def _liveness_for(self, proc: Proc, latest: LedgerRecord | None, me: Claimant) -> Gen:
        """As ``Singleton._liveness_of``: read only for another deployment's CLAIMED/FAILED
        record; no answer (cut off) means no information."""
        if (latest is None or latest.deployment == me.deployment
                or latest.state not in (RunState.CLAIMED, RunState.FAILED)):
            return None
        try:
            verdict = yield (CALL, self._read_liveness, (latest.deployment,))
        except KafkaUnavailableError:
            return None
        self.log(proc.name, "liveness", verdict.describe())
        return verdict

    def _decide(self, latest: LedgerRecord | None, me: Claimant, now: float,
                verdict: DeploymentLiveness | None) -> Decision:
        if verdict is None:
            return self.decide(latest, me, now=now, policy=self.policy)
        decision = self.decide(latest, me, now=now, policy=self.policy, liveness=verdict)
        if verdict.gone and decision.outcome is Outcome.TAKE_OVER:
            self.stats.note("liveness take-over")
        return decision

    def _newer_completes(self, role: str, run_key: str) -> None:
        """A deployment running a newer neli-orchestrate leads ``role`` (nobody else does),
        finds no record of ``run_key``, runs it once and records COMPLETED in schema v2.

        Through the same seam: ``begin`` fences earlier writers, the replay is taken after the
        fence, the token is ``next_token``. Claim, work and COMPLETED are one instant here.
        """
        kernel = self.kernel
        if any(m.leader(kernel.now) for m in self.members[role]):
            self.log(NEWER, "does not lead", f"{role}: writes nothing")
            return
        dep = Deployment(NEWER, len(self.deployments), 0, False)
        proc = kernel.spawn(NEWER, dep, "newer")
        store = SimLedgerStore(self.broker, self._host_cache(dep.name), self.audit, proc,
                               partitions=self.partitions)
        writer = store.begin(role)
        try:
            replay = writer.replay()
        except KafkaUnavailableError as exc:
            self.log(proc.name, "unavailable", str(exc))
            return
        if run_key in replay.records or run_key in replay.unreadable_at:
            self.log(proc.name, "run key taken", f"{role}/{run_key}: writes nothing")
            return
        truth = LedgerRecord(role, run_key, RunState.COMPLETED, replay.next_token, NEWER,
                             proc.name, 1, self.wall(proc))
        value = json.loads(truth.encode())
        value["v"] = 2
        raw = json.dumps(value).encode()
        self.newer_values.add(raw)
        writer.write_encoded(truth, raw)  # not fenced: begun at this instant
        # What that deployment did, in the checker's books: one execution, published, done.
        key = (role, run_key)
        self.stats.count("newer-version COMPLETED")
        self.newer_completed[key] = truth
        self.work_starts[key] = self.work_starts.get(key, 0) + 1
        claimers = self.claimers.setdefault(key, {})
        claimers[NEWER] = claimers.get(NEWER, 0) + 1
        self.max_claim_token[role] = max(self.max_claim_token.get(role, -1), truth.token)
        self.key_claim_token[key] = truth.token
        self.max_started_token[key] = max(self.max_started_token.get(key, -1), truth.token)
        self.sink[key] = (truth.token, 0)
        self.sink_hwm[key] = max(self.sink_hwm.get(key, -1), truth.token)
        self.completed[key] = truth.token
        self.stats.completed += 1
        self.log(proc.name, "wrote COMPLETED v2", f"{role}/{run_key} t{truth.token}")

    def _on_step(self, proc: Proc, label: str) -> tuple[Any, ...] | None:
        for fault in self.step_faults:
            if (
                not fault.fired
                and fault.deployment == proc.deployment.name
                and fault.label == label
            ):
                count = self._step_count(proc.deployment.name, label)
                if count == fault.occurrence:
                    fault.fired = True
                    self.stats.count(f"{fault.action[0]}@{label}")
                    self.log(proc.name, f"fault at {label}", str(fault.action))
                    return fault.action
        return None

    def _step_count(self, deployment: str, label: str) -> int:
        key = (deployment, label)
        count = self.step_counts.get(key, 0) + 1
        self.step_counts[key] = count
        return count

    def _cut(self, dep: Deployment, duration: int) -> None:
        self.stats.count("network cut")
        dep.cut_until = self.kernel.now + duration
        self.log(dep.name, "network cut", f"for {duration} ms")

    def _pause_some(self, dep: Deployment, duration: int) -> None:
        live = [p for p in self.procs if p.alive and p.deployment is dep and not p.paused]
        if live:
            self.stats.count("random pause")
            self.kernel.pause(live[self.kernel.rng.randrange(len(live))], duration)

    def _outage(self, dep: Deployment, down_for: int | None) -> None:
        if dep.down:
            return
        self.stats.count("outage" if down_for is not None else "permanent outage")
        dep.down = True
        self.log(dep.name, "OUTAGE", "for ever" if down_for is None else f"for {down_for} ms")
        for proc in self.procs:
            if proc.alive and proc.deployment is dep:
                self.kernel.crash(proc, "deployment outage")
        if down_for is not None:
            self.kernel.after(down_for, self._recover, dep)

    def _recover(self, dep: Deployment) -> None:
        dep.down = False
        self.log(dep.name, "RECOVERED")
        self._start_scheduler(dep)

    def _broker_stall(self, duration: int) -> None:
        self.stats.count("broker-stall")
        self.broker.stall(duration)

    def _force_rebalance(self, role: str) -> None:
        if self.broker.force_rebalance(role):
            self.stats.count("forced rebalance")

    # -- processes ------------------------------------------------------------------------

    def start(self) -> None:
        for dep in self.deployments:
            self._start_scheduler(dep)

    def _start_scheduler(self, dep: Deployment) -> None:
        proc = self.kernel.spawn(f"{dep.name}.scheduler", dep, "scheduler")
        self.procs.append(proc)
        if dep.name in self.announcing:
            self.kernel.start(proc, self._announce(proc, dep), "liveness")
        for role, run_key in self.run_keys:
            if not self.done.get((dep.name, role, run_key)):
                box: list[Thread] = []
                driver = self._dagster if dep.name in self.dagster else self._airflow
                box.append(self.kernel.start(proc, driver(dep, role, run_key, box), "dag"))

    def _host_cache(self, host: str) -> HostCache:
        cache = self.host_caches.get(host)
        if cache is None:
            cache = self.host_caches[host] = HostCache(
                self.broker, self.stats,
                trust_stale=self.config.mutation == "stale_replay_cache",
                take_invalid_end=self.config.mutation == "invalid_end_offset")
        return cache

    def _spawn_task(
        self, dep: Deployment, kind: str, role: str, run_key: str, token: int | None,
        waiter: Thread,
    ) -> Proc:
        proc = self.kernel.spawn(f"{dep.name}.{kind}", dep, kind)
        self.procs.append(proc)
        member = Member(self, proc, role)
        self.members[role].append(member)
        store = SimLedgerStore(
            self.broker, self._host_cache(dep.name), self.audit, proc,
            partitions=self.partitions, fence=self.config.mutation != "no_fencing",
        )
        if kind == "gate":
            body = self._gate(proc, member, store, role, run_key)
        else:
            body = self._runner(proc, member, store, role, run_key, token)

        def on_exit(p: Proc, how: str, value: Any) -> None:
            if how == "crashed":
                self._on_task_crash(p)
            self.kernel.wake(waiter, (how, value))

        proc.on_exit = on_exit
        member.start()
        self.kernel.start(proc, body, "main", main=True)
        return proc

    def _retries(self, dep: Deployment) -> int:
        # Fault-free schedules check the protocol for thrashing (S4), not the retry budget: a
        # task with retries=0 that loses one leadership race just fails its DAG run.
        if dep.immortal or self.fault_free:
            return UNBOUNDED
        return self.kernel.rng.randint(*MORTAL_RETRIES)

    def _finish(self, dep: Deployment, role: str, run_key: str, how: str) -> None:
        self.done[(dep.name, role, run_key)] = True
        self.log(f"{dep.name}.scheduler", "dag run done", f"{role}/{run_key} {how}")

    def _exhausted(self, dep: Deployment, role: str, run_key: str) -> Gen:
        """Tries exhausted: the run failed; sometimes an operator clears (re-runs) it later."""
        key = (dep.name, role, run_key)
        self.exhausted[key] = True
        self.log(f"{dep.name}.scheduler", "dag run failed", f"{role}/{run_key}: tries exhausted")
        rng = self.kernel.rng
        if rng.random() < 0.5:
            return False
        yield (SLEEP, rng.randint(*self.config.clear_delay))
        self.exhausted[key] = False
        self.stats.manual_clears += 1
        self.log(f"{dep.name}.scheduler", "manual clear", f"{role}/{run_key}: re-run")
        return True

    def _unreadable(self, dep: Deployment, role: str, run_key: str) -> None:
        """The run key's newest record cannot be read: a permanent error, so the run fails at
        once (every retry would read the same record) and waits for an upgrade or a fix."""
        self.unreadable_runs.add((dep.name, role, run_key))
        self.log(f"{dep.name}.scheduler", "dag run failed",
                 f"{role}/{run_key}: newest ledger record unreadable (permanent)")

    def _airflow(self, dep: Deployment, role: str, run_key: str, box: list[Thread]) -> Gen:
        """An Airflow-like DAG run: the gate, then the executor task with the gate's token.

        The gate is a sensor: WAIT pokes again after ``wait_poll``, a failed gate try is
        retried. The executor task is retried with the *same* token (Airflow pulls it from
        the gate's XCom on every try) and never goes back to the gate; a fence fails one try.
        When its tries run out the DAG run fails; an operator may clear it, which runs the
        gate again.
        """
        cfg = self.config
        rng = self.kernel.rng
        while True:
            while True:  # the gate
                self._spawn_task(dep, "gate", role, run_key, None, box[0])
                how, result = yield (PARK,)
                if how == "exited" and result[0] == "unreadable":
                    self._unreadable(dep, role, run_key)
                    return
                if how == "exited" and result[0] == "decided":
                    outcome, token = result[1], result[2]
                    if outcome in (Outcome.SKIP_DONE, Outcome.GIVE_UP):
                        self._finish(dep, role, run_key, str(outcome))
                        return
                    if outcome is not Outcome.WAIT:
                        break
                    yield (SLEEP, cfg.wait_poll)
                else:
                    yield (SLEEP, rng.randint(*cfg.retry_delay))
            yield (SLEEP, rng.randint(*cfg.scheduler_delay))
            retries = self._retries(dep)
            tried = 0
            while tried <= retries:
                proc = self._spawn_task(dep, "executor", role, run_key, token, box[0])
                # The try's FAILED record says whether a retry follows (Run.expect_retry).
                self.last_try[proc.pid] = tried == retries
                how, result = yield (PARK,)
                if how == "exited" and result[0] in _FINISHED:
                    self._finish(dep, role, run_key, result[0])
                    return
                if how == "exited" and result[0] == "unreadable":
                    self._unreadable(dep, role, run_key)
                    return
                if how == "exited" and result[0] in ("held", "timeout"):
                    if cfg.mutation != "wait_fails_try":
                        # Another deployment holds the run: the fenced try waits as the gate
                        # does (asks again every poke) and uses no try.
                        yield (SLEEP, cfg.wait_poll)
                        continue
                    self.tries_lost_to_wait[(dep.name, role, run_key)] = True
                tried += 1
                if tried <= retries:
                    yield (SLEEP, rng.randint(*cfg.retry_delay))
            if not (yield from self._exhausted(dep, role, run_key)):
                return

    def _dagster(self, dep: Deployment, role: str, run_key: str, box: list[Thread]) -> Gen:
        """A Dagster-like run: one step holds the claim for its whole body (Singleton.claim).

        While another deployment holds the run (WAIT) the resource waits and claims again
        without using a retry; a failed or fenced step is retried (``RetryPolicy``) until its
        retries run out; then the run failed and may be re-executed by an operator.
        """
        cfg = self.config
        rng = self.kernel.rng
        while True:
            retries = self._retries(dep)
            tried = 0
            while True:
                self._spawn_task(dep, "step", role, run_key, None, box[0])
                how, result = yield (PARK,)
                if how == "exited" and result[0] in _FINISHED:
                    self._finish(dep, role, run_key, result[0])
                    return
                if how == "exited" and result[0] == "unreadable":
                    self._unreadable(dep, role, run_key)
                    return
                if how == "exited" and result[0] in ("held", "timeout"):
                    yield (SLEEP, cfg.wait_poll)  # the resource's bounded wait
                    continue
                tried += 1
                if tried > retries:
                    break
                yield (SLEEP, rng.randint(*cfg.retry_delay))
            if not (yield from self._exhausted(dep, role, run_key)):
                return

    def _gate(self, proc: Proc, member: Member, store: SimLedgerStore, role: str,
              run_key: str) -> Gen:
        """LeaderGateOperator / Singleton.reserve: decide and record CLAIMED."""
        me = Claimant(proc.deployment.name, member.name)
        kernel = self.kernel
        result: tuple[Any, ...] = ("timeout",)
        if (yield from member.acquire(self.config.acquire_timeout)):
            try:
                yield (STEP, "gate.leading")
                writer = yield (CALL, store.begin, (role,))
                yield (STEP, "gate.begun")
                replay = yield (CALL, writer.replay, ())
                yield (STEP, "gate.replayed")
                self._check_leader(member, role)
                latest = self._latest(replay, run_key)
                verdict = yield from self._liveness_for(proc, latest, me)
                now = self.wall(proc)
                decision = self._decide(latest, me, now, verdict)
                self.log(proc.name, f"decide {decision.outcome}", f"{run_key}: {decision.reason}")
                token = None
                if decision.writes:
                    record = self._claim(decision, replay, run_key, me, now, RunState.CLAIMED,
                                         gone=verdict is not None and verdict.gone)
                    yield (STEP, "gate.decided")
                    self._check_leader(member, role)
                    yield (CALL, self._write, (writer, record, "claim"))
                    token = record.token
                    yield (STEP, "gate.claimed")
                result = ("decided", decision.outcome, token)
            except FencedError as exc:
                result = ("fenced",)
                self.log(proc.name, "fenced", str(exc))
            except UnreadableRecordError as exc:
                result = ("unreadable", exc.offset)
                self.stats.unreadable_refused += 1
                self.log(proc.name, "unreadable", str(exc))
            except KafkaUnavailableError as exc:
                result = ("unavailable",)
                self.log(proc.name, "unavailable", str(exc))
        else:
            self.log(proc.name, "acquire timeout", role)
        yield from member.leave()
        kernel.log(proc.name, "exit", str(result))
        return result

    def _claim(self, decision: Decision, replay: Replay, run_key: str, me: Claimant,
               now: float, state: RunState, *, gone: bool = False) -> LedgerRecord:
        try:
            record = claim_record(
                decision, replay, run_key=run_key, me=me, now=now, policy=self.policy, state=state
            )
        except LedgerError as exc:
            # The ledger's end is not above a token issued before: tokens would go back (S5).
            self.fail("S5", f"token rule refused a claim: {exc}")
            raise
        if self.config.mutation == "token_reuse" and decision.latest is not None:
            record = dataclasses.replace(record, token=decision.latest.token)
        if (self.config.mutation == "liveness_takeover_no_token" and gone
                and decision.outcome is Outcome.TAKE_OVER and decision.latest is not None):
            record = dataclasses.replace(record, token=decision.latest.token)
        return record

    def _latest(self, replay: Replay, run_key: str) -> LedgerRecord | None:
        """The record to decide from: ``Replay.latest`` refuses an unreadable newest record."""
        if self.config.mutation == "unread_unreadable":
            return replay.records.get(run_key)  # the defect: the older record, or none
        return replay.latest(run_key)

    def _check_leader(self, member: Member, role: str) -> None:
        """``run.check()``: raise FencedError once this member no longer leads."""
        if not member.leader(self.kernel.now):
            raise FencedError(f"{member.name} no longer leads {role}", role=role)

    def _runner(self, proc: Proc, member: Member, store: SimLedgerStore, role: str,
                run_key: str, token: int | None) -> Gen:
        """One try of the work: ``Singleton.execute`` with the gate's ``token`` (Airflow's
        executor) or, with ``token`` None, ``Singleton.claim`` (a Dagster step): verify or
        decide, RUNNING, check leadership again, work under the watchdog, finish."""
        me = Claimant(proc.deployment.name, member.name)
        cfg = self.config
        kernel = self.kernel
        step = "exec" if token is not None else "step"
        result: tuple[Any, ...] = ("timeout",)
        work: Work | None = None
        if (yield from member.acquire(cfg.acquire_timeout)):
            try:
                yield (STEP, f"{step}.leading")
                writer = yield (CALL, store.begin, (role,))
                yield (STEP, f"{step}.begun")
                replay = yield (CALL, writer.replay, ())
                yield (STEP, f"{step}.replayed")
                latest = self._latest(replay, run_key)
                now = self.wall(proc)
                running: LedgerRecord | None = None
                kind = "advance"
                decision: Decision | None = None
                verdict: DeploymentLiveness | None = None
                if token is None:
                    verdict = yield from self._liveness_for(proc, latest, me)
                    now = self.wall(proc)
                    decision = self._decide(latest, me, now, verdict)
                else:
                    check = self.check_claim(token, latest, me)
                    if cfg.mutation == "no_claim_check":
                        check = ClaimCheck(ClaimStatus.OURS, "mutation: not checked", latest)
                    if (cfg.mutation == "superseded_by_own_claim"
                            and check.status is ClaimStatus.OWN_LATER):
                        check = ClaimCheck(ClaimStatus.FOREIGN, "mutation: superseded by our"
                                           " own later claim", latest)
                    self.log(proc.name, f"check claim {check.status}", f"{run_key}: {check.reason}")
                    if check.status is ClaimStatus.OWN_LATER:
                        self.stats.own_later_tries += 1
                    if check.status is ClaimStatus.COMPLETED:
                        result = ("skipped",)
                    elif check.ok:
                        if latest is not None and latest.token == token and (
                            latest.state is RunState.CLAIMED
                        ):
                            running = latest.advance(RunState.RUNNING, at=now, member=me.member)
                        else:  # only reachable under the no_claim_check mutation
                            running = LedgerRecord(
                                role, run_key, RunState.RUNNING, token, me.deployment, me.member,
                                1, now,
                            )
                    elif check.decide_again:
                        # As Singleton.execute: the run key moved on since the gate's token
                        # (a retry, a fence, a take-over); decide again, as a gate would.
                        verdict = yield from self._liveness_for(proc, latest, me)
                        now = self.wall(proc)
                        decision = self._decide(latest, me, now, verdict)
                    else:
                        result = ("refused", check.status)
                if decision is not None:
                    self.log(proc.name, f"decide {decision.outcome}", f"{run_key}:"
                             f" {decision.reason}")
                    if decision.claims:
                        running = self._claim(decision, replay, run_key, me, now, RunState.RUNNING,
                                              gone=verdict is not None and verdict.gone)
                        kind = "claim"
                    elif decision.outcome is Outcome.SKIP_DONE:
                        result = ("skipped",)
                    elif decision.outcome is Outcome.WAIT:
                        result = ("held",)  # another deployment's live claim: fail this try
                    else:
                        if decision.record_failure:
                            failure = self._claim(decision, replay, run_key, me, now,
                                                  RunState.RUNNING)
                            yield (STEP, f"{step}.verified")
                            self._check_leader(member, role)
                            yield (CALL, self._write, (writer, failure, "claim"))
                        result = ("gave_up",)
                if running is not None:
                    yield (STEP, f"{step}.verified")
                    self._check_leader(member, role)
                    yield (CALL, self._write, (writer, running, kind))
                    # Between the RUNNING write and the work: a fence landing here must stop
                    # the work from starting (the run is attached, leadership checked again).
                    yield (STEP, f"{step}.running")
                    watched = True
                    if cfg.mutation == "fence_before_start_dropped":
                        # The defect: the fence reached the run before the work did, and was
                        # dropped; the work starts and runs unwatched.
                        watched = member.leader(kernel.now)
                    elif not member.leader(kernel.now):
                        self.stats.fenced_before_start += 1
                        self._check_leader(member, role)
                    work = self._start_work(proc, member, role, run_key, running.token)
                    member.busy = True
                    yield (STEP, f"{step}.work_started")
                    member.watcher = proc.main
                    while not work.done:
                        if watched:
                            self._check_leader(member, role)  # the watchdog
                        yield (PARK,)  # woken by the work's end or by lost leadership
                    member.watcher = None
                    # Still busy: recording the outcome is part of the in-flight work the
                    # revoke barrier waits for.
                    yield (STEP, f"{step}.work_done")
                    now = self.wall(proc)
                    if work.failed:
                        # Run.expect_retry: the last try promises no retry (any deployment
                        # may take over at once); another one its retry delay + handoff.
                        # (Airflow only; a Dagster step says nothing: handoff from now.)
                        window = self.policy.handoff_timeout
                        if token is not None:
                            window += cfg.retry_delay[1] / 1000
                        last = self.last_try.get(proc.pid, False)
                        final = running.advance(
                            RunState.FAILED, at=now, reason="work raised",
                            handoff_deadline=now if last else now + window,
                        )
                    else:
                        final = running.advance(RunState.COMPLETED, at=now)
                    self._check_leader(member, role)
                    yield (CALL, self._write, (writer, final, "advance"))
                    yield (STEP, f"{step}.finished")
                    result = ("failed",) if work.failed else ("completed",)
            except FencedError as exc:
                result = ("fenced",)
                self.stats.fenced_tries += 1
                self.log(proc.name, "fenced", str(exc))
            except UnreadableRecordError as exc:
                result = ("unreadable", exc.offset)
                self.stats.unreadable_refused += 1
                self.log(proc.name, "unreadable", str(exc))
            except KafkaUnavailableError as exc:
                result = ("unavailable",)
                self.log(proc.name, "unavailable", str(exc))
            if work is not None and not work.done and not work.killed:
                work.killed = True  # fence callbacks kill spark-submit
                self.log(proc.name, "killed work", f"token {work.token}")
        else:
            self.log(proc.name, "acquire timeout", role)
        member.busy = False
        yield from member.leave()
        kernel.log(proc.name, "exit", str(result))
        return result

    def _start_work(self, proc: Proc, member: Member, role: str, run_key: str,
                    token: int) -> Work:
        rng = self.kernel.rng
        if not member.leader(self.kernel.now):
            self.fail(
                "S7",
                f"{proc.name} starts the work of {role}/{run_key} with token {token} although"
                f" {member.name} no longer leads {role} (a fence before the start was dropped)",
            )
        key = (role, run_key)
        self.max_started_token[key] = max(self.max_started_token.get(key, -1), token)
        if self.config.mutation != "sink_hwm_on_publish":
            # The job stages first: the sink registers its token before it writes.
            self.sink_hwm[key] = max(self.sink_hwm.get(key, -1), token)
        work = Work(
            len(self.works) + 1, role, run_key, token, proc,
            rng.random() < self.work_fail_prob,
        )
        self.works[work.wid] = work
        self.work_of_proc[proc.pid] = work
        self.work_starts[key] = self.work_starts.get(key, 0) + 1
        self.stats.works += 1
        self.log(proc.name, "work starts", f"{role}/{run_key} token {token} (work {work.wid})")
        work.finish_at = self.kernel.now + rng.randint(*self.config.work_duration)
        self.kernel.at(work.finish_at, self._finish_work, work)
        return work

    def _on_task_crash(self, proc: Proc) -> None:
        work = self.work_of_proc.get(proc.pid)
        if work is None or work.done or work.killed:
            return
        rng = self.kernel.rng
        if rng.random() < self.orphan_prob:
            # An orphaned spark-submit keeps running, and may hang a while before it finishes
            # and tries to publish with its old token.
            work.finish_at += rng.randint(0, 4 * self.config.session_timeout)
            self.kernel.at(work.finish_at, self._finish_work, work)
            self.stats.count("orphaned work")
            self.log(proc.name, "work orphaned", f"work {work.wid} keeps running")
        else:
            work.killed = True

    def _finish_work(self, work: Work) -> None:
        if work.killed or work.done or self.kernel.now != work.finish_at:
            return
        work.done = True
        if work.proc.main is not None:
            self.kernel.wake(work.proc.main)
        if work.fails:
            work.failed = True
            self.log(f"work{work.wid}", "work raised", f"token {work.token}")
            return
        self._sink_commit(work)

    # -- the token-checked sink (neli_orchestrate.spark.commit's rule) --------------------

    def _sink_commit(self, work: Work) -> None:
        key = (work.role, work.run_key)
        current = self.sink.get(key)
        high = max(self.sink_hwm.get(key, -1), -1 if current is None else current[0])
        if work.token < high:
            self.stats.stale_sink_commits += 1
            self.log(
                f"work{work.wid}", "sink refused",
                f"StaleTokenError: token {work.token} < registered {high}",
            )
            work.failed = True
            return
        started = self.max_started_token.get(key, -1)
        if work.token < started:
            self.fail(
                "S3",
                f"{work.role}/{work.run_key} output of token {work.token} published after a"
                f" newer claim's work (token {started}) had started: stale output is visible",
            )
        if current is not None and work.token == current[0]:
            self.log(f"work{work.wid}", "sink no-op", f"token {work.token} already published")
            return
        completed = self.completed.get(key)
        if completed is not None:
            self.fail(
                "S3",
                f"{work.role}/{work.run_key} output replaced by token {work.token} after"
                f" COMPLETED with token {completed}",
            )
        self.sink[key] = (work.token, work.wid)
        self.sink_hwm[key] = max(self.sink_hwm.get(key, -1), work.token)
        self.log(f"work{work.wid}", "sink published", f"{work.role}/{work.run_key} t{work.token}")

    # -- ledger writes and their checks ---------------------------------------------------

    def _on_begin(self, writer: SimLedgerWriter) -> None:
        seq = self.begin_seq.get(writer.tid, 0) + 1
        self.begin_seq[writer.tid] = seq
        writer.begin_seq = seq

    def _write(self, writer: SimLedgerWriter, record: LedgerRecord, kind: str) -> None:
        """Runs at the broker: the seam's write, then S2/S3 checks on what was committed."""
        try:
            writer.write(record)
        except FencedError:
            self.stats.fenced_writes += 1
            self.log(writer.proc.name, "write fenced", f"{record.state} t{record.token}")
            raise
        self.log(
            writer.proc.name, f"wrote {record.state}",
            f"{record.role}/{record.run_key} t{record.token} a{record.attempt}",
        )
        if writer.begin_seq < self.begin_seq.get(writer.tid, 0):
            self.fail(
                "S2",
                f"{writer.proc.name} wrote {record.state} t{record.token} after a newer begin"
                f" (its begin #{writer.begin_seq}, latest #{self.begin_seq[writer.tid]})",
            )
        key = (record.role, record.run_key)
        if kind == "claim":
            self.stats.claims += 1
            claimers = self.claimers.setdefault(key, {})
            claimers[record.deployment] = claimers.get(record.deployment, 0) + 1
            highest = self.max_claim_token.get(record.role, -1)
            if record.token <= highest:
                self.fail(
                    "S5",
                    f"claim token {record.token} of {record.role} not above the previous"
                    f" claim token {highest}",
                )
            self.max_claim_token[record.role] = record.token
            self.key_claim_token[key] = record.token
        elif record.token != self.key_claim_token.get(key):
            self.fail(
                "S3",
                f"{writer.proc.name} recorded {record.state} for {record.role}/{record.run_key}"
                f" under token {record.token}, but the run key's current claim is"
                f" {self.key_claim_token.get(key)}",
            )

    def _on_commit(self, partition: int, entries: list[Any]) -> None:
        for entry in entries:
            if entry.value is None or entry.value in self.newer_values:
                continue  # a newer deployment's record: its books are kept where it writes
            record = LedgerRecord.decode(entry.value, key=entry.key, offset=entry.offset)
            if record is None or record.state is not RunState.COMPLETED:
                continue
            key = (record.role, record.run_key)
            if key in self.completed:
                self.fail(
                    "S3",
                    f"second COMPLETED for {record.role}/{record.run_key}: token"
                    f" {self.completed[key]} then {record.token}",
                )
            self.completed[key] = record.token
            self.stats.completed += 1
            published = self.sink.get(key)
            if published is None or published[0] != record.token:
                self.fail(
                    "S3",
                    f"COMPLETED {record.role}/{record.run_key} with token {record.token} but the"
                    f" sink holds {published}",
                )

    # -- S1 -------------------------------------------------------------------------------

    def release_hint(self, member: Member) -> None:
        """The departing member's hint reaches every other member of the role (produce, then
        the watchers' fetch: two network delays), unless its deployment is cut off."""
        for other in self.members[member.role]:
            if other is not member and other.active:
                when = self.kernel.now + self.kernel.delay() + self.kernel.delay()
                self.kernel.at(when, self._deliver_hint, other, member.name)

    def _deliver_hint(self, member: Member, sender: str) -> None:
        if member.proc.deployment.cut_until <= self.kernel.now:
            member.on_hint(sender)

    def on_leader(self, member: Member) -> None:
        now = self.kernel.now
        self.stats.leader_gains += 1
        member.lead_since = now
        self.log(member.name, "LEADS", member.role)
        if member.waiter is not None:
            self.kernel.wake(member.waiter)
        latest_end = self.past_belief_end.get(member.role)
        keep = []
        for other in self.members[member.role]:
            end = other.belief_end()
            if other is not member:
                if other.leader(now):
                    self.fail(
                        "S1",
                        f"{member.name} and {other.name} both lead {member.role} at {now} ms",
                    )
                if end is not None and (latest_end is None or end > latest_end):
                    latest_end = end
            if (other.active and other.proc.alive) or (end is not None and end >= now):
                keep.append(other)
            elif end is not None:
                # Gone for good: remember only when its last belief ended.
                past = self.past_belief_end.get(member.role)
                self.past_belief_end[member.role] = end if past is None else max(past, end)
        self.members[member.role] = keep
        if latest_end is not None:
            gap = now - latest_end
            if self.stats.min_handover_gap is None or gap < self.stats.min_handover_gap:
                self.stats.min_handover_gap = gap

    # -- run and final checks -------------------------------------------------------------

    def run(self) -> Stats:
        self.start()
        self.kernel.run(self.config.time_limit)
        self.stats.events = self.kernel.events
        self.stats.end_time = self.kernel.now
        self.stats.compacted = self.broker.compacted
        self._final_checks()
        return self.stats

    def _latest_records(self) -> dict[tuple[str, str], LedgerRecord | None]:
        latest: dict[tuple[str, str], LedgerRecord | None] = {}
        for role in self.roles:
            replay = self.cache.replay(role, _partition(self, role), fenced=False)
            for r, run_key in self.run_keys:
                if r != role:
                    continue
                truth = self.newer_completed.get((role, run_key))
                if truth is not None and run_key in replay.unreadable_at:
                    latest[(role, run_key)] = truth  # what the unreadable record stands for
                else:
                    latest[(role, run_key)] = replay.latest(run_key)
        return latest

    def _final_checks(self) -> None:
        for log in self.broker.logs:
            if log.last_stable_offset < log.high_watermark:
                self.fail("L1", "a transaction is still open at the end of the schedule")
        latest = self._latest_records()
        for (role, run_key), record in latest.items():
            if not is_terminal(record, self.policy):
                self.fail(
                    "L1",
                    f"{role}/{run_key} ended as {_state(record)}, not COMPLETED or terminally"
                    f" FAILED, while {self.immortal.name} stayed up with tries left",
                )
            if record is not None and record.state is RunState.FAILED:
                self.stats.terminal_failed += 1
        for dep in self.deployments:
            if dep.down:
                continue
            for role, run_key in self.run_keys:
                run = (dep.name, role, run_key)
                if run in self.unreadable_runs and (role, run_key) in self.newer_completed:
                    continue  # correctly refused: the newer deployment completed it
                if self.exhausted.get(run) and self.tries_lost_to_wait.get(run):
                    self.fail(
                        "L1",
                        f"{dep.name}'s Airflow run of {role}/{run_key} ran out of tries on"
                        " WAIT: a try that finds another deployment's live claim must wait,"
                        " not fail (the run key is left to whoever still has tries)",
                    )
                if not self.done.get(run) and not self.exhausted.get(run):
                    # Its tries never ran out and it can reach Kafka, yet it never finished.
                    self.fail(
                        "L1",
                        f"{dep.name} (tries left, reaches Kafka) never finished its"
                        f" {'Dagster' if dep.name in self.dagster else 'Airflow'} run of"
                        f" {role}/{run_key}; the run key ended {_state(latest[(role, run_key)])}",
                    )
        if self.fault_free:
            # Exactly once, and without thrashing: one deployment claims each run key (it may
            # claim again itself when its executor could not get leadership in time).
            for key in self.run_keys:
                starts = self.work_starts.get(key, 0)
                claimers = self.claimers.get(key, {})
                record = latest[key]
                if starts != 1 or len(claimers) != 1 or record is None or (
                    record.state is not RunState.COMPLETED
                ):
                    self.fail(
                        "S4",
                        f"fault-free schedule: {key[0]}/{key[1]} executed {starts} time(s),"
                        f" claimed by {claimers}, ended {record and record.state}",
                    )
        committed = sum(
            1 for log in self.broker.logs for e in log.entries
            if e.kind == DATA and e.status == COMMITTED
        )
        self.log("checker", "ok", f"{committed} committed ledger records")


def _state(record: LedgerRecord | None) -> str:
    return "no record" if record is None else f"{record.state} t{record.token}"


def _partition(sim: Simulation, role: str) -> int:
    from neli_orchestrate.ledger.record import role_partition

    return role_partition(role, sim.partitions)


def _mutated_decide(mutation: str | None) -> DecideFn:
    if mutation == "ignore_completed":

        def ignore_completed(latest: LedgerRecord | None, me: Claimant, *, now: float,
                             policy: DecisionPolicy, **kw: Any) -> Decision:
            decision = decide(latest, me, now=now, policy=policy, **kw)
            if decision.outcome is Outcome.SKIP_DONE:
                return Decision(Outcome.TAKE_OVER, "mutation: ignore COMPLETED", latest,
                                attempt=decision.attempt + 1)
            return decision

        return ignore_completed
    if mutation == "run_on_wait":

        def run_on_wait(latest: LedgerRecord | None, me: Claimant, *, now: float,
                        policy: DecisionPolicy, **kw: Any) -> Decision:
            decision = decide(latest, me, now=now, policy=policy, **kw)
            if decision.outcome is Outcome.WAIT:
                return Decision(Outcome.TAKE_OVER, "mutation: run on WAIT", latest,
                                attempt=decision.attempt)
            return decision

        return run_on_wait
    return decide
