"""NELI protocol core: leadership of roles induced from Kafka consumer-group partition assignment.

Usage::

    from neli_orchestrate import LeaderFenced, Neli, NeliConfig
    with Neli(NeliConfig(bootstrap_servers="127.0.0.1:9092", group_id="billing"),
              barrier=print) as neli:
        pulser = neli.background(lambda: do_a_bit_of_leader_work())

What users write (``Neli``, ``NeliConfig``, the events, ``MockNeli``) is exported by
:mod:`neli_orchestrate`; this package exports nothing itself. One concept per module:
``neli`` (the member loop), ``config`` (settings, profiles), ``events`` (acquired, revoked,
fenced), ``mock`` (MockNeli), ``fast`` and ``full`` (the two protocols' state), ``state``
(shared pure bookkeeping), ``hints`` (release hints and nudges), ``heartbeat`` (leader-topic
records), ``pulser``, ``roles``, ``clock``, ``namespace`` (every Kafka name), ``topic``
(start-up checks), ``kafka`` (the seam) and ``confluent`` (its confluent-kafka implementation).
See ``docs/internals/protocol.md`` for the protocol, its timing assumptions and profiles.
"""

__all__: list[str] = []
