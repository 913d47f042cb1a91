"""Run each run of a singleton role exactly once across deployments: lead, fence, decide, run.

Usage::

    singleton = Singleton(SingletonConfig(neli=NeliConfig(bootstrap_servers="127.0.0.1:9092"),
                                          namespace="acme", deployment="us-east-1"))
    with singleton.claim(role="daily_flights", run_key="2013-01-05") as run:
        if run.should_run:
            build_table(token=run.token)     # leaving the block records COMPLETED

One concept per module: :mod:`~neli_orchestrate.singleton.singleton` (the API: claim, reserve,
execute, reset, expire, hold), :mod:`~neli_orchestrate.singleton.config` (:class:`SingletonConfig`),
:mod:`~neli_orchestrate.singleton.run` (the answers, :class:`Reservation` and :class:`Run`),
:mod:`~neli_orchestrate.singleton.leadership` (a role's member from acquiring to release),
:mod:`~neli_orchestrate.singleton.held` (claims through a role held between them),
:mod:`~neli_orchestrate.singleton.busy` (the busy-group rule) and
:mod:`~neli_orchestrate.singleton.groups` (what it reads of groups it does not join).

Users import :class:`~neli_orchestrate.Singleton` and :class:`~neli_orchestrate.SingletonConfig`
from :mod:`neli_orchestrate`; this package exports nothing itself.
"""

__all__: list[str] = []
