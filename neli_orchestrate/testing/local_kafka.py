"""Run a real single-node Apache Kafka broker (KRaft) on loopback, for tests and local work.

Usage::

    with LocalKafka() as kafka:
        producer = confluent_kafka.Producer({"bootstrap.servers": kafka.bootstrap_servers})
        ...

The broker's jars come from ``$KAFKA_HOME/libs`` when ``KAFKA_HOME`` points at a Kafka
distribution, otherwise they are assembled once from Maven Central with ``mvn`` into
``~/.cache/neli-orchestrate/kafka-<version>/libs`` (``NELI_KAFKA_CACHE`` moves the cache).

.. note:: The broker is tuned for fast, honest tests (no initial rebalance delay, sub-second
   session timeouts allowed, replication factor 1). It is not a production configuration.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import ctypes
import fcntl
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from neli_orchestrate.errors import NeliError

log = logging.getLogger(__name__)

KAFKA_VERSION = "4.1.1"

#: Broker settings that make groups and transactions fast on one node. Tests rely on them.
FAST_TEST_PROPERTIES: Mapping[str, str] = {
    "group.initial.rebalance.delay.ms": "0",
    # the group coordinator batches its writes for 5 ms by default: every hand-over pays it
    "group.coordinator.append.linger.ms": "0",
    # classic protocol: allow sub-second sessions
    "group.min.session.timeout.ms": "100",
    # KIP-848 (group.protocol=consumer): session and heartbeat are broker/group settings;
    # the minimums are lowered together so groups may ask for short intervals.
    "group.consumer.min.session.timeout.ms": "100",
    "group.consumer.min.heartbeat.interval.ms": "50",
    "group.consumer.session.timeout.ms": "3000",
    "group.consumer.heartbeat.interval.ms": "250",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "auto.create.topics.enable": "false",
    "num.partitions": "1",
    "num.network.threads": "2",
    "num.io.threads": "4",
    # let compaction tests see results without waiting minutes
    "log.cleaner.backoff.ms": "1000",
}


class _Demoted(logging.LoggerAdapter):  # type: ignore[type-arg]
    """librdkafka logger for the readiness probes: refused connections and coordinator-loading
    retries are expected while the broker starts, so every line is logged at DEBUG."""

    def log(self, level: int, msg: object, *args: object, **kwargs: object) -> None:
        self.logger.debug(msg, *args)


_probe_log = _Demoted(logging.getLogger(__name__ + ".probe"), {})


class LocalKafkaError(NeliError):
    """The local broker could not be obtained or started; the message carries the log tail."""


def kafka_cache_dir(version: str = KAFKA_VERSION) -> Path:
    """Return the directory that holds (or will hold) the broker jars for ``version``."""
    root = os.environ.get("NELI_KAFKA_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "neli-orchestrate"
    return base / f"kafka-{version}"


def _resource(name: str) -> Path:
    return Path(str(resources.files("neli_orchestrate.testing") / "kafka" / name))


def ensure_kafka_libs(version: str = KAFKA_VERSION, *, timeout: float = 600.0) -> Path:
    """Return a directory of Kafka broker jars, fetching them with Maven on first use.

    Uses ``$KAFKA_HOME/libs`` when ``KAFKA_HOME`` is set. Safe to call from several
    processes at once: the fetch holds a file lock and publishes the jars with a rename.
    """
    home = os.environ.get("KAFKA_HOME")
    if home:
        libs = Path(home) / "libs"
        if not any(libs.glob("kafka_2.*.jar")):
            raise LocalKafkaError(
                f"KAFKA_HOME={home} is not a Kafka distribution: no kafka_2.*.jar in {libs}"
            )
        return libs
    cache = kafka_cache_dir(version)
    libs = cache / "libs"
    if (libs / ".complete").exists():
        return libs
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (libs / ".complete").exists():
            return libs
        mvn = shutil.which("mvn")
        if mvn is None:
            raise LocalKafkaError(
                "Kafka is not available: set KAFKA_HOME to a Kafka 4.x distribution, or install "
                "Maven (`mvn`) so the broker can be assembled from Maven Central"
            )
        staging = Path(tempfile.mkdtemp(prefix="libs-", dir=cache))
        cmd = [
            mvn, "-q", "-B", "-f", str(_resource("pom.xml")),
            f"-Dkafka.version={version}", "dependency:copy-dependencies",
            "-DincludeScope=runtime", f"-DoutputDirectory={staging}",
        ]
        log.info("fetching Kafka %s jars with Maven into %s", version, libs)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise LocalKafkaError(f"Maven did not fetch Kafka within {timeout:.0f} s") from exc
        if proc.returncode != 0 or not any(staging.glob("kafka_2.*.jar")):
            shutil.rmtree(staging, ignore_errors=True)
            tail = (proc.stdout + proc.stderr)[-4000:]
            raise LocalKafkaError(
                f"Maven could not fetch Kafka {version} (exit {proc.returncode}); is Maven "
                f"Central reachable? Output:\n{tail}"
            )
        (staging / ".complete").write_text(version)
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
    return libs


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    # Linux: the JVM gets SIGKILL when the process that started it dies, even by kill -9,
    # so an interrupted test run never leaves a broker behind.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class LocalKafka:
    """A real single-node Kafka 4.x broker (combined broker + controller) on free loopback ports.

    Usage::

        kafka = LocalKafka().start()
        print(kafka.bootstrap_servers)   # "127.0.0.1:PORT"
        kafka.stop()

    ``start()`` returns only when a client has created a topic and completed a
    produce/consume round trip; a broker that cannot start raises :class:`LocalKafkaError`
    with the tail of its log instead of hanging.
    """

    def __init__(
        self,
        *,
        version: str = KAFKA_VERSION,
        workdir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        properties: Mapping[str, str] | None = None,
        heap: str = "768m",
        die_with_parent: bool = True,
    ) -> None:
        self.version = version
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="neli-kafka-"))
        self.port = port
        self.controller_port: int | None = None
        self.properties = dict(FAST_TEST_PROPERTIES)
        self.properties.update(properties or {})
        self.heap = heap
        self.die_with_parent = die_with_parent
        self.process: subprocess.Popen[bytes] | None = None

    # -- public ----------------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        """The ``bootstrap.servers`` value for clients of this broker."""
        if self.port is None:
            raise LocalKafkaError("the broker has not been started")
        return f"127.0.0.1:{self.port}"

    def client_settings(self) -> dict[str, Any]:
        """librdkafka settings of an all-powerful client (the test harness) of this broker."""
        return {"bootstrap.servers": self.bootstrap_servers}

    @property
    def log_path(self) -> Path:
        return self.workdir / "broker.log"

    def start(self, timeout: float = 90.0) -> LocalKafka:
        """Start the broker and wait until it serves a produce/consume round trip."""
        java = shutil.which("java")
        if java is None:
            raise LocalKafkaError("Kafka needs Java 17+: no `java` on PATH")
        libs = ensure_kafka_libs(self.version)
        deadline = time.monotonic() + timeout
        fixed_port = self.port is not None
        for attempt in range(3):
            self._write_config()
            self._format(java, libs)
            self._launch(java, libs)
            try:
                self._wait_ready(deadline)
                log.info("Kafka %s ready at %s (pid %s)", self.version,
                         self.bootstrap_servers, self.pid)
                return self
            except LocalKafkaError:
                port_clash = "Address already in use" in self.log_tail()
                self._kill()
                if fixed_port or not port_clash or attempt == 2:
                    raise
                log.warning("port clash starting Kafka, retrying on other ports")
                self.port = None
        raise AssertionError("unreachable")

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the broker (SIGTERM, then SIGKILL past ``timeout``) and remove a temp workdir."""
        self._kill(timeout)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the broker log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no broker log)"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> LocalKafka:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals -------------------------------------------------------------------------

    def _security_properties(self) -> dict[str, str]:
        """Broker settings of a secured subclass (listeners, authorizer); none here."""
        return {}

    def _format_args(self) -> list[str]:
        """Extra ``StorageTool format`` arguments (e.g. bootstrap SCRAM users); none here."""
        return []

    def _write_config(self) -> None:
        if self.port is None:
            self.port = free_port()
        self.controller_port = free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        data = self.workdir / "data"
        shutil.rmtree(data, ignore_errors=True)
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},"
                         f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(data),
            **self._security_properties(),
            **self.properties,
        }
        self.workdir.mkdir(parents=True, exist_ok=True)
        text = "".join(f"{k}={v}\n" for k, v in props.items())
        (self.workdir / "server.properties").write_text(text)

    def _java_cmd(self, java: str, libs: Path, main: str) -> list[str]:
        return [
            java, f"-Xmx{self.heap}", "-Xss1m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={_resource('log4j2.properties')}",
            "-cp", f"{libs}/*", main,
        ]

    def _format(self, java: str, libs: Path) -> None:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        cmd = self._java_cmd(java, libs, "kafka.tools.StorageTool") + [
            # "=": a random id may start with "-", which the argument parser takes for an option
            "format", f"--cluster-id={cluster_id}", "-c", str(self.workdir / "server.properties"),
            "--standalone", *self._format_args(),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise LocalKafkaError(
                f"formatting Kafka storage failed (exit {proc.returncode}):\n"
                f"{(proc.stdout + proc.stderr)[-4000:]}"
            )

    def _launch(self, java: str, libs: Path) -> None:
        cmd = self._java_cmd(java, libs, "kafka.Kafka") + [str(self.workdir / "server.properties")]
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                start_new_session=True,
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )
        (self.workdir / "broker.pid").write_text(str(self.process.pid))

    def _wait_ready(self, deadline: float) -> None:
        from confluent_kafka import Consumer, KafkaException, Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        assert self.process is not None
        conf = {**self.client_settings(), "socket.timeout.ms": 2000, "logger": _probe_log}
        topic = f"__neli_ready_{uuid.uuid4().hex[:8]}"
        last_error = "no answer"
        admin = AdminClient(conf)
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise LocalKafkaError(
                    f"Kafka exited with code {self.process.returncode} during start-up; "
                    f"log tail:\n{self.log_tail()}"
                )
            try:
                futures = admin.create_topics([NewTopic(topic, 1, 1)], operation_timeout=5)
                futures[topic].result(timeout=5)
                break
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" in str(exc):
                    break
                last_error = str(exc)
            except Exception as exc:  # noqa: BLE001 - any failure here means "not ready yet"
                last_error = repr(exc)
            time.sleep(0.2)
        else:
            raise LocalKafkaError(
                f"Kafka did not become ready before the deadline ({last_error}); "
                f"log tail:\n{self.log_tail()}"
            )
        producer = Producer(conf)
        producer.produce(topic, b"ready")
        if producer.flush(max(0.1, deadline - time.monotonic())) != 0:
            raise LocalKafkaError(f"Kafka accepted no produce; log tail:\n{self.log_tail()}")
        consumer = Consumer({**conf, "group.id": topic, "auto.offset.reset": "earliest"})
        try:
            consumer.subscribe([topic])
            while time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None and msg.value() == b"ready":
                    self._warm_up(conf, consumer, deadline)
                    return
            raise LocalKafkaError(
                f"Kafka round trip did not complete before the deadline; "
                f"log tail:\n{self.log_tail()}"
            )
        finally:
            consumer.close()

    def _warm_up(self, conf: dict[str, object], consumer: object, deadline: float) -> None:
        """Create and load the offsets and transaction-state topics before the first test.

        On a fresh broker the first group commit and the first ``init_transactions()`` wait
        seconds for their coordinators to load; a test's member with a sub-second lease would
        fence itself meanwhile.
        """
        from confluent_kafka import Producer

        consumer.commit(asynchronous=False)  # type: ignore[attr-defined]
        producer = Producer({**conf, "transactional.id": f"__neli_ready_{uuid.uuid4().hex[:8]}"})
        producer.init_transactions(max(1.0, deadline - time.monotonic()))

    def _kill(self, timeout: float = 20.0) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("Kafka did not stop within %.0f s of SIGTERM; killing it", timeout)
            proc.kill()
            proc.wait(10)


# -- chaos: restarting a broker ------------------------------------------------------------------


def restart_broker(
    kafka: LocalKafka, *, down: float = 0.0, hard: bool = False, timeout: float = 120.0
) -> None:
    """Stop ``kafka``'s broker (SIGTERM, or SIGKILL when ``hard``), keep it down ``down``
    seconds, and start it again on the same ports with its data (no re-format).

    For fault injection: clients see the broker vanish and return; groups, transactions and
    the ledger survive in its log directory.
    """
    process = kafka.process
    if process is None:
        raise LocalKafkaError("the broker is not running")
    if hard:
        process.kill()
        process.wait(10)
        kafka.process = None
    else:
        kafka._kill()
    time.sleep(down)
    java = shutil.which("java")
    if java is None:
        raise LocalKafkaError("Kafka needs Java 17+: no `java` on PATH")
    libs = ensure_kafka_libs(kafka.version)
    kafka._launch(java, libs)
    kafka._wait_ready(time.monotonic() + timeout)
    log.info("Kafka restarted at %s (pid %s) after %.1f s down", kafka.bootstrap_servers,
             kafka.pid, down)


# -- chaos: a three-broker KRaft cluster --------------------------------------------------------

#: What users run for the ledger and leader topics: three replicas, two in sync to acknowledge.
CLUSTER_PROPERTIES: Mapping[str, str] = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    # Kafka's own failure handling, stated so that the single node's fast settings cannot leak
    # in: the controller fences a silent broker (and drops it from every in-sync set) after
    # 9 s; a live follower that stops fetching leaves the in-sync set after 30 s.
    "broker.session.timeout.ms": "9000",
    "broker.heartbeat.interval.ms": "2000",
    "replica.lag.time.max.ms": "30000",
    # Several coordinator partitions, so that groups and transactional ids hash to
    # coordinators on different brokers (as in production, where the default is 50): a
    # broker's crash can then hit a group's coordinator without hitting the leader topic's
    # partition leader, or the other way round. 6 is two per broker; 50 partitions x 3
    # replicas take tens of seconds to create and load on a two-core machine.
    "offsets.topic.num.partitions": "6",
    "transaction.state.log.num.partitions": "6",
}

#: Opt-in, for tests that say why they need it: a killed broker is fenced (and leaves every
#: in-sync set) after about 3 s instead of 9 s, a stalled follower after 5 s instead of 30 s.
CLUSTER_FAST_PROPERTIES: Mapping[str, str] = {
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    "replica.lag.time.max.ms": "5000",
}


class _ClusterNode(LocalKafka):
    """One combined broker + controller of a :class:`LocalKafkaCluster` (static quorum)."""

    def __init__(self, node_id: int, voters: str, cluster_id: str, controller_port: int,
                 **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.node_id = node_id
        self.voters = voters
        self.cluster_id = cluster_id
        self.fixed_controller_port = controller_port

    def _write_config(self) -> None:
        data = self.workdir / "data"
        shutil.rmtree(data, ignore_errors=True)
        self.controller_port = self.fixed_controller_port
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},"
                         f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "controller.quorum.voters": self.voters,
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(data),
            **self.properties,
        }
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "server.properties").write_text(
            "".join(f"{k}={v}\n" for k, v in props.items())
        )

    def _format(self, java: str, libs: Path) -> None:
        # static quorum (controller.quorum.voters): every node formats with the same cluster id
        cmd = self._java_cmd(java, libs, "kafka.tools.StorageTool") + [
            "format", f"--cluster-id={self.cluster_id}", "-c",
            str(self.workdir / "server.properties"),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise LocalKafkaError(
                f"formatting node {self.node_id} failed (exit {proc.returncode}):\n"
                f"{(proc.stdout + proc.stderr)[-4000:]}"
            )


class LocalKafkaCluster:
    """A real Kafka 4.x cluster of ``nodes`` combined broker + controller nodes on loopback,
    with replication factor 3 and ``min.insync.replicas=2`` by default (:data:`CLUSTER_PROPERTIES`).

    Failure handling is Kafka's own default (a dead broker is fenced after 9 s, a lagging
    follower leaves the in-sync set after 30 s), and the offsets and transaction-state topics
    have 6 partitions, so coordinators spread over the brokers. ``fast=True`` adds
    :data:`CLUSTER_FAST_PROPERTIES` (3 s / 5 s): only for a test that says why it needs them.

    Usage::

        with LocalKafkaCluster() as cluster:
            cluster.bootstrap_servers            # "127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3"
            node = cluster.leader_of("neli.ledger", 0)
            cluster.kill(node)                   # kill -9 that broker
            cluster.restart(node)                # back, with its data

    For chaos tests; like :class:`LocalKafka`, not a production configuration.
    """

    def __init__(self, nodes: int = 3, *, workdir: str | os.PathLike[str] | None = None,
                 properties: Mapping[str, str] | None = None, heap: str = "512m",
                 fast: bool = False) -> None:
        if nodes < 3:
            raise LocalKafkaError("a cluster needs at least 3 nodes for RF 3 / min ISR 2")
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="neli-kraft-"))
        ports = {i: (free_port(), free_port()) for i in range(1, nodes + 1)}
        voters = ",".join(f"{i}@127.0.0.1:{c}" for i, (_, c) in ports.items())
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        merged = {**CLUSTER_PROPERTIES, **(CLUSTER_FAST_PROPERTIES if fast else {}),
                  **(properties or {})}
        self.nodes = {
            i: _ClusterNode(i, voters, cluster_id, controller, workdir=self.workdir / f"node{i}",
                            port=port, properties=merged, heap=heap)
            for i, (port, controller) in ports.items()
        }

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes.values())

    def start(self, timeout: float = 180.0) -> LocalKafkaCluster:
        """Format and start every node; return when the cluster serves a round trip."""
        java = shutil.which("java")
        if java is None:
            raise LocalKafkaError("Kafka needs Java 17+: no `java` on PATH")
        libs = ensure_kafka_libs()
        for node in self.nodes.values():
            node._write_config()
        # each format is a JVM start of its own: side by side, not one after another
        with concurrent.futures.ThreadPoolExecutor(len(self.nodes)) as pool:
            for done in [pool.submit(node._format, java, libs) for node in self.nodes.values()]:
                done.result()
        for node in self.nodes.values():
            node._launch(java, libs)
        deadline = time.monotonic() + timeout
        try:
            # any node answers for the cluster once the quorum has a leader
            first = next(iter(self.nodes.values()))
            first._wait_ready(deadline)
        except LocalKafkaError:
            self.stop()
            raise
        log.info("Kafka cluster of %d nodes ready at %s", len(self.nodes), self.bootstrap_servers)
        return self

    def leader_of(self, topic: str, partition: int = 0, timeout: float = 10.0) -> int:
        """The node id leading ``topic``'s ``partition`` now."""
        from confluent_kafka.admin import AdminClient

        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers,
                                "logger": logging.getLogger(__name__ + ".librdkafka")}
        admin = AdminClient(conf)
        metadata = admin.list_topics(topic, timeout=timeout)
        info = metadata.topics[topic]
        if info.error is not None:
            raise LocalKafkaError(f"topic {topic!r}: {info.error}")
        return int(info.partitions[partition].leader)

    def kill(self, node_id: int) -> None:
        """kill -9 one node."""
        node = self.nodes[node_id]
        if node.process is not None:
            node.process.kill()
            node.process.wait(10)
            node.process = None

    def restart(self, node_id: int, timeout: float = 120.0) -> None:
        """Start a stopped node again with its data."""
        node = self.nodes[node_id]
        java = shutil.which("java") or "java"
        node._launch(java, ensure_kafka_libs())
        node._wait_ready(time.monotonic() + timeout)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop every node: SIGTERM to all at once, then SIGKILL to those still up past
        ``timeout``. One at a time, the last node's controlled shutdown waits for a quorum
        that its peers took with them, and only the timeout ends it."""
        with concurrent.futures.ThreadPoolExecutor(len(self.nodes)) as pool:
            for done in [pool.submit(node._kill, timeout) for node in self.nodes.values()]:
                done.result()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalKafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
