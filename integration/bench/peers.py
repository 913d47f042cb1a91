"""Leader election side by side: this project against the lock services users would pick instead.

Usage::

    python integration/bench/peers.py                     # everything, default trial counts
    python integration/bench/peers.py --trials 9 --crash-trials 5
    python integration/bench/peers.py --peers zk,etcd,neli-consumer-fast --skip-build
    python integration/bench/peers.py --trials 0 --crash-trials 0 --netcut-trials 3 --out /tmp/x

One command starts every service on loopback, in temporary directories, and stops it again
(with the net-cut scenario on :data:`~integration.regions.netns.BROKER_ADDRESS`, a second
address of the loopback device, which members inside a network namespace reach too):

- Kafka 4.1 (``neli_orchestrate.testing.LocalKafka``), shared by this project and goNELI;
- ZooKeeper (Debian ``zookeeper``, ``tickTime`` 500 ms) with kazoo's ``Election`` recipe;
- etcd (Debian ``etcd-server``) with its v3 election API, through etcd's HTTP/JSON gateway;
- PostgreSQL (Debian) with a lease table plus LISTEN/NOTIFY, and with an advisory lock;
- goNELI, fetched through the Go module proxy into a cache outside this repository and built
  against the driver in ``integration/bench/goneli/main.go``.

Every contender runs in its own process (``peer_members.py``, or the goNELI driver) with the
same 3 s timeout where the knob exists (ZooKeeper session, etcd lease TTL, PostgreSQL lease,
Kafka session). Trials are interleaved: every round runs each scenario once per peer, in a
shuffled order, so that machine noise hits all peers alike. Scenarios:

- ``graceful``: the leader hands over (release / close); latency = successor's ``acquired``
  minus the leader's ``releasing``;
- ``crash``: SIGKILL to the leader; latency from the kill, and that minus the timeout;
- ``pause``: SIGSTOP to the leader until the successor leads, then SIGCONT; the fence margin
  is the successor's ``acquired`` minus the moment the old leader stopped leading by its own
  account (positive: it stopped first; negative: both led at once for that long);
- ``netcut`` (root only): both members run in network namespaces of their own, joined to the
  host by veth pairs (``integration.regions.netns``); the leader's link goes down until the
  successor leads, then up again. The leader keeps running, so the margin is measured as in
  ``pause``, from what the cut leader itself reports (every member's own "stopped leading");
- ``idle``: CPU of a settled follower over a window, as % of one core (``/proc/<pid>/stat``);
- ``start``: construction to contending, inside each member process.

Writes ``integration/bench/results/peers.json``, ``peers.md`` and ``peers.png`` (``--out``
elsewhere).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from integration.regions.netns import Netns

HERE = Path(__file__).resolve().parent
# the repository root: integration.regions (network namespaces) is not installed with the package
sys.path.insert(0, str(HERE.parents[1]))
RESULTS = HERE / "results"
MEMBER = HERE / "peer_members.py"
GONELI_DRIVER = HERE / "goneli" / "main.go"
GONELI_VERSION = "v0.4.3"   # the newest goNELI release the Go module proxy serves
TIMEOUT = 3.0               # the one timeout every peer gets (session, lease TTL)
DEADLINE = 60.0
ZK_TICK_MS = 500
PG_BIN = Path("/usr/lib/postgresql/15/bin")
NETNS_NET = "10.213.0.0/16"   # integration.regions.netns puts every namespace in here
#: the bench's namespaces: indexes above the chaos suite's regions (1, 2, 3), so that both can
#: run on one host without sharing a veth subnet
NETNS_INDEXES = (201, 202)
CACHE = Path(os.environ.get("NELI_BENCH_CACHE", Path.home() / ".cache" / "neli-orchestrate"))


# -- processes -----------------------------------------------------------------------------------

@dataclass
class Member:
    """A contender process and the JSON lines it has printed so far."""

    name: str
    proc: subprocess.Popen[bytes]
    netns: Netns | None = None    # the namespace it runs in (netcut trials), else the host's
    lines: list[dict[str, Any]] = field(default_factory=list)
    killed: bool = False

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.lines.append(json.loads(raw))

    def last(self, kind: str) -> dict[str, Any] | None:
        found = [x for x in list(self.lines) if x["kind"] == kind]
        return found[-1] if found else None

    def count(self, kind: str) -> int:
        return sum(1 for x in list(self.lines) if x["kind"] == kind)

    def new(self, kind: str, before: int) -> dict[str, Any] | None:
        """The first ``kind`` line after the first ``before`` of them, if printed yet."""
        found = [x for x in list(self.lines) if x["kind"] == kind]
        return found[before] if len(found) > before else None

    def leading(self) -> bool:
        state = False
        for x in list(self.lines):
            if x["kind"] == "acquired":
                state = True
            elif x["kind"] in ("revoked", "fenced", "releasing"):
                state = False
        return state and not self.killed

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(f"{line}\n".encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass

    def signal(self, sig: int) -> float:
        at = time.time()
        self.proc.send_signal(sig)
        return at

    def kill(self) -> float:
        self.killed = True
        at = self.signal(signal.SIGKILL)
        self.proc.wait(30)
        return at

    def cpu_seconds(self) -> float:
        fields_ = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields_[11]) + int(fields_[12])) / ticks   # utime + stime

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
                self.proc.kill()
            self.proc.wait(30)


def wait_for(what: str, condition: Callable[[], Any], timeout: float = DEADLINE) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.002)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


def free_port() -> int:
    from neli_orchestrate.testing.local_kafka import free_port as port

    return port()


# -- services ------------------------------------------------------------------------------------

class Services:
    """Every server the peers need, on loopback, in one temporary directory."""

    def __init__(self, tmp: Path, wanted: set[str], build_goneli: bool,
                 bootstrap: str | None = None, host: str = "127.0.0.1") -> None:
        self.tmp = tmp
        self.host = host      # the address every server listens on and clients dial
        self.wanted = wanted
        self.build_goneli = build_goneli
        self.kafka: Any = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self.versions: dict[str, str] = {}
        self.bootstrap = bootstrap or ""
        self.zk_hosts = ""
        self.etcd_endpoint = ""
        self.pg_dsn = ""
        self.goneli_binary: Path | None = None

    def start(self) -> Services:
        kinds = {p.split("-")[0] for p in self.wanted}
        if kinds & {"neli", "goneli"}:
            self._kafka()
        if "goneli" in kinds:
            self._goneli()
        if "zk" in kinds:
            self._zookeeper()
        if "etcd" in kinds:
            self._etcd()
        if "pg" in kinds:
            self._postgres()
        return self

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
        if self.pg_dsn:
            subprocess.run(["runuser", "-u", "postgres", "--", str(PG_BIN / "pg_ctl"), "-D",
                            str(self.tmp / "pg"), "-m", "immediate", "stop"],
                           capture_output=True, check=False)
        if self.kafka is not None:
            self.kafka.stop()

    def _spawn(self, name: str, cmd: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - lives with the process
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, **kwargs)
        self.procs.append(proc)
        return proc

    def _kafka(self) -> None:
        from neli_orchestrate.testing import LocalKafka
        from neli_orchestrate.testing.local_kafka import KAFKA_VERSION

        if not self.bootstrap:
            if self.host == "127.0.0.1":
                kafka = LocalKafka()
            else:
                # the chaos suite's broker for regions in namespaces: clients' listener on
                # BROKER_ADDRESS, controller on loopback
                from integration.regions.netns import host_kafka
                kafka = host_kafka()
            # a generous deadline: the JVM starts slowly on a busy two-core machine
            self.kafka = kafka.start(timeout=300)
            self.bootstrap = self.kafka.bootstrap_servers
        self.versions["kafka"] = KAFKA_VERSION
        import confluent_kafka

        self.versions["confluent-kafka / librdkafka"] = (
            f"{confluent_kafka.version()[0]} / {confluent_kafka.libversion()[0]}")

    def _zookeeper(self) -> None:
        port = free_port()
        data = self.tmp / "zk"
        data.mkdir()
        cfg = self.tmp / "zoo.cfg"
        cfg.write_text(f"tickTime={ZK_TICK_MS}\ndataDir={data}\nclientPort={port}\n"
                       f"clientPortAddress={self.host}\nadmin.enableServer=false\n"
                       f"4lw.commands.whitelist=ruok,srvr\n")
        self._spawn("zookeeper", ["java", "-Xmx256m", "-cp",
                                  "/usr/share/java/zookeeper.jar:/etc/zookeeper/conf",
                                  "org.apache.zookeeper.server.ZooKeeperServerMain", str(cfg)])
        self.zk_hosts = f"{self.host}:{port}"

        def ready() -> str | None:
            import socket

            with contextlib.suppress(OSError), \
                    socket.create_connection((self.host, port), timeout=1) as s:
                s.sendall(b"srvr")
                answer = s.recv(4096).decode(errors="replace")
                return answer if "Zookeeper version" in answer else None
            return None

        answer = wait_for("ZooKeeper", ready, 90)
        self.versions["zookeeper"] = answer.splitlines()[0].split(":", 1)[1].split(",")[0].strip()

    def _etcd(self) -> None:
        client, peer = free_port(), free_port()
        self._spawn("etcd", [
            "etcd", "--data-dir", str(self.tmp / "etcd"), "--name", "bench",
            "--listen-client-urls", f"http://{self.host}:{client}",
            "--advertise-client-urls", f"http://{self.host}:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"bench=http://127.0.0.1:{peer}",
        ])
        self.etcd_endpoint = f"{self.host}:{client}"

        def ready() -> str | None:
            import urllib.request

            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://{self.host}:{client}/version",
                                            timeout=1) as r:
                    return str(json.loads(r.read())["etcdserver"])
            return None

        self.versions["etcd"] = wait_for("etcd", ready, 60)

    def _postgres(self) -> None:
        data = self.tmp / "pg"
        sock = self.tmp / "pgsock"
        sock.mkdir()
        shutil.chown(self.tmp, "postgres")
        shutil.chown(sock, "postgres")
        as_pg = ["runuser", "-u", "postgres", "--"]
        subprocess.run([*as_pg, str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U",
                        "postgres"], check=True, capture_output=True)
        if self.host != "127.0.0.1":
            # initdb's trust rules cover loopback only: let members in namespaces in too
            with (data / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {self.host}/32 trust\n"
                          f"host all all {NETNS_NET} trust\n")
        port = free_port()
        subprocess.run([*as_pg, str(PG_BIN / "pg_ctl"), "-D", str(data), "-w", "-l",
                        str(self.tmp / "postgres.log"), "-o",
                        f"-p {port} -k {sock} -c listen_addresses={self.host} -c fsync=off",
                        "start"], check=True, capture_output=True)
        self.pg_dsn = f"host={self.host} port={port} user=postgres dbname=postgres"
        import psycopg

        with psycopg.connect(self.pg_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE neli_lease (name text PRIMARY KEY, holder text NOT NULL,"
                         " expires_at timestamptz NOT NULL)")
            row = conn.execute("SHOW server_version").fetchone()
            self.versions["postgresql"] = str(row[0]) if row else "?"

    def _goneli(self) -> None:
        """Fetch goNELI through the Go module proxy and build the driver (cached, not in git)."""
        out = CACHE / "goneli" / GONELI_VERSION
        binary = out / "goneli-member"
        source = GONELI_DRIVER.read_bytes()
        if binary.exists() and (out / "main.go").exists() \
                and (out / "main.go").read_bytes() == source:
            self.goneli_binary = binary
        elif not self.build_goneli:
            raise RuntimeError(f"goNELI driver not built at {binary}; run without --skip-build")
        else:
            out.mkdir(parents=True, exist_ok=True)
            (out / "main.go").write_bytes(source)
            go = shutil.which("go") or "/usr/local/go/bin/go"
            env = {**os.environ, "GOMODCACHE": str(CACHE / "go" / "mod"),
                   "GOCACHE": str(CACHE / "go" / "build"), "GOFLAGS": "-mod=mod"}
            if not (out / "go.mod").exists():
                subprocess.run([go, "mod", "init", "goneli-member"], cwd=out, env=env,
                               check=True, capture_output=True)
            for cmd in ([go, "get", f"github.com/obsidiandynamics/goneli@{GONELI_VERSION}"],
                        [go, "build", "-o", str(binary), "."]):
                done = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
            self.goneli_binary = binary
        self.versions["goneli"] = GONELI_VERSION


# -- peers ---------------------------------------------------------------------------------------

class Peer:
    """How to start a contender of one kind; one election (role) per peer."""

    settle = 0.3   # after "ready": let the follower finish joining before a trial

    def __init__(self, key: str, services: Services, tmp: Path) -> None:
        self.key = key
        self.services = services
        self.tmp = tmp
        self.count = 0
        self.tag = uuid.uuid4().hex[:8]

    def command(self, name: str) -> list[str]:
        raise NotImplementedError

    def spawn(self, netns: Netns | None = None) -> Member:
        self.count += 1
        name = f"{self.key}-{self.count}"
        err = open(self.tmp / f"{name}.stderr", "wb")  # noqa: SIM115
        # `ip netns exec` execs the command: the pid is the member's (signals, CPU)
        inside = ["ip", "netns", "exec", netns.name] if netns is not None else []
        proc = subprocess.Popen([*inside, *self.command(name)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        return Member(name, proc, netns)

    def _python(self, kind: str, settings: dict[str, Any]) -> list[str]:
        return [sys.executable, str(MEMBER), kind, json.dumps(settings)]


class NeliPeer(Peer):
    def __init__(self, key: str, services: Services, tmp: Path) -> None:
        super().__init__(key, services, tmp)
        _, self.protocol, self.profile, *rest = key.split("-")
        self.hints = "nohint" not in rest
        # librdkafka rejoins a classic group at most once a second: let a new follower settle
        self.settle = 1.5 if self.protocol == "classic" else 0.8

    def command(self, name: str) -> list[str]:
        return self._python("neli", {
            "bootstrap_servers": self.services.bootstrap, "group_id": f"bench.{self.tag}",
            "group_protocol": self.protocol, "profile": self.profile,
            "session_timeout": TIMEOUT, "name": name, "release_hints": self.hints})


class GoNeliPeer(Peer):
    settle = 1.5

    def __init__(self, key: str, services: Services, tmp: Path) -> None:
        super().__init__(key, services, tmp)
        self.group = f"goneli.{self.tag}"
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": services.bootstrap})
        admin.create_topics([NewTopic(f"{self.group}.neli", 1, 1)])[
            f"{self.group}.neli"].result(30)

    def command(self, name: str) -> list[str]:
        assert self.services.goneli_binary is not None
        return [str(self.services.goneli_binary), json.dumps({
            "bootstrap": self.services.bootstrap, "group": self.group,
            "topic": f"{self.group}.neli", "name": name,
            # goNELI sets session.timeout.ms = 3 x HeartbeatTimeout
            "heartbeat_timeout_s": TIMEOUT / 3, "group_heartbeat_ms": int(TIMEOUT * 1000 / 3)})]


class ZkPeer(Peer):
    def command(self, name: str) -> list[str]:
        return self._python("zk", {"hosts": self.services.zk_hosts, "name": name,
                                   "path": f"/bench/{self.tag}", "session_timeout": TIMEOUT})


class EtcdPeer(Peer):
    def command(self, name: str) -> list[str]:
        return self._python("etcd", {"endpoint": self.services.etcd_endpoint, "name": name,
                                     "election": f"bench/{self.tag}", "ttl": int(TIMEOUT)})


class PgLeasePeer(Peer):
    def command(self, name: str) -> list[str]:
        return self._python("pg-lease", {"dsn": self.services.pg_dsn, "name": name,
                                         "lease": self.tag, "ttl": TIMEOUT})


class PgAdvisoryPeer(Peer):
    def __init__(self, key: str, services: Services, tmp: Path) -> None:
        super().__init__(key, services, tmp)
        self.lock_key = random.randrange(1, 2**31)

    def command(self, name: str) -> list[str]:
        return self._python("pg-advisory", {"dsn": self.services.pg_dsn, "name": name,
                                            "key": self.lock_key})


DEFAULT_PEERS = ["zk", "etcd", "pg-lease", "pg-advisory", "goneli", "neli-classic-default",
                 "neli-consumer-default", "neli-classic-fast", "neli-consumer-fast",
                 "neli-classic-default-nohint"]


def make_peer(key: str, services: Services, tmp: Path) -> Peer:
    if key.startswith("neli-"):
        return NeliPeer(key, services, tmp)
    cls: dict[str, type[Peer]] = {"zk": ZkPeer, "etcd": EtcdPeer, "pg-lease": PgLeasePeer,
                                  "pg-advisory": PgAdvisoryPeer, "goneli": GoNeliPeer}
    return cls[key](key, services, tmp)


# -- trials --------------------------------------------------------------------------------------

def fence_margin_ms(acquired: float, stopped: float | None) -> float | None:
    """The successor's "acquired" minus the moment the old leader stopped leading by its own
    account, in ms: positive, it stopped first; negative, both led for that long; ``None``, it
    never said it stopped (it still believes it leads)."""
    return None if stopped is None else round((acquired - stopped) * 1000, 2)


class Runner:
    #: how long a pause or cut may last before the trial counts as "never failed over"
    fence_cap = 3 * TIMEOUT + 5

    def __init__(self, peer: Peer, namespaces: tuple[Netns, Netns] | None = None) -> None:
        self.peer = peer
        self.namespaces = namespaces     # for netcut trials: one per member of the pair
        self.leader: Member | None = None
        self.members: list[Member] = []
        self.samples: dict[str, list[Any]] = {
            "graceful_ms": [], "crash_ms": [], "crash_over_timeout_ms": [],
            "fence_margin_ms": [], "no_failover": [],
            "netcut_margin_ms": [], "netcut_noticed_ms": [], "netcut_no_failover": [],
            "start_ms": [], "idle_cpu_pct": []}

    def spawn(self, netns: Netns | None = None) -> Member:
        member = self.peer.spawn(netns)
        self.members.append(member)
        ready = wait_for(f"{member.name} to start", lambda: member.last("ready"))
        self.samples["start_ms"].append(round(ready["start_s"] * 1000, 2))
        return member

    def pair(self, places: tuple[Netns | None, Netns | None] = (None, None)
             ) -> tuple[Member, Member]:
        """The trial's leader and a settled follower; a new leader starts in ``places[0]`` (if
        there is none), the follower in ``places[1]``."""
        if self.leader is None or self.leader.proc.poll() is not None:
            self.leader = self.spawn(places[0])
            wait_for(f"{self.leader.name} to lead", self.leader.leading)
        incumbent: Member = self.leader
        newcomer = self.spawn(places[1])
        time.sleep(self.peer.settle)
        # goNELI's eager assignor revokes on every join and may hand the role to the newcomer:
        # whoever leads once the group has settled is the leader of the trial.
        leading = wait_for(f"{self.peer.key}: one leader after a join", lambda: [
            m for m in (incumbent, newcomer) if m.leading()])
        if len(leading) != 1:
            raise RuntimeError(f"{self.peer.key}: two leaders after a join")
        if leading[0] is newcomer:
            self.leader = newcomer
            time.sleep(self.peer.settle)
            return newcomer, incumbent
        return incumbent, newcomer

    def retire(self, *members: Member) -> None:
        """End ``members`` by handing over in turn, each once it leads: a follower blocked in
        a campaign or a lock returns only then, and a killed one would stay in the group (or
        the lock's queue) until its session expires, delaying the next trial's leader."""
        for i, member in enumerate(members):
            if member.proc.poll() is None:
                if i > 0:
                    def took_over(m: Member = member) -> bool:
                        return m.leading() or m.proc.poll() is not None

                    with contextlib.suppress(TimeoutError):
                        wait_for(f"{member.name} to take over", took_over, TIMEOUT + 10)
                member.send("release")
                with contextlib.suppress(subprocess.TimeoutExpired):
                    member.proc.wait(15)
            member.stop()
        if self.leader in members:
            self.leader = None

    def graceful(self) -> None:
        leader, follower = self.pair()
        n = follower.count("acquired")
        leader.send("release")
        acquired = wait_for("the successor", lambda: follower.new("acquired", n))
        released = wait_for("the release", lambda: leader.last("releasing"))
        self.samples["graceful_ms"].append(round((acquired["t"] - released["t"]) * 1000, 2))
        with contextlib.suppress(subprocess.TimeoutExpired):
            leader.proc.wait(30)
        leader.stop()
        self.leader = follower

    def crash(self) -> None:
        leader, follower = self.pair()
        n = follower.count("acquired")
        killed = leader.kill()
        acquired = wait_for("the successor", lambda: follower.new("acquired", n), TIMEOUT + 30)
        latency = acquired["t"] - killed
        self.samples["crash_ms"].append(round(latency * 1000, 2))
        self.samples["crash_over_timeout_ms"].append(round((latency - TIMEOUT) * 1000, 2))
        self.leader = follower

    def fence_trial(self, leader: Member, follower: Member, inject: Callable[[], object],
                    undo: Callable[[], object]) -> tuple[float, float | None, float | None]:
        """Inject a fault into the leader until the successor leads (at most ``fence_cap``),
        undo it, and wait for the old leader's own "stopped leading" (it may have said so
        during the fault). Returns (fault at, successor acquired at or ``None`` if nobody took
        over, old leader stopped at or ``None`` if it never said so); Unix seconds."""
        n = follower.count("acquired")
        ended_before = leader.count("fenced") + leader.count("revoked")
        at = time.time()
        inject()
        try:
            acquired = wait_for("the successor", lambda: follower.new("acquired", n),
                                self.fence_cap)["t"]
        except TimeoutError:
            acquired = None
        finally:
            undo()
        stopped = None
        if acquired is not None:
            with contextlib.suppress(TimeoutError):
                stopped = wait_for("the old leader to notice", lambda: [
                    x for x in list(leader.lines) if x["kind"] in ("fenced", "revoked")
                ][ended_before:][:1], 15)[0]["t"]
        return at, acquired, stopped

    def pause(self) -> None:
        leader, follower = self.pair()
        at, acquired, stopped = self.fence_trial(
            leader, follower, lambda: leader.signal(signal.SIGSTOP),
            lambda: leader.signal(signal.SIGCONT))
        if acquired is None:
            # e.g. an advisory lock: the paused session still holds it, nobody takes over
            self.samples["no_failover"].append(round(time.time() - at, 2))
            follower.stop()
            return
        self.samples["fence_margin_ms"].append(fence_margin_ms(acquired, stopped))
        leader.stop()
        self.leader = follower

    def netcut(self) -> None:
        """Both members in namespaces of their own; the leader's veth link goes down until
        the successor leads. The cut leader keeps running and says itself when it stops."""
        if self.namespaces is None:
            raise RuntimeError("netcut needs network namespaces (root and `ip netns`)")
        if self.leader is not None:
            self.retire(self.leader)    # the trial's pair starts in the namespaces
        leader, follower = self.pair(self.namespaces)
        cut = leader.netns
        assert cut is not None
        try:
            at, acquired, stopped = self.fence_trial(leader, follower, cut.cut, cut.heal)
            if acquired is None:
                # e.g. an advisory lock: the server keeps the cut session (and its lock) until
                # TCP keepalive gives up, two hours by default
                self.samples["netcut_no_failover"].append(round(time.time() - at, 2))
            else:
                self.samples["netcut_margin_ms"].append(fence_margin_ms(acquired, stopped))
                self.samples["netcut_noticed_ms"].append(
                    None if stopped is None else round((stopped - at) * 1000, 2))
        finally:
            # the old leader first (healed by now), then the successor once it leads
            self.retire(leader, follower)

    def close(self) -> None:
        for member in self.members:
            member.stop()


@contextlib.contextmanager
def load_sampler(samples: list[float], every: float = 5.0) -> Iterator[None]:
    stop = threading.Event()

    def run() -> None:
        while True:
            samples.append(os.getloadavg()[0])
            if stop.wait(every):
                return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def measure_idle(runners: list[Runner], window: float) -> None:
    """Spawn a follower next to every peer's leader at once; CPU of each over the window."""
    pairs = []
    for runner in runners:
        try:
            pairs.append((runner, runner.pair()[1]))
        except Exception as exc:  # noqa: BLE001 - one peer failing must not lose the others
            print(f"{runner.peer.key}: idle measurement skipped: {exc}", flush=True)
    time.sleep(2.0)
    start = {id(f): (f.cpu_seconds(), time.monotonic()) for _, f in pairs}
    time.sleep(window)
    for runner, follower in pairs:
        cpu0, t0 = start[id(follower)]
        pct = (follower.cpu_seconds() - cpu0) / (time.monotonic() - t0) * 100
        runner.samples["idle_cpu_pct"].append(round(pct, 3))
        follower.stop()


# -- report --------------------------------------------------------------------------------------

def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def fmt(value: float | None, unit: str = "ms") -> str:
    if value is None:
        return "–"
    if unit == "%":
        return f"{value:.2f} %"
    return f"{value:.0f} ms" if abs(value) >= 100 else f"{value:.1f} ms"


def fence_summary(margins: list[float | None]) -> dict[str, Any]:
    """Margins of the trials that failed over (``None``: the old leader never said it
    stopped, which counts as not first)."""
    finite = [m for m in margins if m is not None]
    return {"min_ms": min(finite) if finite else None, "p50_ms": pct(finite, 50),
            "first": f"{sum(1 for m in finite if m >= 0)}/{len(margins)}" if margins else "–"}


def summarise(samples: dict[str, list[Any]]) -> dict[str, Any]:
    pause = fence_summary(samples["fence_margin_ms"])
    cut = fence_summary(samples.get("netcut_margin_ms", []))
    return {
        "graceful_p50_ms": pct(samples["graceful_ms"], 50),
        "graceful_p90_ms": pct(samples["graceful_ms"], 90),
        "crash_p50_ms": pct(samples["crash_ms"], 50),
        "crash_p90_ms": pct(samples["crash_ms"], 90),
        "crash_over_timeout_p50_ms": pct(samples["crash_over_timeout_ms"], 50),
        "fence_margin_min_ms": pause["min_ms"],
        "fence_margin_p50_ms": pause["p50_ms"],
        "fenced_first": pause["first"],
        "no_failover": len(samples["no_failover"]),
        "netcut_margin_min_ms": cut["min_ms"],
        "netcut_margin_p50_ms": cut["p50_ms"],
        "netcut_fenced_first": cut["first"],
        "netcut_no_failover": len(samples.get("netcut_no_failover", [])),
        "netcut_noticed_p50_ms": pct([v for v in samples.get("netcut_noticed_ms", [])
                                      if v is not None], 50),
        "idle_cpu_pct": pct(samples["idle_cpu_pct"], 50),
        "start_p50_ms": pct(samples["start_ms"], 50),
    }


LABELS = {"zk": "ZooKeeper", "etcd": "etcd", "pg-lease": "PG lease", "pg-advisory": "PG advisory",
          "goneli": "goNELI"}


def label(key: str) -> str:
    if key in LABELS:
        return LABELS[key]
    _, protocol, profile, *rest = key.split("-")
    name = "KIP-848" if protocol == "consumer" else "classic"
    return f"NELI {name} {profile}{' no hint' if rest else ''}"


def markdown(report: dict[str, Any]) -> str:
    peers = list(report["peers"])
    s = {k: report["peers"][k]["summary"] for k in peers}
    host = report["host"]
    load = host["loadavg_1min"]
    rows = [
        ("graceful hand-over p50", lambda x: fmt(x["graceful_p50_ms"])),
        ("graceful hand-over p90", lambda x: fmt(x["graceful_p90_ms"])),
        ("crash: successor after kill, p50", lambda x: fmt(x["crash_p50_ms"])),
        ("crash: successor after kill, p90", lambda x: fmt(x["crash_p90_ms"])),
        ("crash: after kill + 3 s timeout, p50", lambda x: fmt(x["crash_over_timeout_p50_ms"])),
        ("pause: old leader stopped before successor", lambda x: x["fenced_first"]
         + (f" ({x['no_failover']} never failed over)" if x["no_failover"] else "")),
        ("pause: fence margin min / p50", lambda x: f"{fmt(x['fence_margin_min_ms'])} / "
         f"{fmt(x['fence_margin_p50_ms'])}"),
    ]
    netcut = report.get("netcut_trials", 0)
    if netcut:
        rows += [
            ("net cut: old leader stopped before successor", lambda x: x["netcut_fenced_first"]
             + (f" ({x['netcut_no_failover']} never failed over)"
                if x["netcut_no_failover"] else "")),
            ("net cut: fence margin min / p50", lambda x: f"{fmt(x['netcut_margin_min_ms'])} / "
             f"{fmt(x['netcut_margin_p50_ms'])}"),
            ("net cut: old leader noticed after the cut, p50",
             lambda x: fmt(x["netcut_noticed_p50_ms"])),
        ]
    rows += [
        ("idle follower CPU (one core)", lambda x: fmt(x["idle_cpu_pct"], "%")),
        ("member start p50", lambda x: fmt(x["start_p50_ms"])),
    ]
    lines = [
        f"# Leader election side by side ({report['when']})",
        "",
        f"{host['cpus']} CPUs ({host['cpu_model']}), {host['memory_gib']} GiB, "
        f"{host['platform']}, Python {host['python']}. Load average (1 min) during the run: "
        f"min {load['min']}, mean {load['mean']}, max {load['max']} (a shared machine: "
        f"compare columns, not absolute values). Timeout {TIMEOUT:g} s everywhere "
        f"(ZooKeeper session with tickTime {ZK_TICK_MS} ms, etcd lease TTL, PostgreSQL lease, "
        f"Kafka session). Trials: {report['trials']} graceful, {report['crash_trials']} crash, "
        f"{report['crash_trials']} pause and {netcut} net cut per peer, interleaved; idle CPU "
        f"over {report['idle_window_s']:g} s."
        + (f" Net cut not run: {report['netcut_skipped']}." if report.get("netcut_skipped")
           else ""),
        "",
        "| | " + " | ".join(label(k) for k in peers) + " |",
        "|---|" + "---|" * len(peers),
    ]
    for title, cell in rows:
        lines.append(f"| {title} | " + " | ".join(cell(s[k]) for k in peers) + " |")
    lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items())
              + ".", ""]
    return "\n".join(lines)


def plot(report: dict[str, Any], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peers = list(report["peers"])
    names = [label(k) for k in peers]
    written = []
    panels = [("graceful_ms", "graceful hand-over (ms, log)", True),
              ("crash_over_timeout_ms", "crash: successor after kill + timeout (ms)", False),
              ("fence_margin_ms", "pause: fence margin (ms; < 0 = two leaders)", False),
              ("netcut_margin_ms", "net cut: fence margin (ms; < 0 = two leaders)", False),
              ("start_ms", "member start (ms, log)", True)]
    data = {key: [[v for v in report["peers"][k]["samples"].get(key, []) if v is not None]
                  for k in peers] for key, _, _ in panels}
    # a scenario the run left out (e.g. --trials 0, or no root for the net cut) gets no panel
    panels = [panel for panel in panels if any(data[panel[0]])]
    fig, axes = plt.subplots(len(panels) + 1, 1, figsize=(11, 4 * (len(panels) + 1)),
                             squeeze=False)
    axes = axes[:, 0]
    for ax, (key, title, log) in zip(axes, panels, strict=False):
        for i, values in enumerate(data[key]):
            jitter = [i + 1 + random.uniform(-0.15, 0.15) for _ in values]
            ax.scatter(jitter, values, s=14, alpha=0.7)
        ax.boxplot([d if d else [float("nan")] for d in data[key]], showfliers=False)
        ax.set_xticks(range(1, len(peers) + 1), names, rotation=20, fontsize=8)
        ax.set_title(title)
        if log:
            ax.set_yscale("log")
        if key in ("fence_margin_ms", "netcut_margin_ms"):
            ax.axhline(0, color="red", linewidth=0.8)
        ax.grid(axis="y", alpha=0.3)
    cpu = [report["peers"][k]["summary"]["idle_cpu_pct"] or 0 for k in peers]
    axes[-1].bar(names, cpu)
    axes[-1].set_title("idle follower CPU (% of one core)")
    axes[-1].tick_params(axis="x", rotation=20, labelsize=8)
    fig.tight_layout()
    path = out / "peers.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    written.append(path.name)
    return written


def host_info() -> dict[str, Any]:
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = 0.0
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem = int(Path("/proc/meminfo").read_text().split()[1]) / 1024 / 1024
    return {"platform": platform.platform(), "python": platform.python_version(),
            "cpus": os.cpu_count(), "cpu_model": model, "memory_gib": round(mem, 1)}


def open_namespaces(requested: int | None, default: int, bootstrap: str | None
                    ) -> tuple[int, tuple[Netns, Netns] | None, str]:
    """The number of net-cut trials, the two namespaces for them, and why none run.

    ``requested`` ``None`` (no ``--netcut-trials``): ``default`` trials if this process can
    create namespaces, else none, with the reason. An explicit count that cannot run is an
    error."""
    from integration.regions.netns import BROKER_ADDRESS, Netns, NetnsError, add_broker_address

    if requested == 0:
        return 0, None, "--netcut-trials 0"
    why = ""
    if os.geteuid() != 0:
        why = "needs root (it creates network namespaces with `ip netns`)"
    elif shutil.which("ip") is None:
        why = "needs iproute2's `ip`"
    elif bootstrap and not bootstrap.startswith(f"{BROKER_ADDRESS}:"):
        why = (f"--bootstrap {bootstrap} is not on {BROKER_ADDRESS}, the host address members "
               f"in a namespace reach")
    made: list[Netns] = []
    if not why:
        tag = uuid.uuid4().hex[:5]   # the veth names take the last six characters
        try:
            add_broker_address()
            for n, index in enumerate(NETNS_INDEXES, start=1):
                made.append(Netns(f"neli-peers-{tag}{n}", index).create())
        except NetnsError as exc:
            for ns in made:
                ns.delete()
            made = []
            why = str(exc)
    if why:
        if requested is not None:
            raise SystemExit(f"--netcut-trials {requested}: {why}")
        print(f"net cut: not run, {why}", flush=True)
        return 0, None, why
    print(f"net cut: members in namespaces {made[0].name}, {made[1].name}; servers on "
          f"{BROKER_ADDRESS}", flush=True)
    return (default if requested is None else requested), (made[0], made[1]), ""


def run(args: argparse.Namespace) -> dict[str, Any]:
    loads: list[float] = []
    with tempfile.TemporaryDirectory(prefix="neli-peers-") as tmp_name:
        tmp = Path(tmp_name)
        runners: list[Runner] = []
        namespaces: tuple[Netns, Netns] | None = None
        services: Services | None = None
        try:
            netcut, namespaces, skipped = open_namespaces(args.netcut_trials,
                                                          args.crash_trials, args.bootstrap)
            if namespaces:
                from integration.regions.netns import BROKER_ADDRESS
            services = Services(tmp, set(args.peers), build_goneli=not args.skip_build,
                                bootstrap=args.bootstrap,
                                host=BROKER_ADDRESS if namespaces else "127.0.0.1")
            print("starting services ...", flush=True)
            services.start()
            runners = [Runner(make_peer(k, services, tmp), namespaces) for k in args.peers]
            with load_sampler(loads):
                rounds = max(args.trials, args.crash_trials, netcut)
                for i in range(rounds):
                    plan = [("graceful", r) for r in runners] if i < args.trials else []
                    if i < args.crash_trials:
                        plan += [(s, r) for s in ("crash", "pause") for r in runners]
                    if i < netcut:
                        plan += [("netcut", r) for r in runners]
                    random.shuffle(plan)
                    for scenario, runner in plan:
                        try:
                            getattr(runner, scenario)()
                        except Exception as exc:  # noqa: BLE001 - recorded, run goes on
                            print(f"{runner.peer.key} {scenario}: FAILED: {exc}", flush=True)
                            runner.samples.setdefault("failures", []).append(
                                f"{scenario}: {exc}")
                            runner.close()
                            runner.leader = None
                    print(f"round {i + 1}/{rounds} done (load {os.getloadavg()[0]:.1f})",
                          flush=True)
                measure_idle(runners, args.idle_window)
        finally:
            for runner in runners:
                runner.close()
            if services is not None:
                services.stop()
            for ns in namespaces or ():
                ns.delete()     # after every member in it has been killed
    return {
        "benchmark": "peers",
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "host": {**host_info(), "loadavg_1min": {
            "min": round(min(loads), 1) if loads else None,
            "mean": round(sum(loads) / len(loads), 1) if loads else None,
            "max": round(max(loads), 1) if loads else None, "samples": loads}},
        "versions": services.versions,
        "timeout_s": TIMEOUT,
        "trials": args.trials,
        "crash_trials": args.crash_trials,
        "netcut_trials": netcut,
        "netcut_skipped": skipped,
        "idle_window_s": args.idle_window,
        "command": "python integration/bench/peers.py " + " ".join(sys.argv[1:]),
        "peers": {r.peer.key: {"samples": r.samples, "summary": summarise(r.samples)}
                  for r in runners},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=9, help="graceful trials per peer")
    parser.add_argument("--crash-trials", type=int, default=3,
                        help="crash and pause trials per peer (each takes the 3 s timeout)")
    parser.add_argument("--netcut-trials", type=int, default=None,
                        help="network-cut trials per peer; needs root (ip netns). Default: as "
                             "many as --crash-trials when namespaces can be made, else none")
    parser.add_argument("--idle-window", type=float, default=10.0)
    parser.add_argument("--peers", default=",".join(DEFAULT_PEERS),
                        type=lambda s: [p for p in s.split(",") if p])
    parser.add_argument("--skip-build", action="store_true",
                        help="use the goNELI driver already built in the cache")
    parser.add_argument("--bootstrap", help="use this Kafka (default: start a LocalKafka)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    # a plain `kill` must still heal and delete the namespaces and stop the servers
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    report = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peers.json").write_text(json.dumps(report, indent=1) + "\n")
    table = markdown(report)
    (args.out / "peers.md").write_text(table)
    plot(report, args.out)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
