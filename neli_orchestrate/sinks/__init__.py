"""Token-checked sinks: the data half of fencing, one module per kind of target.

- ``keys``: the one derivation of the key a table sink records a token under (role, run key,
  the partition the write replaces), injective and escaped.
- ``directory``: :class:`~neli_orchestrate.sinks.directory.TokenCommitGuard`, a directory of
  files on one POSIX filesystem (``flock``, high-water mark, atomic rename); ``parquet``: a
  PySpark DataFrame written through it.
- ``delta``: a Delta Lake table, through Spark (``write_delta_fenced``) or delta-rs
  (``write_deltalake_fenced``).
- ``iceberg``: an Apache Iceberg table, through Spark (``write_iceberg_fenced``) or pyiceberg
  (``write_pyiceberg_fenced``).
- ``io_managers``: ``NeliDeltaIOManager`` and ``NeliIcebergIOManager``, Dagster IO managers that
  write an ``@singleton_asset``'s output through those sinks under the step's claim (imports
  dagster; the only module here that does).

Users import the writers from where they always did (``neli_orchestrate.spark``,
``neli_orchestrate.spark.delta``, ``neli_orchestrate.dagster.delta``, ...); this package holds the
one copy of each. Importing it imports neither pyspark, deltalake nor pyiceberg. See
docs/guide/spark.md.
"""

from __future__ import annotations
