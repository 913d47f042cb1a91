"""Deterministic simulation of the exactly-once protocol: one thread, seeded, replayable.

Usage::

    python -m integration.sim --seeds 10000          # run seeds 0..9999 on every core
    python -m integration.sim --seed 1234 --trace    # replay one seed with its trace

    from integration.sim.runner import run_seed, run_seeds
    result = run_seed(1234)              # SeedResult: ok, invariant, message, trace
    summary = run_seeds(range(10_000))   # Summary: failures, totals

A simulated broker (groups with session timeouts and cooperative revokes, transactional
epochs, read_committed logs), N deployments running gate and executor tasks, message delays,
crashes at every protocol step, SIGSTOP pauses past the session timeout, network cuts and
bounded clock error, Airflow-like and Dagster-like orchestrators, driving the real decision
table and ledger code through the ``LedgerStore`` seam. Invariants S1-S5 and L1 of DESIGN.md
are checked as the schedule runs; see ``docs/internals/simulation.md``.

Development tooling, not user API: the package exports nothing; import from its modules
(``runner``, ``config``, ``model``, ``kernel``, ``broker``, ``store``, ``explore``).
"""

__all__: list[str] = []
