"""The region-loss chaos scenario (issue #31): three regions in three network namespaces, each
holding a Kafka node (a combined KRaft broker + controller) and a deployment, with 30-60 ms of
round trip with jitter on every link, and faults that hit a whole region.

Usage::

    python -m integration.chaos.region_loss --trials 10 --fault all
    python -m integration.chaos.region_loss --fault region --broken orphan-job   # must FAIL

The world (started once per invocation, root needed for ``ip netns``): namespaces
``<prefix>1..3``, each joined to the host by a veth pair (``integration/regions/netns.py``,
addresses ``10.213.31-33.2``). Node ``i`` runs inside namespace ``i`` with Kafka's default
broker settings (``LocalKafkaCluster``'s ``CLUSTER_PROPERTIES``: RF 3, min ISR 2, a dead broker
fenced after 9 s, six offsets and transaction-state partitions) and listens on the namespace's
own address only. Every connection to it, client, inter-broker and controller quorum, from any
namespace and from the host, goes through a delaying TCP proxy on the host end of its veth
(``integration/regions/delay_proxy.py``: 15 ms plus up to 15 ms of jitter each way, so a round
trip costs 30-60 ms): the node advertises the proxy's address and the controller quorum's
voters are the proxies. This kernel has no netem; the proxy is the network.

A region's deployment is ``neli-orchestrate run --role job --run-key K -- JOB`` started in its
namespace (``ip netns exec``), JOB a process that logs its start and works for ``--job-seconds``.
The issue asks for an Airflow region per namespace; three Kafka JVMs and three Airflow regions
(api-server, scheduler, dag-processor, triggerer each) do not fit beside other work on two
cores, so the deployments are the CLI's, which claims, fences and records through the same
library as the Airflow gate (docs/internals/chaos.md says so).

Each trial, in a namespace of its own whose group and ledger transactional id hash to the
coordinators on the node that is the active controller (read from the nodes' quorum-state
files): that region's deployment starts first and runs the job; the other two start and wait
at the run; then the fault:

- ``region``: mid-job, the region's proxies become a black hole (its network is gone: no
  connection refused or closed, only silence) and every process of its namespace (``ip netns
  pids``) is killed -9: the active controller, the group and transaction coordinators, the
  deployment and its running job. After the trial the node is started again with its data and
  the coordinator partitions' preferred leaders are elected again.
- ``oneway``: mid-job, a one-way partition from that region to the next one: every byte the
  first sends to the second is dropped (its requests to the second's node, and its node's
  answers to the second's fetches), the other way keeps flowing, for ``--hold`` seconds.
- ``txn-pause``: the moment the job ends (the runner is about to commit ``COMPLETED`` in a
  ledger transaction), SIGSTOP that node (the transaction coordinator) for ``--hold`` seconds.

A surviving region's deployment whose runner fails (any exit status but 0: a crash, a fence) is
started again, at most three times a trial, as Airflow's task retry or systemd's
``Restart=on-failure`` would; every restart is in the trial's JSON and counted in the table.

A sampler reads /proc every 10 ms for every process of the work (``integration/chaos/hold.py``'s
``Sampler``); the trial's history (the ledger's committed records, one ``process`` event per
job process, the fault) goes to ``<fault>-<n>.history.jsonl`` and is checked by the history
checker (``integration/chaos/history.py``) with no allowance. A trial also fails when the run
key is not ``COMPLETED`` (lost). Measured: take-over (the fault -> the first job process of
another token) and completion (the fault -> the ``COMPLETED`` record's time). Results:
``<out>/<fault>-<n>.json``, ``summary.json``, ``summary.md``; exit 1 on any violation, loss
or error. ``--broken orphan-job`` spares the job process from the region's kill (a job that
lives outside the region and is never fenced): the checker must report two tokens' work
alive at once.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from integration.chaos.history import check, record, write
from integration.chaos.hold import REPO, HarnessError, Sampler, percentile
from integration.regions.delay_proxy import DelayProxy
from integration.regions.netns import Netns, NetnsError

logger = logging.getLogger("integration.chaos.region_loss")

RESULTS = Path(__file__).resolve().parent / "results" / "region-loss"
FAULTS = ("region", "oneway", "txn-pause")
BROKEN = {"orphan-job": "the region's kill spares its running job (never fenced)"}
REGIONS = ("eu", "us", "ap")
#: 10.213.<index>.0/24 per namespace (the network-cut scenario uses 1-3).
INDEX = {name: 31 + i for i, name in enumerate(REGIONS)}
ROLE = "job"
#: Restarts of a failed deployment per region and trial (an orchestrator's retries).
MAX_RESTARTS = 3
#: Times a trial that could not be placed (PlacementError) is tried again before it is given up.
PLACEMENT_ATTEMPTS = 3
COORDINATOR_TOPICS = ("__consumer_offsets", "__transaction_state")
#: One way, plus a uniform jitter of up to as much again: a round trip of 30-60 ms.
ONE_WAY = 0.015
JITTER = 0.015
#: The node's ports inside its namespace (the namespace is ours alone).
CLIENT_PORT, CONTROLLER_PORT = 9092, 9093

#: JOB: ``python -c JOB LOG SECONDS``: logs ``start`` (pid, token, run key, deployment) in the
#: format hold.py's Sampler reads, works SECONDS, logs ``end`` and exits 0.
JOB = textwrap.dedent("""
    import json, os, sys, time
    log, seconds = sys.argv[1], float(sys.argv[2])
    def note(event):
        with open(log, "a") as f:
            f.write(json.dumps({"event": event, "pid": os.getpid(), "mode": "job",
                                "token": os.environ.get("NELI_TOKEN"),
                                "run_key": os.environ.get("NELI_RUN_KEY"),
                                "deployment": os.environ.get("NELI_DEPLOYMENT")}) + "\\n")
    note("start")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.02)
    note("end")
""")


# -- the world: three namespaces, a node in each, a proxy in front of every listener -----------


def _in_netns(netns: Netns, cmd: list[str]) -> list[str]:
    return ["ip", "netns", "exec", netns.name, *cmd]


def _region_cluster(netns: dict[str, Netns], proxies: dict[str, dict[str, DelayProxy]],
                    workdir: Path) -> Any:
    """A LocalKafkaCluster (not started) whose node ``i`` runs in region ``i``'s namespace,
    listens on its address and is reached, by everyone, through that region's proxies."""
    from neli_orchestrate.testing.local_kafka import (
        CLUSTER_PROPERTIES,
        LocalKafkaCluster,
        _ClusterNode,
    )

    class RegionNode(_ClusterNode):
        def __init__(self, region: str, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.region = region

        @property
        def bootstrap_servers(self) -> str:
            return _address(proxies[self.region]["client"])

        def _java_cmd(self, java: str, libs: Path, main: str) -> list[str]:
            return _in_netns(netns[self.region], super()._java_cmd(java, libs, main))

        def _write_config(self) -> None:
            super()._write_config()
            inside = netns[self.region].address
            path = self.workdir / "server.properties"
            props = dict(line.split("=", 1) for line in path.read_text().splitlines() if line)
            props["listeners"] = (f"PLAINTEXT://{inside}:{CLIENT_PORT},"
                                  f"CONTROLLER://{inside}:{CONTROLLER_PORT}")
            props["advertised.listeners"] = f"PLAINTEXT://{self.bootstrap_servers}"
            path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))

    class RegionCluster(LocalKafkaCluster):
        def __init__(self) -> None:  # the nodes' addresses are the proxies', not loopback
            self._own_workdir = False
            self.workdir = workdir
            voters = ",".join(f"{i}@{_address(proxies[r]['controller'])}"
                              for i, r in enumerate(REGIONS, 1))
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            self.nodes = {
                i: RegionNode(r, node_id=i, voters=voters, cluster_id=cluster_id,
                              controller_port=CONTROLLER_PORT, workdir=workdir / f"node{i}",
                              port=CLIENT_PORT, properties=dict(CLUSTER_PROPERTIES), heap="384m")
                for i, r in enumerate(REGIONS, 1)}

        @property
        def bootstrap_servers(self) -> str:
            return ",".join(_address(proxies[r]["client"]) for r in REGIONS)

    return RegionCluster()


def _address(proxy: DelayProxy) -> str:
    return f"{proxy.host}:{proxy.port}"


class RegionWorld:
    """Three namespaces, a delaying proxy per listener, a three-node cluster across them."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        prefix = f"nrl{os.getpid() % 100000}"
        self.netns = {r: Netns(f"{prefix}{r}", INDEX[r]) for r in REGIONS}
        self.proxies: dict[str, dict[str, DelayProxy]] = {}
        self.cluster: Any = None

    def _build(self) -> None:
        for ns in self.netns.values():
            ns.create()
        for r, ns in self.netns.items():
            self.proxies[r] = {
                kind: DelayProxy((ns.address, port), one_way=ONE_WAY, jitter=JITTER,
                                 host=f"10.213.{ns.index}.1").start()  # the host end of the veth
                for kind, port in (("client", CLIENT_PORT), ("controller", CONTROLLER_PORT))}
        self.cluster = _region_cluster(self.netns, self.proxies, self.workdir / "kafka")
        self.cluster.start(timeout=300)

    def close(self) -> None:
        """Stop first (the nodes, then by pid whatever else lives in our namespaces), then the
        network: the proxies and the namespaces."""
        if self.cluster is not None:
            self.cluster.stop()
        for region in REGIONS:
            self.kill_region(region)
        for proxy in (p for kinds in self.proxies.values() for p in kinds.values()):
            proxy.stop()
        for ns in self.netns.values():
            ns.delete()

    def __enter__(self) -> RegionWorld:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def bootstrap(self) -> str:
        return str(self.cluster.bootstrap_servers)

    def node_of(self, region: str) -> int:
        return 1 + REGIONS.index(region)

    def pids(self, region: str) -> list[int]:
        """Every process in the region's namespace (all of them started by this world)."""
        out = subprocess.run(["ip", "netns", "pids", self.netns[region].name],
                             capture_output=True, text=True, timeout=30)
        return [int(p) for p in out.stdout.split()]

    def kill_region(self, region: str, spare: Sequence[int] = ()) -> list[int]:
        killed = []
        for pid in self.pids(region):
            if pid not in spare:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
        return killed

    def active_controller(self) -> int:
        """The node id of the KRaft quorum's leader, from the nodes' quorum-state files (the
        highest epoch a node has written wins)."""
        best: tuple[int, int] | None = None
        for node in self.cluster.nodes.values():
            path = node.workdir / "data" / "__cluster_metadata-0" / "quorum-state"
            try:
                state = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            leader, epoch = state.get("leaderId", -1), state.get("leaderEpoch", -1)
            if leader >= 0 and (best is None or epoch > best[1]):
                best = (leader, epoch)
        if best is None:
            raise HarnessError("no node's quorum-state names a controller leader")
        return best[0]

    def bounce(self, node_id: int) -> None:
        """Stop a node (SIGTERM) and start it again with its data. The quorum elects another
        controller meanwhile, and the node rejoins the in-sync sets from a clean start: what
        the harness does when it cannot place a trial on the active controller."""
        logger.warning("no trial fits node %d: restarting it", node_id)
        self.cluster.nodes[node_id]._kill(30)
        self.cluster.restart(node_id, timeout=300)
        self.elect_preferred()

    def _admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "logger": logger}
        return AdminClient(conf)

    def coordinators(self) -> dict[str, dict[int, int]]:
        """Leaders of the offsets and transaction-state partitions, by partition."""
        admin = self._admin()
        found = {}
        for topic in COORDINATOR_TOPICS:
            meta = admin.list_topics(topic, timeout=30).topics[topic]
            found[topic] = {p: int(info.leader) for p, info in meta.partitions.items()}
        return found

    def elect_preferred(self) -> None:
        """Move the coordinator partitions' leadership back to their preferred replicas (what
        ``auto.leader.rebalance.enable`` does after 5 minutes) once a node is back."""
        from confluent_kafka import ElectionType, TopicPartition

        partitions = [TopicPartition(topic, p) for topic, leaders in self.coordinators().items()
                      for p in leaders]
        admin = self._admin()  # held until the answer: a dropped client fails the request
        try:
            admin.elect_leaders(ElectionType.PREFERRED, partitions).result(timeout=60)
        except Exception as exc:  # noqa: BLE001 - "election not needed" comes as an error too
            logger.info("preferred leader election: %s", exc)


def _java_hash(text: str) -> int:
    """Java's String.hashCode, as Kafka's coordinators hash group and transactional ids."""
    h = 0
    for ch in text:  # the names here are ASCII: one UTF-16 unit a character
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def _partition_for(key: str, partitions: int) -> int:
    h = _java_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


class PlacementError(HarnessError):
    """No namespace could be placed on the node to kill within pick_namespace's wait: the trial
    is not run (and not a lost run). The run then restarts that node (RegionWorld.bounce) and
    places the trial again."""


def pick_namespace(world: RegionWorld, node: int) -> tuple[str, dict[str, int]]:
    """A fresh namespace whose role group and ledger transactional id have their coordinators
    on ``node``.

    Not every leadership layout has one: a group id and its namespace's transactional id share
    their hash's parity relation (both end in the role; Java's hash keeps the parity of the
    characters' sum), so with an even partition count a node that leads partitions of one
    parity only can host none. The preferred layout (each node leads ``i`` and ``i + 3`` of six)
    always can: until a namespace fits, the preferred leaders are elected again (a node back
    from a trial leads nothing until it is in the in-sync sets again).
    """
    deadline = time.monotonic() + 180
    while True:
        leaders = world.coordinators()
        placed = _place(leaders, node)
        if placed is not None:
            return placed
        if time.monotonic() >= deadline:
            led = {topic: sorted(p for p, n in leaders[topic].items() if n == node)
                   for topic in COORDINATOR_TOPICS}
            raise PlacementError(f"no namespace fits node {node}, which leads {led}")
        world.elect_preferred()
        time.sleep(2)


def _place(leaders: dict[str, dict[int, int]], node: int) -> tuple[str, dict[str, int]] | None:
    from neli_orchestrate.core.namespace import derive

    offsets, txn = leaders["__consumer_offsets"], leaders["__transaction_state"]
    if node not in offsets.values() or node not in txn.values():
        return None
    for _ in range(2000):
        name = f"rl{uuid.uuid4().hex[:10]}"
        names = derive(name)
        g = _partition_for(names.group_id(ROLE), len(offsets))
        t = _partition_for(names.transactional_id_prefix + ROLE, len(txn))
        if offsets[g] == node and txn[t] == node:
            return name, {"group_partition": g, "txn_partition": t}
    return None


# -- a trial -------------------------------------------------------------------------------------


@dataclass
class RegionTrial:
    world: RegionWorld
    root: Path
    namespace: str
    run_key: str
    job_seconds: float
    mid: float  # seconds of the job before a mid-job fault
    sampler: Sampler
    session_timeout: float | None = None
    group_protocol: str | None = None
    runners: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    killed: set[str] = field(default_factory=set)
    restarts: list[dict[str, Any]] = field(default_factory=list)

    def start(self, region: str) -> None:
        env = {**os.environ, "NELI_DEPLOYMENT": region, "NELI_NAMESPACE": self.namespace,
               "NELI_BOOTSTRAP_SERVERS": self.world.bootstrap,
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        session = ([] if self.session_timeout is None
                   else ["--session-timeout", f"{self.session_timeout:g}"])
        if self.group_protocol is not None:
            session += ["--group-protocol", self.group_protocol]
        cmd = [sys.executable, "-m", "neli_orchestrate.cli", "-v", "run", "--role", ROLE,
               "--run-key", self.run_key, "--wait-timeout", "600", *session, "--",
               sys.executable, "-c", JOB, str(self.sampler.log), str(self.job_seconds)]
        self.runners[region] = subprocess.Popen(
            _in_netns(self.world.netns[region], cmd), env=env, text=True,
            stdout=open(self.root / f"{region}.stdout", "a"),  # noqa: SIM115
            stderr=open(self.root / f"{region}.stderr", "a"))  # noqa: SIM115

    def revive(self) -> None:
        """Start a surviving region's deployment again when its runner failed (a crash, a
        fence), as Airflow's task retry or systemd's ``Restart=on-failure`` would; at most
        MAX_RESTARTS a region, each one reported in the trial's JSON."""
        for region, proc in list(self.runners.items()):
            if region in self.killed or proc.poll() in (None, 0):
                continue
            if sum(1 for r in self.restarts if r["region"] == region) >= MAX_RESTARTS:
                continue
            self.restarts.append({"region": region, "status": proc.returncode,
                                  "at": round(time.time(), 3)})
            logger.warning("%s's runner exited with %s: starting it again", region,
                           proc.returncode)
            self.start(region)

    def wait(self, what: str, timeout: float, condition: Any, every: float = 0.02) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            time.sleep(every)
        raise HarnessError(f"timed out after {timeout:g} s waiting for {what}")

    def survivors_done(self) -> bool:
        self.revive()
        return all(proc.poll() is not None for region, proc in self.runners.items()
                   if region not in self.killed)

    def completed(self) -> list[Any] | None:
        """The ledger once it holds a COMPLETED record; None before, or while unreadable."""
        self.revive()
        try:
            records = self.ledger()
        except Exception as exc:  # noqa: BLE001 - a broker fault: read again
            logger.info("ledger not readable yet: %s", exc)
            return None
        return records if any(str(r.state) == "COMPLETED" for r in records) else None

    def ledger(self) -> list[Any]:
        from integration.regions.regions import ledger_history
        from neli_orchestrate.core.namespace import derive

        topic = derive(self.namespace).ledger_topic
        return [r for r in ledger_history(self.world.bootstrap, topic, timeout=30)
                if r.role == ROLE]

    def end(self) -> None:
        """Every runner stopped (SIGTERM, then SIGKILL), and whatever job is left, by pid."""
        for proc in self.runners.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.runners.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        for p in self.sampler.alive():
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def run_trial(world: RegionWorld, fault: str, n: int, out: Path, workdir: Path,
              broken: str | None, hold: float, job_seconds: float,
              timeout: float, session_timeout: float | None = None,
              group_protocol: str | None = None) -> dict[str, Any]:
    name = f"{fault}-{n:03d}"
    root = workdir / name
    root.mkdir(parents=True, exist_ok=True)
    began = time.time()
    error = None
    injected: dict[str, Any] = {"kind": fault}
    takeover = completed_after = None
    trial: RegionTrial | None = None
    ledger: list[Any] = []
    try:  # nothing has started yet: a trial that cannot be placed is not run
        controller = world.active_controller()
        first_region = REGIONS[controller - 1]
        namespace, placement = pick_namespace(world, controller)
    except HarnessError as exc:
        result = {"scenario": fault, "trial": n, "not_run": f"{type(exc).__name__}: {exc}",
                  "seconds": round(time.time() - began, 1)}
        (out / f"{name}.not-run-{int(began)}.json").write_text(json.dumps(result, indent=2))
        return result
    injected.update(region=first_region, node=controller, **placement)
    sampler = Sampler(root / "work.log").start()
    try:
        trial = RegionTrial(world, root, namespace, f"{name}-{uuid.uuid4().hex[:6]}",
                            job_seconds * (6 if broken else 1), job_seconds / 3, sampler,
                            session_timeout=session_timeout, group_protocol=group_protocol)
        trial.start(first_region)
        first = trial.wait(f"{first_region}'s job", timeout,
                           lambda: sampler.first(deployment=first_region))
        for region in REGIONS:
            if region != first_region:
                trial.start(region)
        at = _inject(world, trial, fault, first_region, first, broken, hold, injected)
        injected["at"] = at
        ledger = trial.wait("the run key COMPLETED", timeout + hold, trial.completed, every=1.0)
        done = next(r for r in ledger if str(r.state) == "COMPLETED")
        completed_after = round(done.at - at, 3)
        others = [p for p in sampler.seen.values() if p.token != first.token]
        if others:
            takeover = round(min(p.start for p in others) - at, 3)
        trial.wait("every surviving deployment's exit", 120, trial.survivors_done)
        injected["exit_status"] = {r: p.returncode for r, p in trial.runners.items()}
    except Exception as exc:  # noqa: BLE001 - a failed trial is a result, not a crash
        error = f"{type(exc).__name__}: {exc}"
        logger.exception("region-loss trial %s", name)
    finally:
        if trial is not None:
            trial.end()
        sampler.stop()
        _restore(world, fault, injected)
    if trial is not None and not ledger:
        try:
            ledger = trial.ledger()
        except Exception as exc:  # noqa: BLE001
            error = error or f"ledger unreadable: {exc}"
    events = record(ledger=ledger, executions=[
        SimpleNamespace(date=p.run_key, token=p.token, region=p.deployment, pid=p.pid,
                        start=p.start, end=p.end if p.end is not None else time.time())
        for p in sorted(sampler.seen.values(), key=lambda p: p.start)],
        role_of={p.run_key: ROLE for p in sampler.seen.values()},
        run_key_of=lambda key: key, paused=lambda *_: 0.0,
        faults=[SimpleNamespace(**{k: v for k, v in injected.items() if k != "exit_status"})])
    write(events, out / f"{name}.history.jsonl")
    violations = check(events, allowance=0.0)
    completed = sum(1 for r in ledger if str(r.state) == "COMPLETED")
    result = {
        "scenario": fault, "trial": n, "broken": broken, "error": error,
        "session_timeout": session_timeout, "group_protocol": group_protocol,
        "violations": violations, "completed": completed, "lost": int(completed == 0),
        "duplicates": int(completed > 1 or any("alive at once" in v for v in violations)),
        "takeover_seconds": takeover, "completed_after_seconds": completed_after,
        "tokens": sorted({p.token for p in sampler.seen.values()}),
        "job_processes": len(sampler.seen), "fault": injected,
        "restarts": trial.restarts if trial is not None else [],
        "seconds": round(time.time() - began, 1),
    }
    (out / f"{name}.json").write_text(json.dumps(result, indent=2, default=str))
    return result


def _inject(world: RegionWorld, trial: RegionTrial, fault: str, region: str, first: Any,
            broken: str | None, hold: float, injected: dict[str, Any]) -> float:
    """Inject ``fault`` on ``region`` (which leads, coordinates and runs the job); its time."""
    sampler = trial.sampler
    if fault == "txn-pause":
        trial.wait(f"{region}'s job to end", trial.job_seconds + 120,
                   lambda: f'"end", "pid": {first.pid},' in sampler.log.read_text())
        node = world.cluster.nodes[world.node_of(region)]
        at = time.time()
        os.kill(node.pid, signal.SIGSTOP)
        injected["paused_pid"] = node.pid
        time.sleep(hold)  # the fault's length, not a wait for a condition
        os.kill(node.pid, signal.SIGCONT)
        return at
    trial.wait(f"{region}'s job mid-way", 60,
               lambda: time.time() - first.start >= trial.mid)
    if first.end is not None:
        raise HarnessError(f"{region}'s job ended before the fault")
    at = time.time()
    if fault == "region":
        for proxy in world.proxies[region].values():  # the region's network goes with it
            proxy.cut()
        spare = [first.pid] if broken == "orphan-job" else []
        injected["killed_pids"] = len(world.kill_region(region, spare))
        trial.killed.add(region)
        node = world.cluster.nodes[world.node_of(region)]
        node.process.wait(30)
        node.process = None
    elif fault == "oneway":
        to = REGIONS[(REGIONS.index(region) + 1) % len(REGIONS)]
        source = world.netns[region].address
        # what ``region`` sends to ``to``'s node, and ``region``'s node's answers to ``to``
        for kind in ("client", "controller"):
            world.proxies[to][kind].drop(source, "up")
            world.proxies[region][kind].drop(world.netns[to].address, "down")
        injected["to"] = to
        time.sleep(hold)  # the partition's length
        for r in (region, to):
            for proxy in world.proxies[r].values():
                proxy.heal()
    return at


def _restore(world: RegionWorld, fault: str, injected: dict[str, Any]) -> None:
    """The world as before the trial: the region's node started again, the pause ended."""
    node_id = injected.get("node")
    if node_id is None:
        return
    node = world.cluster.nodes[node_id]
    if fault == "region":
        for proxy in world.proxies[REGIONS[node_id - 1]].values():
            proxy.heal()
        if node.process is None:
            world.cluster.restart(node_id, timeout=300)
            world.elect_preferred()
    elif fault == "txn-pause" and node.pid is not None:
        os.kill(node.pid, signal.SIGCONT)
    elif fault == "oneway":
        for kinds in world.proxies.values():
            for proxy in kinds.values():
                proxy.heal()


# -- the run -------------------------------------------------------------------------------------


def summarize(results: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    table = {}
    for fault in dict.fromkeys(r["scenario"] for r in results):
        not_run = sum(1 for r in results if r["scenario"] == fault and "not_run" in r)
        rows = [r for r in results if r["scenario"] == fault and "not_run" not in r]
        takeovers = [r["takeover_seconds"] for r in rows if r["takeover_seconds"] is not None]
        completions = [r["completed_after_seconds"] for r in rows
                       if r["completed_after_seconds"] is not None]
        table[fault] = {
            "trials": len(rows), "not_run": not_run,
            "errors": sum(1 for r in rows if r["error"]),
            "with_violations": sum(1 for r in rows if r["violations"]),
            "duplicates": sum(r["duplicates"] for r in rows),
            "lost": sum(r["lost"] for r in rows),
            "takeovers": len(takeovers),
            "restarts": sum(len(r["restarts"]) for r in rows),
            "takeover_p50": percentile(takeovers, 0.5),
            "takeover_p99": percentile(takeovers, 0.99),
            "completed_p50": percentile(completions, 0.5),
            "completed_p99": percentile(completions, 0.99),
        }
    return table


def _num(v: Any) -> str:
    return "–" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)


def _pair(row: dict[str, Any], name: str) -> str:
    return f"{_num(row[name + '_p50'])} / {_num(row[name + '_p99'])}"


#: The summary table's columns: (header, the cell of a fault's row).
_COLUMNS: tuple[tuple[str, Any], ...] = (
    *((name.replace("_", " "), lambda row, key=name: _num(row[key])) for name in (
        "trials", "not_run", "with_violations", "duplicates", "lost", "errors", "restarts",
        "takeovers")),
    ("take-over p50 / p99 (s)", lambda row: _pair(row, "takeover")),
    ("fault → COMPLETED p50 / p99 (s)", lambda row: _pair(row, "completed")),
)


def markdown(table: dict[str, dict[str, Any]]) -> str:
    lines = ["| fault | " + " | ".join(head for head, _ in _COLUMNS) + " |",
             "|---" * (len(_COLUMNS) + 1) + "|"]
    lines += [f"| {fault} | " + " | ".join(cell(row) for _, cell in _COLUMNS) + " |"
              for fault, row in table.items()]
    return "\n".join(lines)


#: Numeric options: (flag, type, default, help).
_OPTIONS: tuple[tuple[str, type, Any, str], ...] = (
    ("--trials", int, 1, "trials per fault"),
    ("--job-seconds", float, 12.0, "how long the job works"),
    ("--hold", float, 15.0, "seconds a one-way partition or a pause lasts"),
    ("--timeout", float, 180.0, "seconds for a trial's job to start and for its run to end"),
    ("--session-timeout", float, None, "the deployments' session_timeout (default: the "
     "`default` profile's 45 s; doctor's failover check gives the take-over it buys)"),
    ("--group-protocol", str, None, "the deployments' group_protocol (default `auto`)"),
)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m integration.chaos.region_loss",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fault", action="append", choices=[*FAULTS, "all"],
                        help="fault to inject (repeatable; default all)")
    for flag, kind, default, text in _OPTIONS:
        parser.add_argument(flag, type=kind, default=default, help=text)
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    parser.add_argument("--workdir", type=Path, default=None, help="kept (default: a temp dir)")
    parser.add_argument("--broken", choices=sorted(BROKEN), default=None,
                        help="a deliberately broken variant (the run must fail)")
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    if os.geteuid() != 0:
        parser.error("needs root (ip netns)")
    args.faults = [f for f in (args.fault or ["all"]) if f != "all"] or list(FAULTS)
    return args


def _report(result: dict[str, Any]) -> None:
    if "not_run" in result:
        print(f"chaos region-loss: {result['scenario']} #{result['trial']}: not run"
              f" ({result['not_run']}); placing it again", flush=True)
        return
    error = f" ERROR {result['error']}" if result["error"] else ""
    lines = [f"chaos region-loss: {result['scenario']} #{result['trial']}:"
             f" completed={result['completed']} takeover={result['takeover_seconds']} s"
             f" completed_after={result['completed_after_seconds']} s"
             f" violations={len(result['violations'])}{error}",
             *(f"  {v}" for v in result["violations"])]
    print("\n".join(lines), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    own_workdir = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="neli-chaos-region-")) if own_workdir else args.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, filename=str(workdir / "chaos.log"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = args.out / ("latest" if args.broken is None else f"broken-{args.broken}")
    shutil.rmtree(out, ignore_errors=True)  # the directory holds this invocation's trials only
    out.mkdir(parents=True)
    print(f"chaos region-loss: results in {out}, work in {workdir}", flush=True)
    results: list[dict[str, Any]] = []
    try:
        with RegionWorld(workdir) as world:
            print(f"chaos region-loss: cluster ready at {world.bootstrap}", flush=True)
            for n in range(1, args.trials + 1):  # round robin: a cut-short run covers each fault
                for fault in args.faults:
                    for _attempt in range(PLACEMENT_ATTEMPTS):
                        results.append(run_trial(world, fault, n, out, workdir, args.broken,
                                                 args.hold, args.job_seconds, args.timeout,
                                                 args.session_timeout, args.group_protocol))
                        _report(results[-1])
                        if "not_run" not in results[-1]:
                            break
                        try:
                            world.bounce(world.active_controller())
                        except Exception:  # noqa: BLE001 - the next attempt says if it helped
                            logger.exception("restarting the active controller's node")
    except NetnsError as exc:
        print(f"chaos region-loss: {exc}", file=sys.stderr)
        return 2
    table = summarize(results)
    (out / "summary.json").write_text(json.dumps({"results": table}, indent=2))
    broken = f" (BROKEN: {BROKEN[args.broken]})" if args.broken else ""
    text = f"### region-loss chaos{broken}\n\n{markdown(table)}\n"
    (out / "summary.md").write_text(text)
    ran = [r for r in results if "not_run" not in r]
    failed = sum(1 for r in ran if r["violations"] or r["error"] or r["lost"])
    failed += sum(1 for row in table.values() if row["trials"] < args.trials)
    print(f"{text}\nchaos region-loss: {len(ran)} trials ({len(results) - len(ran)} not run),"
          f" {failed} failed checks", flush=True)
    if own_workdir and not failed:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
