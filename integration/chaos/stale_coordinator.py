"""A group's coordinator paused past its fencing: does a long-lived admin client find the new one?

Run (about 4 minutes; a three-node cluster on Kafka's defaults)::

    python -m integration.chaos.stale_coordinator [--seconds 120]

A consumer joins group ``stale-group`` and leaves, so the group exists with a coordinator. Two
child processes then describe the group every 2 s for ``--seconds``: ``raw``, a confluent-kafka
``AdminClient`` used as the seam used to (librdkafka's own 5 s request timeout), and ``seam``,
``neli_orchestrate.core.confluent``'s admin. The coordinator's broker is stopped (SIGSTOP) for
15 s, past the controller's fencing (9 s), then continued. Kafka moves the coordinator; the
resumed broker answers ``NOT_COORDINATOR``. Printed: each client's answers after the resume,
runs of equal answers folded. Exit status 1 if the seam answered ``NOT_COORDINATOR`` more than
twice after the resume (it replaces its client on that answer, docs/internals/chaos.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from neli_orchestrate.testing.local_kafka import LocalKafkaCluster

REPO = Path(__file__).resolve().parents[2]
GROUP, TOPIC = "stale-group", "stale-topic"

POLLER = r"""
import json, sys, time
mode, boot, group, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
if mode == "raw":
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": boot, "log_level": 0})
    def describe():
        return admin.describe_consumer_groups([group], request_timeout=5)[group].result(
            timeout=10).state.name
else:
    from neli_orchestrate.core.client_settings import client_settings
    from neli_orchestrate.core.confluent import ConfluentKafka
    admin = ConfluentKafka().admin(client_settings(boot, logger="poller"))
    def describe():
        return admin.describe_group(group, 5).state
end = time.monotonic() + seconds
while time.monotonic() < end:
    at = time.time()
    try:
        answer = describe()
    except Exception as exc:
        text = str(exc)
        answer = next((c for c in ("NOT_COORDINATOR", "_TIMED_OUT", "COORDINATOR_NOT_AVAILABLE")
                       if c in text), text[-80:])
    print(json.dumps([at, answer]), flush=True)
    time.sleep(2)
"""


def _coordinator(boot: str) -> int:
    admin = AdminClient({"bootstrap.servers": boot, "log_level": 0})
    admin.create_topics([NewTopic(TOPIC, 1, 3)])[TOPIC].result()
    consumer = Consumer({"bootstrap.servers": boot, "group.id": GROUP, "log_level": 0})
    consumer.subscribe([TOPIC])
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            consumer.poll(0.5)
            described = admin.describe_consumer_groups([GROUP], request_timeout=5)[GROUP]
            description = described.result()
            if description.members:
                return int(description.coordinator.id)
    finally:
        consumer.close()
    raise SystemExit("the consumer never joined its group")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=120.0,
                        help="how long each client describes after the pause starts")
    args = parser.parse_args(argv)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO),
                                                         os.environ.get("PYTHONPATH", "")])}
    with LocalKafkaCluster() as cluster:
        boot = cluster.bootstrap_servers
        node = _coordinator(boot)
        pollers = {mode: subprocess.Popen(
            [sys.executable, "-c", POLLER, mode, boot, GROUP, str(args.seconds + 25)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for mode in ("raw", "seam")}
        time.sleep(6)                         # both clients have cached the coordinator
        process = cluster.nodes[node].process
        assert process is not None
        os.kill(process.pid, signal.SIGSTOP)
        time.sleep(15)
        os.kill(process.pid, signal.SIGCONT)
        resumed = time.time()
        print(f"coordinator: node {node}, stopped 15 s; answers after the resume:")
        stale = {}
        for mode, proc in pollers.items():
            out, err = proc.communicate(timeout=args.seconds + 120)
            answers = [a for at, a in map(json.loads, out.splitlines()) if at >= resumed]
            stale[mode] = sum(1 for a in answers if a == "NOT_COORDINATOR")
            runs = ", ".join(f"{a} x{len(list(g))}" for a, g in itertools.groupby(answers))
            print(f"  {mode:4} (exit {proc.returncode}): {runs}")
            if proc.returncode:
                print(err[-400:])
    print(f"NOT_COORDINATOR answers after the resume: raw {stale['raw']}, seam {stale['seam']}")
    return 0 if stale["seam"] <= 2 else 1


if __name__ == "__main__":
    sys.exit(main())
