"""Deterministic simulation of the exactly-once protocol: one thread, seeded, replayable.

Usage::

    python -m neli_orchestrate.sim --seeds 10000          # run seeds 0..9999 on every core
    python -m neli_orchestrate.sim --seed 1234 --trace    # replay one seed with its trace

    from neli_orchestrate.sim import run_seed, run_seeds, SimConfig
    result = run_seed(1234)              # SeedResult: ok, invariant, message, trace
    summary = run_seeds(range(10_000))   # Summary: failures, totals

A simulated broker (groups with session timeouts and cooperative revokes, transactional
epochs, read_committed logs), N deployments running gate and executor tasks, message delays,
crashes at every protocol step, SIGSTOP pauses past the session timeout, network cuts and
bounded clock error, Airflow-like and Dagster-like orchestrators, driving the real decision
table and ledger code through the ``LedgerStore`` seam. Invariants S1-S5 and L1 of DESIGN.md
are checked as the schedule runs; see ``docs/simulation.md``.
"""

from neli_orchestrate.sim.config import MUTATIONS, SimConfig
from neli_orchestrate.sim.kernel import Violation
from neli_orchestrate.sim.model import Simulation, Stats
from neli_orchestrate.sim.runner import SeedResult, Summary, format_trace, run_seed, run_seeds

__all__ = [
    "MUTATIONS",
    "SeedResult",
    "SimConfig",
    "Simulation",
    "Stats",
    "Summary",
    "Violation",
    "format_trace",
    "run_seed",
    "run_seeds",
]
