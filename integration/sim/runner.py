"""Run seeds (in parallel), collect failures with their traces, replay one seed."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import multiprocessing
import os
import time
import traceback
from collections.abc import Iterable, Sequence
from typing import Any

from integration.sim.config import SimConfig
from integration.sim.kernel import TraceEntry, Violation
from integration.sim.model import CheckClaimFn, DecideFn, Simulation, Stats


@dataclasses.dataclass
class SeedResult:
    """Outcome of one seed. ``invariant`` is None when every check passed."""

    seed: int
    invariant: str | None
    message: str
    stats: Stats
    trace: list[TraceEntry]
    #: The mutation the seed ran under (its replay command needs it too).
    mutation: str | None = None

    @property
    def ok(self) -> bool:
        return self.invariant is None

    def report(self) -> str:
        """The seed, the broken invariant and the whole trace, ready to print."""
        head = f"seed {self.seed}: " + ("ok" if self.ok else f"{self.invariant} violated")
        lines = [head]
        if not self.ok:
            lines.append(self.message)
        lines.append(format_trace(self.trace))
        if not self.ok:
            mutation = "" if self.mutation is None else f" --mutation {self.mutation}"
            lines.append(
                f"replay: python -m integration.sim --seed {self.seed} --trace{mutation}")
        return "\n".join(lines)


def format_trace(trace: Sequence[TraceEntry]) -> str:
    """One line per trace entry: time, actor, event, detail."""
    return "\n".join(
        f"{t:>8} ms  {actor:<24} {event:<26} {detail}" for t, actor, event, detail in trace
    )


def run_seed(
    seed: int,
    config: SimConfig | None = None,
    *,
    decide_fn: DecideFn | None = None,
    check_claim_fn: CheckClaimFn | None = None,
) -> SeedResult:
    """Run one seeded schedule and check every invariant; never raises for a violation."""
    config = config or SimConfig()
    sim = Simulation(seed, config, decide_fn=decide_fn, check_claim_fn=check_claim_fn)
    try:
        stats = sim.run()
        return SeedResult(seed, None, "", stats, sim.kernel.trace, config.mutation)
    except Violation as violation:
        sim.stats.events = sim.kernel.events
        sim.stats.end_time = sim.kernel.now
        return SeedResult(seed, violation.invariant, violation.message, sim.stats,
                          sim.kernel.trace, config.mutation)
    except Exception:  # noqa: BLE001 - a crash of the model is a failure of the seed too
        sim.kernel.log("checker", "MODEL ERROR", traceback.format_exc())
        return SeedResult(seed, "ERROR", traceback.format_exc(), sim.stats, sim.kernel.trace,
                          config.mutation)


#: Counters of :class:`Stats` that a :class:`Summary` sums over seeds.
_SUMMED = (
    "fault_free", "events", "works", "claims", "completed", "terminal_failed",
    "fenced_writes", "stale_sink_commits", "leader_gains", "faults", "own_later_tries",
    "fenced_tries", "fenced_before_start", "manual_clears", "unreadable_refused",
    "checkpoint_replays", "compacted",
)


@dataclasses.dataclass
class Summary:
    """Totals over many seeds; ``failures`` holds (seed, invariant, message) of failing seeds."""

    seeds: int = 0
    failures: list[tuple[int, str, str]] = dataclasses.field(default_factory=list)
    fault_free: int = 0
    events: int = 0
    works: int = 0
    claims: int = 0
    completed: int = 0
    terminal_failed: int = 0
    fenced_writes: int = 0
    stale_sink_commits: int = 0
    leader_gains: int = 0
    faults: int = 0
    own_later_tries: int = 0
    fenced_tries: int = 0
    fenced_before_start: int = 0
    manual_clears: int = 0
    unreadable_refused: int = 0
    checkpoint_replays: int = 0
    compacted: int = 0
    min_handover_gap: int | None = None
    fired: dict[str, int] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    #: CPU time the workers spent (independent of other load on the machine).
    cpu_seconds: float = 0.0
    workers: int = 1

    def add(self, seed: int, result: SeedResult) -> None:
        self.seeds += 1
        if not result.ok:
            self.failures.append((seed, result.invariant or "", result.message))
        self._accumulate(result.stats)

    def merge(self, other: Summary) -> None:
        self.seeds += other.seeds
        self.cpu_seconds += other.cpu_seconds
        self.failures.extend(other.failures)
        self._accumulate(other)

    def _accumulate(self, totals: Stats | Summary) -> None:
        """Add the counters of one schedule's Stats, or of another Summary, to these."""
        for name in _SUMMED:
            setattr(self, name, getattr(self, name) + getattr(totals, name))
        gap = totals.min_handover_gap
        if gap is not None and (self.min_handover_gap is None or gap < self.min_handover_gap):
            self.min_handover_gap = gap
        for what, n in totals.fired.items():
            self.fired[what] = self.fired.get(what, 0) + n

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def text(self) -> str:
        rate = self.seeds / self.seconds if self.seconds else 0.0
        lines = [
            f"{self.seeds} seeds in {self.seconds:.1f} s on {self.workers} worker(s)"
            f" ({rate:.0f} seeds/s; {self.cpu_seconds:.1f} CPU s,"
            f" {1000 * self.cpu_seconds / max(1, self.seeds):.1f} ms per seed),"
            f" {len(self.failures)} failing",
            f"  fault-free schedules {self.fault_free}, faults injected {self.faults},"
            f" events {self.events}",
            f"  claims {self.claims}, work executions {self.works}, COMPLETED {self.completed},"
            f" terminally FAILED {self.terminal_failed}",
            f"  ledger writes refused by fencing {self.fenced_writes}, stale sink commits"
            f" refused {self.stale_sink_commits}",
            f"  tries with the gate's token meeting their own later claim"
            f" {self.own_later_tries}, tries fenced {self.fenced_tries} (before the work"
            f" started {self.fenced_before_start}), manual clears {self.manual_clears}",
            f"  tries refusing to decide on an unreadable newest record"
            f" {self.unreadable_refused}",
            f"  replays continued from a host's checkpoint {self.checkpoint_replays},"
            f" ledger records removed by compaction {self.compacted}",
            f"  leadership acquisitions {self.leader_gains}, smallest handover gap"
            f" {self.min_handover_gap} ms (S1 margin: > 0 means no overlap)",
        ]
        if self.fired:
            kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.fired.items()))
            lines.append(f"  faults by kind: {kinds}")
        for seed, invariant, message in self.failures[:20]:
            lines.append(f"  FAIL seed {seed}: {invariant}: {message}")
        return "\n".join(lines)


def _quiet_ledger_warnings() -> None:
    """In a worker process: the ledger's warnings about records the simulation made unreadable
    on purpose (a newer deployment's schema) would reach stderr through logging's last resort."""
    logging.getLogger("neli_orchestrate.ledger").setLevel(logging.ERROR)


def _run_chunk(args: tuple[list[int], SimConfig, bool]) -> Summary:
    seeds, config, stop_at_first = args
    summary = Summary()
    quiet = dataclasses.replace(config, trace=False)
    started = time.process_time()
    for seed in seeds:
        sim_result = run_seed(seed, quiet)
        summary.add(seed, sim_result)
        if stop_at_first and not sim_result.ok:
            break
    summary.cpu_seconds = time.process_time() - started
    return summary


def run_seeds(
    seeds: Iterable[int],
    config: SimConfig | None = None,
    *,
    workers: int | None = None,
    stop_at_first: bool = False,
) -> Summary:
    """Run many seeds, in ``workers`` processes (default: CPU count), without traces.

    Replay a failing seed with :func:`run_seed` (trace on) to see what happened: a seed
    always produces the same schedule.
    """
    config = config or SimConfig()
    seed_list = list(seeds)
    workers = workers or os.cpu_count() or 1
    workers = max(1, min(workers, len(seed_list) or 1))
    started = time.perf_counter()
    summary = Summary()
    if workers == 1:
        summary.merge(_run_chunk((seed_list, config, stop_at_first)))
    else:
        size = max(1, min(250, len(seed_list) // (workers * 4) or 1))
        chunks = [seed_list[i:i + size] for i in range(0, len(seed_list), size)]
        # spawn, not fork: the caller (a pytest run, an Airflow worker) has threads of
        # librdkafka and the JVM's children; a forked worker can deadlock on a lock one of
        # them held. ProcessPoolExecutor also fails loudly if a worker dies, where Pool hangs.
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=context, initializer=_quiet_ledger_warnings
        ) as pool:
            jobs = [pool.submit(_run_chunk, (c, config, stop_at_first)) for c in chunks]
            for job in jobs:
                part = job.result()
                summary.merge(part)
                if stop_at_first and part.failures:
                    for pending in jobs:
                        pending.cancel()
                    break
    summary.failures.sort()
    summary.seconds = time.perf_counter() - started
    summary.workers = workers
    return summary
