"""Roles at scale (issue 12, goal 5): many roles on one broker, each with two deployments.

Usage::

    python integration/bench/roles.py        # 100 roles 10/25/50/100 live, 1,000 roles 25 live
    python integration/bench/roles.py --sizes 100x100 --bootstrap 127.0.0.1:9092   # roles x live

Every role is contended by two deployments, as the example DAG's per-date roles are: role
``r`` is the group ``<namespace>.<r>`` on the shared leader topic ``<namespace>.neli``, named
by :meth:`SingletonConfig.role_neli` (the library's one derivation), each member a
:class:`~neli_orchestrate.Neli` with its own background pulser. Members are hosted by
worker processes (``--per-process`` members each, one process per deployment and slice), so
that a few hundred members fit on a small machine.

Roles are run in waves of ``live`` roles at once (a backfill, or Airflow's ``max_active_runs``,
16 by default, keeps only so many dates live); all roles of a size end up as groups on the
same broker. ``--sizes 1000x25`` means 1,000 roles, 25 live at a time. Per wave:

1. deployment A's members start and lead every role of the wave;
2. deployment B's members start and wait; once they have all joined, an idle window measures
   broker CPU and RSS, the workers' CPU per member and the leader topic's records per second;
3. ``--handovers`` roles are handed over one at a time (A's member closes; B's leads);
4. the rest of A's members close all at once (a deployment's rolling restart), and every role
   is handed over together;
5. B's members close.

Hand-over = B's ``LeaderAcquired`` minus the moment A's member was told to close (one wall
clock: the same host). Writes ``integration/bench/results/roles.json``, ``roles.md`` and
``roles.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import queue
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchlib import broker, percentile

RESULTS = Path(__file__).resolve().parent / "results"
CLIENT_LOG = logging.getLogger("bench.librdkafka")  # the driver's own clients log here
HERE = Path(__file__).resolve()


# -- worker: hosts one deployment's members for a slice of roles --------------------------------

def worker(spec: dict[str, Any]) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(created).4f %(name)s %(message)s")
    from neli_orchestrate import NeliConfig, SingletonConfig
    from neli_orchestrate.core.events import LeaderAcquired, LeaderEvent, LeaderFenced
    from neli_orchestrate.core.neli import Neli

    out = threading.Lock()

    def emit(kind: str, **fields: Any) -> None:
        with out:
            sys.stdout.write(json.dumps({"kind": kind, **fields}) + "\n")
            sys.stdout.flush()

    def wall(monotonic: float) -> float:
        return time.time() - (time.monotonic() - monotonic)

    config = SingletonConfig(
        neli=NeliConfig(bootstrap_servers=spec["bootstrap"], profile=spec["profile"],
                        group_protocol=spec["protocol"]),
        deployment=spec["deployment"], namespace=spec["namespace"])
    members: dict[str, Neli] = {}

    def barrier_for(role: str) -> Any:
        def barrier(event: LeaderEvent) -> None:
            kind = ("acquired" if isinstance(event, LeaderAcquired)
                    else "fenced" if isinstance(event, LeaderFenced) else "revoked")
            emit(kind, role=role, t=wall(event.timestamp))
        return barrier

    for role in spec["roles"]:
        begin = time.monotonic()
        neli = Neli(config.role_neli(role), barrier_for(role))
        neli.background()
        members[role] = neli
        emit("started", role=role, start_s=time.monotonic() - begin)
    emit("ready")

    def close(role: str) -> None:
        members[role].close()
        emit("closed", role=role)

    threads: list[threading.Thread] = []
    for line in sys.stdin:
        command, _, arg = line.strip().partition(" ")
        if command == "release":
            roles = arg.split(",")
            t = time.time()
            emit("releasing", roles=roles, t=t)
            for role in roles:
                thread = threading.Thread(target=close, args=(role,), daemon=True)
                thread.start()
                threads.append(thread)
        elif command == "stop":
            break
    for thread in threads:
        thread.join(timeout=30)
    rest = [r for r, n in members.items() if not n.closed]
    closers = [threading.Thread(target=close, args=(r,), daemon=True) for r in rest]
    for thread in closers:
        thread.start()
    for thread in closers:
        thread.join(timeout=30)
    emit("stopped")


# -- driver --------------------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Worker:
    """One worker process; its events go to the world's queue as (worker index, event)."""

    def __init__(self, spec: dict[str, Any], index: int,
                 events: queue.Queue[tuple[int, dict[str, Any]]]) -> None:
        self.spec = spec
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE), "--worker", json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
            env={**os.environ, "PYTHONPATH": str(HERE.parents[2])})
        self.index = index
        self.events = events
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.events.put((self.index, json.loads(line)))
        self.events.put((self.index, {"kind": "exit"}))

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()


class World:
    """All workers of one wave and every event they reported, in arrival order."""

    def __init__(self) -> None:
        self.workers: list[Worker] = []
        self.events: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue()
        self.log: list[dict[str, Any]] = []
        self.acquired: dict[tuple[str, str], float] = {}  # (deployment, role) -> first t
        self.ready: set[int] = set()
        self.releasing: dict[str, float] = {}

    def add(self, spec: dict[str, Any]) -> Worker:
        worker = Worker(spec, len(self.workers), self.events)
        self.workers.append(worker)
        return worker

    def drain(self, timeout: float) -> None:
        """Take every reported event, waiting up to ``timeout`` for the first."""
        while True:
            try:
                index, event = self.events.get(timeout=timeout)
            except queue.Empty:
                return
            timeout = 0.0
            worker = self.workers[index]
            event["deployment"] = worker.spec["deployment"]
            self.log.append(event)
            kind = event["kind"]
            if kind == "acquired":
                self.acquired.setdefault((event["deployment"], event["role"]), event["t"])
            elif kind == "ready":
                self.ready.add(index)
            elif kind == "releasing":
                for role in event["roles"]:
                    self.releasing[role] = event["t"]

    def wait(self, what: str, condition: Any, timeout: float) -> float:
        begin = time.monotonic()
        deadline = begin + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not reached within {timeout:.0f} s")
            for worker in self.workers:
                if worker.proc.poll() not in (None, 0):
                    raise RuntimeError(f"a worker of {worker.spec['deployment']} died "
                                       f"(exit {worker.proc.returncode}) while waiting for {what}")
            self.drain(0.1)
        return time.monotonic() - begin

    def stop(self) -> None:
        for worker in self.workers:
            with contextlib.suppress(OSError, ValueError):
                worker.send("stop")
        for worker in self.workers:
            try:
                worker.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                worker.proc.wait()


def slices(items: list[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def leader_topic_offsets(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "neli-bench-observer",
                         "enable.auto.commit": False, "logger": CLIENT_LOG})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        return int(high)
    finally:
        consumer.close()


def run_wave(args: argparse.Namespace, bootstrap: str, broker_pid: int | None,
             namespace: str, wave_no: int, wave_roles: list[str], roles_total: int,
             handovers: list[dict[str, Any]]) -> dict[str, Any]:
    world = World()
    base = {"bootstrap": bootstrap, "profile": args.profile, "protocol": args.protocol,
            "namespace": namespace}
    try:
        a = [world.add({**base, "deployment": "a", "roles": part})
             for part in slices(wave_roles, args.per_process)]
        led_s = world.wait(f"deployment a leads {len(wave_roles)} roles",
                           lambda: all(("a", r) in world.acquired for r in wave_roles),
                           args.timeout)
        b = [world.add({**base, "deployment": "b", "roles": part})
             for part in slices(wave_roles, args.per_process)]
        world.wait("deployment b has started every member",
                   lambda: len(world.ready) == len(world.workers), args.timeout)
        # Idle window: both deployments' members live, A leading every role.
        pids = [w.proc.pid for w in world.workers]
        from neli_orchestrate.core.namespace import derive

        topic = derive(namespace).leader_topic
        before = {pid: cpu_seconds(pid) for pid in pids}
        broker_before = cpu_seconds(broker_pid) if broker_pid else None
        records_before = leader_topic_offsets(bootstrap, topic)
        idle = args.idle_window if wave_no == 0 else min(args.idle_window, 5.0)
        t0 = time.monotonic()
        world.wait("idle window", lambda: time.monotonic() - t0 >= idle, idle + 30)
        elapsed = time.monotonic() - t0
        records = leader_topic_offsets(bootstrap, topic) - records_before
        member_cpu = sum(cpu_seconds(p) - before[p] for p in pids) / elapsed
        wave: dict[str, Any] = {
            "wave": wave_no, "roles": len(wave_roles),
            "members": 2 * len(wave_roles), "processes": len(world.workers),
            "a_leads_all_s": led_s,
            "start_s_p50": percentile([e["start_s"] for e in world.log
                                       if e["kind"] == "started"], 0.5),
            "idle_members_cpu_cores": member_cpu,
            "idle_cpu_per_member_pct": 100 * member_cpu / (2 * len(wave_roles)),
            "workers_rss_mib": sum(rss_mib(p) for p in pids),
            "leader_topic_records_per_s": records / elapsed,
            "loadavg_1min": os.getloadavg()[0],
        }
        if broker_pid:
            assert broker_before is not None
            wave["broker_cpu_cores"] = (cpu_seconds(broker_pid) - broker_before) / elapsed
            wave["broker_rss_mib"] = rss_mib(broker_pid)
        # One at a time.
        order = list(wave_roles)
        random.shuffle(order)
        singles = order[:min(args.handovers, len(order))]
        rest = order[len(singles):]
        for role in singles:
            owner = a[wave_roles.index(role) // args.per_process]
            owner.send(f"release {role}")
            world.wait(f"b leads {role}", lambda r=role: ("b", r) in world.acquired,
                       args.timeout)
            handovers.append({"roles": roles_total, "kind": "single", "role": role,
                              "s": world.acquired[("b", role)] - world.releasing[role]})
        # All the rest at once: deployment A restarts.
        if rest:
            by_worker: dict[int, list[str]] = {}
            for role in rest:
                by_worker.setdefault(wave_roles.index(role) // args.per_process,
                                     []).append(role)
            for index, part in by_worker.items():
                a[index].send("release " + ",".join(part))
            mass_s = world.wait(f"b leads the {len(rest)} released roles",
                                lambda: all(("b", r) in world.acquired for r in rest),
                                args.timeout)
            wave["mass_release_all_led_s"] = mass_s
            for role in rest:
                handovers.append({"roles": roles_total, "kind": "all-at-once",
                                  "role": role,
                                  "s": world.acquired[("b", role)] - world.releasing[role]})
        doubles = [e for e in world.log if e["kind"] == "fenced"]
        wave["fenced_events"] = len(doubles)
        if broker_pid:
            wave["broker_rss_mib_after"] = rss_mib(broker_pid)
        print(f"  {roles_total} roles, wave {wave_no + 1}: {len(wave_roles)} roles led in "
              f"{led_s:.1f} s, idle members {wave['idle_cpu_per_member_pct']:.2f} %/member,"
              f" broker {100 * wave.get('broker_cpu_cores', 0):.1f} % "
              f"(load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        world.stop()
    del b
    return wave


def run_size(args: argparse.Namespace, bootstrap: str, broker_pid: int | None,
             roles_total: int, live: int) -> dict[str, Any]:
    namespace = f"scale{uuid.uuid4().hex[:6]}"
    roles = [f"2024-{i:05d}" for i in range(roles_total)]  # one role per "date"
    live = min(live, roles_total)
    handovers: list[dict[str, Any]] = []
    waves: list[dict[str, Any]] = []
    for wave_no, wave_roles in enumerate(slices(roles, live)):
        waves.append(run_wave(args, bootstrap, broker_pid, namespace, wave_no, wave_roles,
                              roles_total, handovers))
    groups, configured = count_groups(bootstrap, namespace, roles)
    return {"roles": roles_total, "live": live, "namespace": namespace, "waves": waves,
            "handovers": handovers, "groups_on_broker": groups,
            "groups_with_dynamic_config": configured,
            "broker_rss_mib_end": rss_mib(broker_pid) if broker_pid else None}


def count_groups(bootstrap: str, namespace: str, roles: list[str]) -> tuple[int, int]:
    """(consumer groups of these roles on the broker, groups of them holding a dynamic group
    config, i.e. KIP-848 session and heartbeat settings a member wrote)."""
    from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, ResourceType

    from neli_orchestrate.core.namespace import derive

    names = derive(namespace)
    ours = {names.group_id(role) for role in roles}
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": CLIENT_LOG})
    result = admin.list_consumer_groups(request_timeout=30).result()
    groups = sorted(g.group_id for g in result.valid if g.group_id in ours)
    configured = 0
    for start in range(0, len(groups), 100):
        futures = admin.describe_configs(
            [ConfigResource(ResourceType.GROUP, g) for g in groups[start:start + 100]],
            request_timeout=30)
        for future in futures.values():
            entries = future.result()
            if any(e.source == ConfigSource.GROUP_CONFIG.value for e in entries.values()):
                configured += 1
    return len(groups), configured


def summarize(data: dict[str, Any]) -> str:
    meta = data["meta"]
    lines = [
        "# Roles at scale: two deployments per role on one broker",
        "",
        f"`{meta['command']}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(meta['when']))})",
        "",
        f"{meta['cpus']} CPUs, {meta['platform']}, Python {meta['python']}; Kafka 4.1 "
        f"`LocalKafka` (one broker, KRaft); profile `{meta['profile']}`, group protocol "
        f"`{meta['protocol']}`; load average (1 min) min {min(meta['loads']):.1f} / max "
        f"{max(meta['loads']):.1f}.",
        "",
        (f"Broker with no member: {100 * meta['broker_idle']['broker_cpu_cores']:.1f} % of a "
         f"core, RSS {meta['broker_idle']['broker_rss_mib']:.0f} MiB." if meta.get("broker_idle")
         else "Broker: an existing cluster (`--bootstrap`), not measured."),
        "",
        "| | " + " | ".join(f"{s['roles']} roles, {s['live']} live" for s in data["sizes"])
        + " |",
        "|---|" + "---|" * len(data["sizes"]),
    ]

    def row(label: str, cell: Any) -> None:
        lines.append(f"| {label} | " + " | ".join(cell(s) for s in data["sizes"]) + " |")

    def hand(kind: str, q: float) -> Any:
        def cell(s: dict[str, Any]) -> str:
            values = [h["s"] for h in s["handovers"] if h["kind"] == kind]
            return f"{1000 * percentile(values, q):.0f} ms" if values else "–"
        return cell

    def wave_max(key: str, scale: float = 1.0, fmt: str = "{:.1f}") -> Any:
        def cell(s: dict[str, Any]) -> str:
            values = [w[key] for w in s["waves"] if key in w]
            return fmt.format(scale * max(values)) if values else "–"
        return cell

    def wave_median(key: str, scale: float = 1.0, fmt: str = "{:.1f}") -> Any:
        def cell(s: dict[str, Any]) -> str:
            values = [scale * w[key] for w in s["waves"] if key in w]
            if not values:
                return "–"
            return f"{fmt.format(percentile(values, 0.5))} / {fmt.format(max(values))}"
        return cell

    row("members live at once (processes)",
        lambda s: f"{s['waves'][0]['members']} ({s['waves'][0]['processes']})")
    row("hand-over one at a time: n", lambda s: str(sum(h["kind"] == "single"
                                                        for h in s["handovers"])))
    row("hand-over one at a time: p50", hand("single", 0.5))
    row("hand-over one at a time: p99", hand("single", 0.99))
    row("hand-over all at once: n", lambda s: str(sum(h["kind"] == "all-at-once"
                                                      for h in s["handovers"])))
    row("hand-over all at once: p50", hand("all-at-once", 0.5))
    row("hand-over all at once: p99", hand("all-at-once", 0.99))
    row("hand-over all at once: max", hand("all-at-once", 1.0))
    row("all live roles led by A after start (max over waves)", wave_max("a_leads_all_s",
                                                                          fmt="{:.1f} s"))
    row("waves", lambda s: str(len(s["waves"])))
    row("broker CPU, idle window, % of a core (median / max over waves)",
        wave_median("broker_cpu_cores", 100))
    row("broker RSS (max over waves)", wave_max("broker_rss_mib", fmt="{:.0f} MiB"))
    row("broker RSS at the end", lambda s: f"{s['broker_rss_mib_end']:.0f} MiB"
        if s["broker_rss_mib_end"] else "–")
    row("member CPU, idle, % of a core per member (median / max over waves)",
        wave_median("idle_cpu_per_member_pct", fmt="{:.2f}"))
    row("leader-topic records/s, idle (median / max over waves)",
        wave_median("leader_topic_records_per_s", fmt="{:.0f}"))
    row("consumer groups of the namespace on the broker", lambda s: str(s["groups_on_broker"]))
    row("of them with a dynamic group config (KIP-848 session, heartbeat)",
        lambda s: str(s.get("groups_with_dynamic_config", "–")))
    row("topics / partitions added per role", lambda s: "0 / 0")
    row("fenced events", lambda s: str(sum(w["fenced_events"] for w in s["waves"])))
    return "\n".join(lines) + "\n"


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4.5))
    for size in data["sizes"]:
        for kind, style in (("single", "-"), ("all-at-once", "--")):
            values = sorted(1000 * h["s"] for h in size["handovers"] if h["kind"] == kind)
            if values:
                ys = [(i + 1) / len(values) for i in range(len(values))]
                ax.step(values, ys, style, where="post",
                        label=f"{size['roles']} roles, {size['live']} live, {kind} "
                              f"(n={len(values)})")
    ax.set_xscale("log")
    ax.set_xlabel("graceful hand-over, ms (log)")
    ax.set_ylabel("fraction of hand-overs")
    ax.axvline(1000, color="grey", lw=0.8)
    ax.set_title("Hand-over with many roles on one broker (two deployments per role)")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))  # beside the curves
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default="100x10,100x25,100x50,100x100,1000x25",
                        help="ROLESxLIVE, comma-separated: roles in all, and live at once")
    parser.add_argument("--per-process", type=int, default=25, help="members per worker")
    parser.add_argument("--handovers", type=int, default=20,
                        help="roles per wave handed over one at a time (the rest at once)")
    parser.add_argument("--idle-window", type=float, default=15.0)
    parser.add_argument("--profile", default="default", choices=("default", "fast"))
    parser.add_argument("--protocol", default="auto", choices=("auto", "classic", "consumer"))
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--bootstrap", help="existing cluster (default: start a LocalKafka)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--render", action="store_true",
                        help="only rewrite roles.md and roles.png from --out's roles.json")
    args = parser.parse_args()
    if args.render:
        data = json.loads((args.out / "roles.json").read_text())
        (args.out / "roles.md").write_text(summarize(data))
        plot(data, args.out / "roles.png")
        print(summarize(data))
        return
    if args.worker:
        worker(json.loads(args.worker))
        return
    sizes = [tuple(int(n) for n in x.split("x")) for x in args.sizes.split(",")]
    loads = [os.getloadavg()[0]]
    baseline = None
    with broker(args.bootstrap) as (bootstrap, broker_pid):
        # A fresh JVM spends its first minute compiling: the first wave measured 3-4x the broker
        # CPU of the same wave repeated. Warm it up with a wave that is not recorded.
        print("warming the broker up (not recorded) ...", flush=True)
        run_size(args, bootstrap, broker_pid, 10, 10)
        if broker_pid:
            before, t0 = cpu_seconds(broker_pid), time.monotonic()
            time.sleep(args.idle_window)  # a measurement window: nothing else runs
            baseline = {"broker_cpu_cores": (cpu_seconds(broker_pid) - before)
                        / (time.monotonic() - t0), "broker_rss_mib": rss_mib(broker_pid)}
        results = []
        for roles_total, live in sizes:
            print(f"{roles_total} roles, {min(live, roles_total)} live at once ...", flush=True)
            results.append(run_size(args, bootstrap, broker_pid, roles_total, live))
            loads.append(os.getloadavg()[0])
    data = {"meta": {"command": "python integration/bench/roles.py " + " ".join(sys.argv[1:]),
                     "when": time.time(), "platform": platform.platform(),
                     "python": platform.python_version(), "cpus": os.cpu_count(),
                     "profile": args.profile, "protocol": args.protocol, "loads": loads,
                     "broker_idle": baseline},
            "sizes": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "roles.json").write_text(json.dumps(data, indent=1))
    table = summarize(data)
    (args.out / "roles.md").write_text(table)
    plot(data, args.out / "roles.png")
    print(table)


if __name__ == "__main__":
    main()
