"""One supervisor for every process a piece of work starts, used by ``neli-orchestrate run``
(``run --hold``) and the fenced Airflow try.

:mod:`~neli_orchestrate.supervise.work` starts COMMAND under a keeper and stops it
(``start``, ``Work``), or stops what work running in this process started (``OwnTree``);
:mod:`~neli_orchestrate.supervise.keeper` is the keeper program and the mechanics (child
subreaper, cgroup v2 with ``cgroup.kill``, /proc sweeps), standard library only.
docs/guide/run.md says which mechanism is used where.

Internal: this package exports nothing itself.
"""

__all__: list[str] = []
