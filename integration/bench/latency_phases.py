"""Where a reserve's round trips go: one reserve's phases, each with its time and requests.

Usage::

    python integration/bench/latency_phases.py --rtt 60 --reserves 3 [--path fresh]

The set-up of ``latency.py`` (one broker behind the delaying proxy, a deployment in another
"region"); each phase of ``Singleton.reserve`` is wrapped to record its wall time and the Kafka
requests the proxy saw meanwhile (background heartbeats and fetches of other clients too).
Prints one block per reserve; ``docs/internals/performance.md`` ("Across regions") explains the
floor from it.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from integration.regions.delay_proxy import (  # noqa: E402
    KAFKA_API_NAMES,
    DelayProxy,
    broker_behind_proxies,
)

PHASES = [  # (module, class, method, label): the steps of a reserve, in order
    ("neli_orchestrate.singleton.singleton", "Singleton", "_busy_while_preparing",
     "busy check + prepare"),
    ("neli_orchestrate.ledger.kafka", "KafkaLedger", "_ensure_ready", "ledger topic checked"),
    ("neli_orchestrate.singleton.leadership", "_Leadership", "__init__", "member created"),
    ("neli_orchestrate.singleton.leadership", "_Leadership", "acquire", "join and lead"),
    ("neli_orchestrate.ledger.kafka", "KafkaLedger", "begin", "fence (new producer)"),
    ("neli_orchestrate.ledger.kafka", "KafkaLedgerWriter", "replay", "replay"),
    ("neli_orchestrate.ledger.kafka", "KafkaLedgerWriter", "write", "commit the claim"),
    ("neli_orchestrate.singleton.leadership", "_Leadership", "close", "leave"),
]


def main(argv: list[str] | None = None) -> int:
    import importlib

    from neli_orchestrate import NeliConfig, Singleton, SingletonConfig
    from neli_orchestrate.ledger.kafka import KafkaLedger
    from neli_orchestrate.testing.local_kafka import free_port

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtt", type=float, default=60.0, help="round trip in ms")
    parser.add_argument("--reserves", type=int, default=3)
    parser.add_argument("--path", choices=["kept", "fresh", "task"], default="kept",
                        help="task: a new Singleton per reserve, as a gate's task process")
    args = parser.parse_args(argv)

    seen: dict[str, list[tuple[float, dict[str, int]]]] = collections.defaultdict(list)
    proxy_of: dict[str, DelayProxy] = {}

    def wrap(cls: Any, name: str, label: str) -> None:
        original = getattr(cls, name)

        @functools.wraps(original)
        def timed(*a: Any, **k: Any) -> Any:
            proxy = proxy_of["proxy"]
            before, started = dict(proxy.requests), time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                after = proxy.requests
                sent = {KAFKA_API_NAMES.get(api, str(api)): after[api] - before.get(api, 0)
                        for api in after if after[api] > before.get(api, 0)}
                seen[label].append(((time.perf_counter() - started) * 1000, sent))
        setattr(cls, name, timed)

    for module, cls, method, label in PHASES:
        wrap(getattr(importlib.import_module(module), cls), method, label)
    remote_port = free_port()
    with DelayProxy(("127.0.0.1", remote_port), precise=True) as proxy:
        proxy_of["proxy"] = proxy
        kafka = broker_behind_proxies({"remote": proxy.port}, {"remote": remote_port}).start()
        try:
            config = SingletonConfig(
                neli=NeliConfig(bootstrap_servers=f"127.0.0.1:{proxy.port}"),
                namespace=f"lat{uuid.uuid4().hex[:6]}", deployment="far")
            ledger = KafkaLedger(dataclasses.replace(config.ledger_config(),
                                                     keep_clients=args.path == "kept"))
            with Singleton(config, ledger=ledger) as singleton:
                proxy.set_delay(args.rtt / 2000)
                singleton.reserve("measured", "warm")
                for i in range(args.reserves):
                    seen.clear()
                    proxy.reset_counts()
                    started = time.perf_counter()
                    # task: a new Singleton per reserve, closed after the clock stops
                    with (Singleton(config) if args.path == "task"
                          else contextlib.nullcontext(singleton)) as claimant:
                        outcome = claimant.reserve("measured", f"k{i}").outcome
                        total = (time.perf_counter() - started) * 1000
                    print(f"reserve {i} ({args.path}, {args.rtt:g} ms round trip): {outcome},"
                          f" {total:.0f} ms, {sum(proxy.requests.values())} requests")
                    for label, calls in seen.items():
                        for ms, sent in calls:
                            print(f"  {label:22s} {ms:6.0f} ms  {ms / max(args.rtt, 1):5.1f}"
                                  f" round trips  {sent}")
        finally:
            kafka.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
