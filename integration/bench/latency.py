"""Benchmark a claim across regions: reserve latency at 0, 30, 60 and 120 ms of round trip.

Usage::

    python integration/bench/latency.py --trials 10                  # starts a LocalKafka
    python integration/bench/latency.py --rtt 0 --rtt 60 --profile fast

The broker gets a second client listener that it advertises at a delaying TCP proxy
(``integration/regions/delay_proxy.py``; this kernel has no netem), so every request of the
measured ``Singleton`` crosses the proxy: ``rtt / 2`` each way, the deployment in one region
and the broker in another. The broker's own traffic (its controller, its transaction markers)
stays on the undelayed listener. Each trial is one reserve of a fresh run key of an
uncontended role: ``Singleton.reserve(role, run_key)`` as in ``claim.py`` (join the role's
group, lead, begin the role's transactional ledger writer, replay, decide, commit CLAIMED,
leave), or ``HeldRole.reserve(run_key)`` through ``Singleton.hold`` (replay, decide, commit
CLAIMED: the member stays in the group). Every path and round trip runs side by side in one
process, in rounds (each round one trial of every cell, in a shuffled order), so machine load
spreads evenly.

Two numbers per claim:
- **round trips on the critical path**: the slope of the p50 latency against the round trip
  (least squares over the round trips measured): what one more millisecond between regions
  costs, in round trips;
- **requests per reserve**: every Kafka request the deployment's clients sent through the
  proxy during one reserve, by API (background heartbeats and fetches included: they overlap).

The goal of issue #31: at most 4 round trips + 20 ms. Writes
``integration/bench/results/latency.json`` and ``latency.md`` and prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import platform
import random
import statistics
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from benchlib import percentile

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from integration.regions.delay_proxy import (  # noqa: E402
    KAFKA_API_NAMES,
    DelayProxy,
    broker_behind_proxies,
)

RESULTS = Path(__file__).resolve().parent / "results"


def _slope(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of y against x."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return slope, my - slope * mx


#: How a claim is made. ``held``: through ``Singleton.hold`` (the role's member stays in its
#: group between claims; ledger clients kept); ``kept``: a one-off ``Singleton.reserve`` that
#: joins and leaves, resuming the role's producer and the replay consumer's assignment from
#: the last claim (``KafkaLedgerConfig.keep_clients``); ``fresh``: the same, creating and
#: fencing a new producer and assigning anew for every claim (the path before issue #31);
#: ``task``: a new ``Singleton`` for every reserve, nothing kept, as a gate's task process
#: makes it (Airflow's ``open_singleton``, Dagster's gate op; the trial ends when ``reserve``
#: returns, before the ``close``). Not a claim: ``bare-txn``, a reference for what a process
#: of its own pays before any NELI step: a new transactional producer's ``init_transactions``
#: and one transaction of one record, on a topic beside the ledger (:func:`_bare_topic`).
PATHS = {"held": True, "kept": True, "fresh": False, "task": False, "bare-txn": False}

#: Issue #31's goal for a reserve: at most this many round trips plus this many milliseconds.
GOAL_ROUND_TRIPS, GOAL_EXTRA_MS = 4, 20.0


def _task_reserve(config: Any, role: str, run_key: str) -> Any:
    """A gate's task process: a new Singleton (every client new), one reserve; closed after."""
    from neli_orchestrate import Singleton

    singleton = Singleton(config)
    try:
        return singleton.reserve(role, run_key)
    finally:
        closing.append(singleton)  # closed after the clock stops, as the task's end is


def _bare_topic(config: Any) -> str:
    """The topic of ``bare-txn``: one partition beside the ledger, so the reference writes no
    ledger record."""
    return f"{config.namespace}.bare-txn"


def _create_bare_topic(config: Any) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = _bare_topic(config)
    admin = AdminClient({"bootstrap.servers": config.neli.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)


def _bare_transaction(config: Any, role: str, run_key: str) -> None:
    """A new transactional producer commits one record: the connections, the coordinator's
    lookup, ``init_transactions`` and one transaction, with no group, no replay and no
    decision. The floor of anything that commits from a process of its own."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": config.neli.bootstrap_servers,
                         "transactional.id": f"{config.namespace}.bare-txn.{role}",
                         "socket.nagle.disable": True, "linger.ms": 0,
                         # as the ledger's producer: no wait on librdkafka's coordinator timer
                         "enable.sparse.connections": False})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(_bare_topic(config), key=run_key.encode(), value=b"-")
    producer.commit_transaction(30)
    closing.append(producer)


#: Clients a trial made, closed between trials so that the clock does not count their close.
closing: list[Any] = []


def run(rtts: list[float], trials: int, profile: str,
        paths: list[str] | None = None) -> dict[str, Any]:
    from neli_orchestrate import NeliConfig, Outcome, Singleton, SingletonConfig
    from neli_orchestrate.ledger.kafka import KafkaLedger
    from neli_orchestrate.testing.local_kafka import free_port

    paths = paths or list(PATHS)
    cells = [(path, rtt) for path in paths for rtt in rtts]
    remote_port = free_port()
    lateness: dict[Any, list[float]] = {cell: [] for cell in cells}
    with DelayProxy(("127.0.0.1", remote_port), precise=True) as proxy, \
            contextlib.ExitStack() as holds:
        kafka = broker_behind_proxies({"remote": proxy.port}, {"remote": remote_port}).start()
        try:
            bootstrap = f"127.0.0.1:{proxy.port}"
            singletons: dict[Any, Any] = {}
            reserve: dict[Any, Any] = {}
            for cell in cells:
                path, rtt = cell
                neli = NeliConfig(bootstrap_servers=bootstrap, profile=profile)
                config = SingletonConfig(neli=neli, namespace=f"lat{uuid.uuid4().hex[:6]}",
                                         deployment="far")
                ledger = KafkaLedger(dataclasses.replace(config.ledger_config(),
                                                         keep_clients=PATHS[path]))
                singletons[cell] = Singleton(config, ledger=ledger)
                proxy.set_delay(rtt / 2000)
                singletons[cell].reserve("warm-up", "0")  # topics, coordinators, connections
                singletons[cell].reserve("measured", "warm")  # the kept path's first fence
                if path == "held":
                    held = holds.enter_context(singletons[cell].hold("measured"))
                    held.reserve("warm-held")
                    reserve[cell] = held.reserve
                elif path == "task":
                    reserve[cell] = functools.partial(_task_reserve, config, "measured")
                elif path == "bare-txn":
                    _create_bare_topic(config)
                    _bare_transaction(config, "measured", "warm")
                    reserve[cell] = functools.partial(_bare_transaction, config, "measured")
                else:
                    reserve[cell] = functools.partial(singletons[cell].reserve, "measured")
            samples: dict[Any, list[float]] = {cell: [] for cell in cells}
            requests: dict[Any, Counter[int]] = {cell: Counter() for cell in cells}
            order = list(cells)
            for i in range(trials):
                random.shuffle(order)
                for cell in order:
                    proxy.set_delay(cell[1] / 2000)
                    proxy.reset_counts()
                    started = time.perf_counter()
                    reservation = reserve[cell](f"k{i}")
                    samples[cell].append((time.perf_counter() - started) * 1000)
                    requests[cell].update(proxy.requests)
                    while closing:
                        client = closing.pop()
                        if hasattr(client, "close"):
                            client.close()
                    if proxy.lateness["chunks"]:
                        lateness[cell].append(proxy.lateness["mean_ms"])
                    if reservation is not None and reservation.outcome is not Outcome.RUN:
                        raise RuntimeError(f"uncontended reserve answered "
                                           f"{reservation.outcome}: {reservation.reason}")
            holds.close()
            for singleton in singletons.values():
                singleton.close()
        finally:
            holds.close()
            kafka.stop()
    result: dict[str, Any] = {"profile": profile, "paths": {}}
    for path in paths:
        rows = {}
        for rtt in rtts:
            cell = (path, rtt)
            per = {KAFKA_API_NAMES.get(k, str(k)): round(v / trials, 1)
                   for k, v in sorted(requests[cell].items())}
            rows[str(rtt)] = {
                "rtt_ms": rtt, "trials": trials,
                "p50_ms": round(statistics.median(samples[cell]), 1),
                "p99_ms": round(percentile(samples[cell], 0.99), 1),
                "min_ms": round(min(samples[cell]), 1),
                "goal_ms": GOAL_ROUND_TRIPS * rtt + GOAL_EXTRA_MS,
                "requests_per_reserve": round(sum(requests[cell].values()) / trials, 1),
                "proxy_late_ms": (round(statistics.fmean(lateness[cell]), 3)
                                  if lateness[cell] else 0.0),
                "requests_by_api": per,
                "samples_ms": [round(s, 1) for s in samples[cell]],
            }
        slope, intercept = _slope([(rtt, rows[str(rtt)]["p50_ms"]) for rtt in rtts])
        result["paths"][path] = {"rows": rows, "round_trips": round(slope, 2),
                                 "intercept_ms": round(intercept, 1)}
    return result


def table(result: dict[str, Any], command: str, load: str) -> str:
    lines = [
        "# Claim latency across regions",
        "",
        f"`{command}`; profile `{result['profile']}`; load average {load} on "
        f"{os.cpu_count()} cores. The deployment reaches the broker through a delaying TCP "
        "proxy (half the round trip each way). Paths: `held` reserves through "
        "`Singleton.hold` (the member stays in the role's group; ledger clients kept); "
        "`kept` is a one-off `Singleton.reserve` (join, lead, claim, leave) that resumes the "
        "role's producer and the replay consumer's assignment from the last claim; `fresh` "
        "is the same creating and fencing a new producer for every claim "
        "(`KafkaLedgerConfig.keep_clients=False`, the path before); `task` makes a new "
        "`Singleton` for every reserve, nothing kept, as a gate's task process does. "
        "`bare-txn` is no claim but the reference floor of a process of its own: a new "
        "transactional producer's `init_transactions` and one transaction of one record, "
        "without group, replay or decision.",
        "",
        "| path | round trip ms | trials | reserve p50 ms | p99 ms | min ms |"
        " goal ms (4 round trips + 20) | p50 within goal | requests per reserve |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for path, measured in result["paths"].items():
        for row in measured["rows"].values():
            within = "yes" if row["p50_ms"] <= row["goal_ms"] else "no"
            lines.append(f"| {path} | {row['rtt_ms']:g} | {row['trials']} | {row['p50_ms']} | "
                         f"{row['p99_ms']} | {row['min_ms']} | {row['goal_ms']:g} | {within} | "
                         f"{row['requests_per_reserve']} |")
    late = [row["proxy_late_ms"] for measured in result["paths"].values()
            for row in measured["rows"].values() if row["rtt_ms"]]
    if late:
        lines += ["", f"The proxy delivered each delayed chunk {statistics.fmean(late):.2f} ms "
                  f"after its due time on average (at most {max(late):.2f} ms, mean of a "
                  "reserve's chunks); that is in the numbers above."]
    lines += ["", "Round trips on the critical path (slope of p50 against the round trip); the "
              "goal is at most 4 round trips + 20 ms:", ""]
    for path, measured in result["paths"].items():
        lines.append(f"- `{path}`: **{measured['round_trips']}**, intercept "
                     f"{measured['intercept_ms']} ms")
    for path, measured in result["paths"].items():
        first = next(iter(measured["rows"].values()))
        lines += [
            "",
            f"Requests per reserve by API, `{path}`, at {first['rtt_ms']:g} ms (all clients, "
            "background heartbeats and fetches included): "
            + ", ".join(f"{k} {v}" for k, v in first["requests_by_api"].items()) + ".",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--rtt", type=float, action="append",
                        help="round trip in ms (repeatable; default 0, 30, 60, 120)")
    parser.add_argument("--profile", default="default", help="timing profile (default: default)")
    parser.add_argument("--path", choices=sorted(PATHS), action="append",
                        help="paths to measure (repeatable; default: all of them,"
                             " side by side)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rtts = args.rtt or [0.0, 30.0, 60.0, 120.0]
    result = run(rtts, args.trials, args.profile, args.path)
    load = f"{os.getloadavg()[0]:.1f}"
    result.update(machine=platform.machine(), cores=os.cpu_count(), load_average=load)
    command = "python integration/bench/latency.py " + " ".join(argv or sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latency.json").write_text(json.dumps(result, indent=2))
    text = table(result, command.strip(), load)
    (args.out / "latency.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
