"""Bounded exhaustive exploration: every interleaving of a small model's steps, up to a depth.

Usage::

    python -m integration.sim.explore --depth 22           # states explored, ok or not
    python -m integration.sim.explore --mutation liveness_takeover_no_token

    from integration.sim.explore import explore, Scope
    result = explore(Scope(depth=22))   # Exploration: states, transitions, violation

Where the seeded simulation (:mod:`integration.sim.model`) samples timed schedules, this
enumerates *every* order of the protocol's steps in a small scope: 2 deployments, 1 role, 2 run
keys, an Airflow-like DAG run per deployment and run key (gate, then executor with the gate's
token, retried), deployment liveness, and up to ``faults`` faults among a task crash, a
deployment pause (every process of it, its liveness announcer too) and a liveness loss (the
announcer's heartbeats lost or delayed while the deployment runs on: a false GONE verdict).
Environment steps are as free as the steps of the tasks: the clock ticks past handoff
deadlines, a lost lease expires, the coordinator expires a silent liveness member, a paused
deployment resumes, its announcer comes back, a work succeeds or raises.

Steps are atomic at the granularity of the real protocol's I/O: acquire leadership, begin the
ledger writer (``init_transactions()``: fences earlier writers), replay+decide+write, start the
work, finish it. The decision code is the real one (:func:`~neli_orchestrate.decision.decide`,
:func:`~neli_orchestrate.decision.check_claim`, :func:`~neli_orchestrate.decision.claim_record`)
on real :class:`~neli_orchestrate.ledger.record.LedgerRecord` values. Leadership is one lease
(NELI's S1, checked by the seeded simulation, is given here); the broker's fencing is the epoch
rule.

States are explored breadth-first with a visited set, so each distinct state is expanded once
(the interleavings that reach it are equivalent from there on). Invariants, checked on every
transition: claim tokens strictly increase (S5); a work starts only under its run key's newest
claim (the late executor never runs); the token-checked sink never publishes a token below one
already started (S3); at most one ``COMPLETED`` per run key, with the published token (S3); no
write from a fenced writer (S2).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

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
)
from neli_orchestrate.ledger.record import LedgerRecord, RunState
from neli_orchestrate.ledger.replay import Replay
from neli_orchestrate.liveness import DeploymentLiveness, Liveness

__all__ = ["EXPLORE_MUTATIONS", "Exploration", "Scope", "explore"]

ROLE = "role0"
#: Mutations the exploration must catch (names shared with the seeded simulation).
EXPLORE_MUTATIONS = ("liveness_takeover_no_token", "token_reuse", "no_claim_check",
                     "run_on_wait")
FAULTS = ("crash", "pause", "liveness_loss")


@dataclass(frozen=True)
class Scope:
    """The bounds of one exploration."""

    deployments: int = 2
    run_keys: int = 2
    #: At most this many faults (crash, pause, liveness loss) per interleaving.
    faults: int = 2
    #: Longest interleaving explored (steps, environment steps included).
    depth: int = 12
    #: Which faults may happen (a subset of ``FAULTS``).
    fault_kinds: tuple[str, ...] = FAULTS
    #: Clock ticks available; the handoff window is ``handoff`` ticks.
    ticks: int = 3
    handoff: int = 2
    mutation: str | None = None
    #: Stop after this many distinct states (a guard for CI), None: no limit.
    max_states: int | None = None

    def __post_init__(self) -> None:
        unknown = set(self.fault_kinds) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; choose from {FAULTS}")
        if self.mutation is not None and self.mutation not in EXPLORE_MUTATIONS:
            raise ValueError(f"unknown mutation {self.mutation!r}; choose from"
                             f" {', '.join(EXPLORE_MUTATIONS)}")


@dataclass
class Exploration:
    """What an exploration saw: distinct states, transitions, depth reached, the violation."""

    states: int = 0
    transitions: int = 0
    depth: int = 0
    seconds: float = 0.0
    complete: bool = True
    violation: str | None = None
    trace: list[str] = dataclasses.field(default_factory=list)
    fired: dict[str, int] = dataclasses.field(default_factory=dict)

    def text(self) -> str:
        head = (f"{self.states} distinct states, {self.transitions} transitions, depth"
                f" {self.depth}{'' if self.complete else ' (state limit hit)'},"
                f" {self.seconds:.1f} s")
        if self.violation is None:
            return head + ": every invariant holds"
        return head + f"\nVIOLATION {self.violation}\n  " + "\n  ".join(self.trace)


@dataclass(frozen=True)
class Task:
    """One DAG run (deployment, run key): its phase, its try's program counter, its claim."""

    phase: str = "gate"          # gate | exec | done
    pc: str = "idle"             # idle | leading | begun | working | worked
    token: int | None = None     # the gate's token (executor tries reuse it)
    run_token: int | None = None  # the claim this try runs under
    epoch: int | None = None     # the ledger writer's epoch (init_transactions)


@dataclass(frozen=True)
class State:
    time: int
    ledger: tuple[LedgerRecord, ...]
    epoch: int
    #: Who leads the role: a task index, None, or -1 - index for a lease whose holder is
    #: stopped (crashed or paused) and will expire.
    lease: int | None
    tasks: tuple[Task, ...]
    paused: tuple[bool, ...]
    liveness_lost: tuple[bool, ...]
    gone: tuple[bool, ...]
    faults: int
    #: Per run key: (published token or -1, high-water mark of started tokens).
    sink: tuple[tuple[int, int], ...]
    #: Per run key: works started (capped at 2).
    starts: tuple[int, ...]
    #: A work raised (its re-run is then no duplicate: S4 applies only without it).
    raised: bool = False
    #: Per run key: bit mask of the deployments that claimed it.
    claimers: tuple[int, ...] = ()


class _Tokens:
    """What :func:`claim_record` reads of a fenced replay: the role and the next token."""

    def __init__(self, next_token: int) -> None:
        self.role = ROLE
        self.next_token = next_token


class _Violation(Exception):
    pass


class _Model:
    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.deployments = [f"d{i}" for i in range(scope.deployments)]
        self.keys = [f"2013-01-0{k + 1}" for k in range(scope.run_keys)]
        self.pairs = [(d, k) for d in range(scope.deployments) for k in range(scope.run_keys)]
        self.policy = DecisionPolicy(handoff_timeout=float(scope.handoff))

    def initial(self) -> State:
        n = self.scope.deployments
        return State(time=0, ledger=(), epoch=0, lease=None,
                     tasks=tuple(Task() for _ in self.pairs), paused=(False,) * n,
                     liveness_lost=(False,) * n, gone=(False,) * n, faults=0,
                     sink=tuple((-1, -1) for _ in self.keys), starts=(0,) * len(self.keys),
                     claimers=(0,) * len(self.keys))

    # -- helpers ------------------------------------------------------------------------------

    def latest(self, s: State, key: int) -> LedgerRecord | None:
        run_key = self.keys[key]
        for record in reversed(s.ledger):
            if record.run_key == run_key:
                return record
        return None

    def verdict(self, s: State, record: LedgerRecord | None, me: str) -> DeploymentLiveness | None:
        if (record is None or record.deployment == me
                or record.state not in (RunState.CLAIMED, RunState.FAILED)):
            return None
        d = self.deployments.index(record.deployment)
        return DeploymentLiveness(record.deployment,
                                  Liveness.GONE if s.gone[d] else Liveness.ALIVE)

    def with_task(self, s: State, i: int, task: Task, **changes: Any) -> State:
        tasks = list(s.tasks)
        tasks[i] = task
        return replace(s, tasks=tuple(tasks), **changes)

    def release(self, s: State, i: int, task: Task) -> State:
        lease = None if s.lease == i else s.lease
        return self.with_task(s, i, replace(task, pc="idle", epoch=None), lease=lease)

    def write(self, s: State, i: int, record: LedgerRecord, claim: bool) -> State | None:
        """Append ``record`` as task ``i``'s writer: None when fenced (the try fails)."""
        task = s.tasks[i]
        if task.epoch != s.epoch and self.scope.mutation != "no_fencing":
            return None  # a newer init_transactions() fenced this producer
        if claim:
            highest = max((r.token for r in s.ledger), default=-1)
            if record.token <= highest:
                raise _Violation(f"S5: claim token {record.token} of {record.run_key} not above"
                                 f" the previous token {highest}")
            key = self.keys.index(record.run_key)
            claimers = list(s.claimers)
            claimers[key] |= 1 << self.deployments.index(record.deployment)
            if self.fault_free(s) and claimers[key] & (claimers[key] - 1):
                raise _Violation(f"S4: without any fault, {record.run_key} is claimed by two"
                                 f" deployments (the second: {record.deployment}, token"
                                 f" {record.token})")
            s = replace(s, claimers=tuple(claimers))
        if record.state is RunState.COMPLETED:
            key = self.keys.index(record.run_key)
            if any(r.run_key == record.run_key and r.state is RunState.COMPLETED
                   for r in s.ledger):
                raise _Violation(f"S3: second COMPLETED of {record.run_key}")
            if s.sink[key][0] != record.token:
                raise _Violation(f"S3: COMPLETED {record.run_key} with token {record.token} but"
                                 f" the sink holds {s.sink[key][0]}")
        if task.epoch != s.epoch:
            raise _Violation(f"S2: a write of epoch {task.epoch} after epoch {s.epoch} began")
        return replace(s, ledger=(*s.ledger, record))

    def canonical(self, s: State) -> State:
        """Forget what only the fault-free checks need once a path is no longer fault-free, so
        states that differ only there are explored once."""
        if self.fault_free(s) or (s.raised and not any(s.starts) and not any(s.claimers)):
            return s
        zeros = (0,) * len(self.keys)
        return replace(s, raised=True, starts=zeros, claimers=zeros)

    def fault_free(self, s: State) -> bool:
        """No fault, no work raised, and no handoff window ran out (an executor slower than
        ``handoff_timeout`` is taken over by design): S4, exactly once without thrashing."""
        return s.faults == 0 and not s.raised and s.time < self.scope.handoff

    def decide(self, latest: LedgerRecord | None, me: Claimant,
               verdict: DeploymentLiveness | None, s: State) -> Decision:
        decision = decide(latest, me, now=float(s.time), policy=self.policy, liveness=verdict)
        if self.scope.mutation == "run_on_wait" and decision.outcome is Outcome.WAIT:
            return Decision(Outcome.TAKE_OVER, "mutation: run on WAIT", latest,
                            attempt=decision.attempt)
        return decision

    def claim(self, s: State, decision: Decision, key: int, me: Claimant, state: RunState,
              verdict: DeploymentLiveness | None) -> LedgerRecord:
        replay = cast(Replay, _Tokens(len(s.ledger)))
        record = claim_record(decision, replay, run_key=self.keys[key], me=me,
                              now=float(s.time), policy=self.policy, state=state)
        mutation = self.scope.mutation
        latest = decision.latest
        if latest is not None and (
            mutation == "token_reuse"
            or (mutation == "liveness_takeover_no_token" and verdict is not None
                and verdict.gone and decision.outcome is Outcome.TAKE_OVER)
        ):
            record = replace(record, token=latest.token)
        return record

    # -- transitions --------------------------------------------------------------------------

    def successors(self, s: State) -> Iterator[tuple[str, State]]:
        for i, (d, key) in enumerate(self.pairs):
            task = s.tasks[i]
            if task.phase == "done" or s.paused[d]:
                continue
            try:
                yield from self.task_steps(s, i, d, key, task)
            except _Violation as exc:
                raise _Violation(f"{exc}\n  (in the next step of {self.deployments[d]}/"
                                 f"{self.keys[key]} {task.phase})") from None
        yield from self.environment(s)

    def task_steps(self, s: State, i: int, d: int, key: int,
                   task: Task) -> Iterator[tuple[str, State]]:
        name = f"{self.deployments[d]}/{self.keys[key]} {task.phase}"
        me = Claimant(self.deployments[d], f"{self.deployments[d]}.{task.phase}")
        if task.pc == "idle":
            if s.lease is None:
                yield f"{name}: acquire", self.with_task(s, i, replace(task, pc="leading"),
                                                         lease=i)
            return
        if s.lease != i:
            # Leadership was lost while this process was stopped: its own clock says so before
            # its next step (the lease ends before the coordinator can hand the role on: S1,
            # whose timing margins the seeded simulation checks). The try fails.
            yield f"{name}: fenced (lost leadership)", self.release(s, i, task)
            return
        if task.pc == "leading":
            yield f"{name}: begin (epoch {s.epoch + 1})", self.with_task(
                s, i, replace(task, pc="begun", epoch=s.epoch + 1), epoch=s.epoch + 1)
            return
        if task.pc == "begun" and task.phase == "gate":
            yield from self.gate_decides(s, i, key, task, me, name)
            return
        if task.pc == "begun":
            yield from self.executor_checks(s, i, key, task, me, name)
            return
        if task.pc == "working":
            latest = self.latest(s, key)
            if latest is None or latest.token != task.run_token or (
                    latest.state is not RunState.RUNNING):
                raise _Violation(f"late executor runs: {name} starts work under token"
                                 f" {task.run_token}, newest record {latest and latest.describe()}")
            if self.fault_free(s) and s.starts[key] >= 1:
                raise _Violation(f"S4: without any fault, {self.keys[key]} starts a second"
                                 f" work (token {task.run_token})")
            published, high = s.sink[key]
            sink = list(s.sink)
            sink[key] = (published, max(high, task.run_token or 0))
            starts = list(s.starts)
            starts[key] = min(2, starts[key] + 1)
            yield f"{name}: work starts (token {task.run_token})", self.with_task(
                s, i, replace(task, pc="worked"), sink=tuple(sink), starts=tuple(starts))
            return
        if task.pc == "worked":
            yield from self.work_ends(s, i, key, task, name)

    def gate_decides(self, s: State, i: int, key: int, task: Task, me: Claimant,
                     name: str) -> Iterator[tuple[str, State]]:
        latest = self.latest(s, key)
        verdict = self.verdict(s, latest, me.deployment)
        decision = self.decide(latest, me, verdict, s)
        label = f"{name}: decide {decision.outcome}"
        if decision.outcome in (Outcome.SKIP_DONE, Outcome.GIVE_UP):
            yield label, self.release(s, i, replace(task, phase="done"))
            return
        if not decision.writes:
            yield label, self.release(s, i, task)  # WAIT: the sensor pokes again
            return
        record = self.claim(s, decision, key, me, RunState.CLAIMED, verdict)
        written = self.write(s, i, record, claim=True)
        if written is None:
            yield label + " (write fenced)", self.release(s, i, task)
            return
        yield f"{label} claims token {record.token}", self.release(
            written, i, replace(task, phase="exec", token=record.token))

    def executor_checks(self, s: State, i: int, key: int, task: Task, me: Claimant,
                        name: str) -> Iterator[tuple[str, State]]:
        latest = self.latest(s, key)
        assert task.token is not None
        check = check_claim(task.token, latest, me)
        if self.scope.mutation == "no_claim_check":
            check = ClaimCheck(ClaimStatus.OURS, "mutation: not checked", latest)
        if check.status is ClaimStatus.COMPLETED:
            yield f"{name}: claim {task.token} completed: skip", self.release(
                s, i, replace(task, phase="done"))
            return
        verdict = None
        if check.ok and latest is not None:
            if latest.state is RunState.CLAIMED and latest.token == task.token:
                record = latest.advance(RunState.RUNNING, at=float(s.time), member=me.member)
            else:  # only under no_claim_check
                record = LedgerRecord(ROLE, self.keys[key], RunState.RUNNING, task.token,
                                      me.deployment, me.member, 1, float(s.time))
            claim = False
            label = f"{name}: claim {task.token} is ours: RUNNING"
        elif check.decide_again:
            verdict = self.verdict(s, latest, me.deployment)
            decision = self.decide(latest, me, verdict, s)
            label = f"{name}: claim {task.token} {check.status}, decide {decision.outcome}"
            if decision.outcome is Outcome.SKIP_DONE:
                yield label, self.release(s, i, replace(task, phase="done"))
                return
            if not decision.claims:
                yield label, self.release(s, i, task)  # WAIT: the try waits and asks again
                return
            record = self.claim(s, decision, key, me, RunState.RUNNING, verdict)
            claim = True
            label += f" claims token {record.token}"
        else:
            yield f"{name}: claim {task.token} refused ({check.status})", self.release(
                s, i, replace(task, phase="done"))
            return
        written = self.write(s, i, record, claim=claim)
        if written is None:
            yield label + " (write fenced)", self.release(s, i, task)
            return
        yield label, self.with_task(written, i, replace(task, pc="working",
                                                        run_token=record.token))

    def work_ends(self, s: State, i: int, key: int, task: Task,
                  name: str) -> Iterator[tuple[str, State]]:
        token = task.run_token
        assert token is not None
        latest = next(r for r in reversed(s.ledger) if r.run_key == self.keys[key]
                      and r.token == token)
        published, high = s.sink[key]
        # The work raises: FAILED, with the retry window of SAME_DEPLOYMENT_FIRST.
        failed = latest.advance(RunState.FAILED, at=float(s.time), reason="work raised",
                                handoff_deadline=float(s.time + self.scope.handoff))
        written = self.write(s, i, failed, claim=False)
        yield f"{name}: work raises, FAILED", self.release(
            replace(written if written is not None else s, raised=True), i, task)
        if token < high:  # the token-checked sink refuses a stale writer
            yield f"{name}: sink refuses token {token} < {high}", self.release(s, i, task)
            return
        if published > token:
            raise _Violation(f"S3: token {token} published over {published}")
        sink = list(s.sink)
        sink[key] = (token, max(high, token))
        s2 = replace(s, sink=tuple(sink))
        done = latest.advance(RunState.COMPLETED, at=float(s.time))
        written = self.write(s2, i, done, claim=False)
        if written is None:  # published, then fenced before COMPLETED: the next leader sees
            yield f"{name}: published t{token}, COMPLETED fenced", self.release(s2, i, task)
            return
        yield f"{name}: COMPLETED t{token}", self.release(written, i, replace(task, phase="done"))

    def environment(self, s: State) -> Iterator[tuple[str, State]]:
        if s.time < self.scope.ticks:
            yield f"clock ticks to {s.time + 1}", replace(s, time=s.time + 1)
        if s.lease is not None and s.lease < 0:
            yield "the stopped holder's lease expires", replace(s, lease=None)
        for d, name in enumerate(self.deployments):
            silent = s.paused[d] or s.liveness_lost[d]
            if silent and not s.gone[d]:
                yield f"{name}: liveness member expires (GONE)", replace(
                    s, gone=_set(s.gone, d, True))
            if not silent and s.gone[d]:
                yield f"{name}: announcer rejoins (ALIVE)", replace(s, gone=_set(s.gone, d, False))
            if s.paused[d]:
                lease = s.lease
                if lease is not None and lease < 0 and self.pairs[-1 - lease][0] == d:
                    lease = -1 - lease  # its own lease, not expired yet: it still holds
                yield f"{name}: resumes", replace(s, paused=_set(s.paused, d, False),
                                                  lease=lease)
            if s.liveness_lost[d]:
                yield f"{name}: liveness heartbeats arrive again", replace(
                    s, liveness_lost=_set(s.liveness_lost, d, False))
        if s.faults >= self.scope.faults:
            return
        f = s.faults + 1
        kinds = self.scope.fault_kinds
        for d, name in enumerate(self.deployments):
            if "pause" in kinds and not s.paused[d]:
                lease = s.lease
                if lease is not None and lease >= 0 and self.pairs[lease][0] == d:
                    lease = -1 - lease
                yield f"FAULT {name}: paused", replace(s, paused=_set(s.paused, d, True),
                                                       lease=lease, faults=f)
            if "liveness_loss" in kinds and not s.liveness_lost[d]:
                yield f"FAULT {name}: liveness heartbeats lost/delayed", replace(
                    s, liveness_lost=_set(s.liveness_lost, d, True), faults=f)
        for i, task in enumerate(s.tasks):
            if "crash" in kinds and task.phase != "done" and task.pc != "idle":
                lease = -1 - i if s.lease == i else s.lease
                crashed = self.with_task(s, i, replace(task, pc="idle", epoch=None),
                                         lease=lease, faults=f)
                d, key = self.pairs[i]
                yield (f"FAULT {self.deployments[d]}/{self.keys[key]} {task.phase} crashes"
                       f" at {task.pc}", crashed)


def _set(values: tuple[bool, ...], index: int, value: bool) -> tuple[bool, ...]:
    return values[:index] + (value,) + values[index + 1:]


def explore(scope: Scope | None = None) -> Exploration:
    """Explore every interleaving of ``scope`` breadth-first; stop at the first violation."""
    scope = scope or Scope()
    model = _Model(scope)
    start = time.monotonic()
    result = Exploration()
    first = model.initial()
    parent: dict[State, tuple[State | None, str]] = {first: (None, "start")}
    frontier: deque[tuple[State, int]] = deque([(first, 0)])
    while frontier:
        state, depth = frontier.popleft()
        result.depth = max(result.depth, depth)
        if depth >= scope.depth:
            continue
        try:
            for label, nxt in model.successors(state):
                result.transitions += 1
                if label.startswith("FAULT"):
                    fault = next(f for f in ("crash", "pause", "lost") if f in label)
                    result.fired[fault] = result.fired.get(fault, 0) + 1
                nxt = model.canonical(nxt)
                if nxt not in parent:
                    parent[nxt] = (state, label)
                    frontier.append((nxt, depth + 1))
                    if scope.max_states is not None and len(parent) >= scope.max_states:
                        result.complete = False
                        frontier.clear()
                        break
        except _Violation as exc:
            result.violation = str(exc)
            result.trace = _trace(parent, state)
            break
    result.states = len(parent)
    result.seconds = time.monotonic() - start
    return result


def _trace(parent: dict[State, tuple[State | None, str]], state: State) -> list[str]:
    steps: list[str] = []
    current: State | None = state
    while current is not None:
        before, label = parent[current]
        steps.append(label)
        current = before
    return list(reversed(steps))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m integration.sim.explore",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--depth", type=int, default=Scope.depth)
    parser.add_argument("--faults", type=int, default=Scope.faults)
    parser.add_argument("--mutation", choices=EXPLORE_MUTATIONS)
    args = parser.parse_args(argv)
    result = explore(Scope(depth=args.depth, faults=args.faults, mutation=args.mutation))
    print(result.text())  # noqa: T201 - command-line tool
    return 0 if result.violation is None else 1


if __name__ == "__main__":
    sys.exit(main())
