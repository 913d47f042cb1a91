"""The compatibility job's tests: ``python tests/compat/selection.py VERSION`` prints node ids.

Chosen for what differs between Kafka releases, not for coverage (the full suite covers the
pinned release): a 3-4 minute run per release.

- core: leadership, hand-over, pause fencing, the revoke barrier and Full NELI on a real group
  (``test_core_broker.py``, both group protocols where the broker has KIP-848), and start-up
  reading the broker's group settings (session limits, the protocol chosen);
- ledger: every broker test (transactions, zombie fencing, read_committed replays, compaction
  config, malformed records) - the ledger relies on broker features more than anything else;
- singleton: exactly once across three deployments, kill -9 take-over, a paused runner that
  cannot commit, a fenced writer in another process (``test_singleton_kafka.py``);
- compat: doctor's release and protocol, KIP-848 offered or refused at start.

Tests parametrized ``[consumer]`` (KIP-848) run on 4.x only; 3.9 offers classic groups only.
"""

from __future__ import annotations

import sys

SELECTION = [
    "tests/core/test_core_broker.py",
    "tests/core/test_core_startup.py::test_the_chosen_protocol_reaches_the_consumer_and_the_log",
    "tests/core/test_core_startup.py::test_a_session_timeout_outside_the_brokers_limits_fails_at_start",
    "tests/ledger/test_ledger_kafka.py",
    "tests/singleton/test_singleton_kafka.py",
    "tests/compat/test_versions.py",
]

#: The oldest 3.x and the newest 4.x the job runs (README.md, "Supported Kafka").
VERSIONS = ("3.9.1", "4.4.0")


def node_ids(version: str) -> list[str]:
    """The node ids (and deselect options) to run against ``version``."""
    args = list(SELECTION)
    if int(version.split(".")[0]) < 4:
        # classic groups only: deselect the KIP-848 parametrizations
        args += ["-k", "not consumer] and not -consumer]"]
    return args


if __name__ == "__main__":
    print("\n".join(node_ids(sys.argv[1])))
