"""Run ledger: who claimed, ran and finished each run of a role, fenced by Kafka transactions.

Usage (what :class:`~neli_orchestrate.Singleton` does once this member leads ``role``)::

    ledger = KafkaLedger(KafkaLedgerConfig(bootstrap_servers="127.0.0.1:9092"))
    writer = ledger.begin(role)            # init_transactions(): fences every earlier leader
    replay = writer.replay()               # read_committed, up to the high watermark
    latest = replay.latest(run_key)        # feed to neli_orchestrate.decision.decide(...)
    writer.write(record)                   # one committed transaction, or FencedError

The ledger is a compacted Kafka topic. One record per state change of a run:

- **key**: the UTF-8 JSON array ``["<role>","<run key>"]`` (:func:`encode_key`). JSON string
  quoting makes the pair unambiguous whatever characters either part holds, and the key stays
  readable in console tools. Compaction keeps the latest record per (role, run key).
- **value**: a JSON object with the schema version ``"v": 1`` (:class:`LedgerRecord`); ``null``
  (a tombstone) deletes the run key after its retention (:func:`expired_run_keys`).
- **partition**: every record of a role goes to partition ``crc32(role) % partitions``
  (:func:`role_partition`), so a role's history is one totally ordered log.

Fencing token: the token of a new claim is the read_committed end offset of the role's
partition, observed by the new leader *after* its ``init_transactions()`` and a replay that
reached the partition's high watermark as of that moment (:attr:`Replay.next_token`). Every
earlier leader's committed record sits at an offset below that end offset (its commit either
finished before the fence, or was aborted by it), and each record's token is at most its own
offset, so tokens of successive claims of a role strictly increase. Offsets are never reused,
so the rule survives compaction and tombstones. See ``docs/guide/ledger.md``.

.. note:: The ledger does not decide anything; :mod:`neli_orchestrate.decision` does. Nor does
   it prove leadership: only the member that currently leads ``role`` may call :meth:`begin`,
   and the broker, not timing, makes every earlier writer's next write fail.

This package exports nothing; import from its modules: ``kafka`` (:class:`KafkaLedger`,
``KafkaLedgerConfig``), ``record`` (``LedgerRecord``, ``RunState``, the key and partition),
``replay`` (``Replay``, the token rule), ``store`` (the ``LedgerStore`` seam, ``expire``),
``cache`` (the replay cache) and ``history`` (the topic record by record, for people).
"""

__all__: list[str] = []
