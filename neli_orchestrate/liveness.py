"""Deployment liveness in Kafka: is a deployment that holds a claim still there to continue it?

Usage (an announcer in a process that is always up in the deployment; a reader anywhere)::

    with LivenessAnnouncer(AnnouncerConfig(bootstrap_servers="kafka:9092", namespace="acme",
                                           deployment="us-east-1", timeout=10.0)):
        serve_forever()                     # the deployment is alive while this runs

    reader = LivenessReader(admin, namespace="acme")
    reader.read("us-east-1")                # DeploymentLiveness(state=ALIVE, since=..., ...)

Each deployment keeps a member in a consumer group of its own, ``<namespace>.deployment.<name>``
(:func:`liveness_group`), with *static* membership (``group.instance.id``) and a session timeout
of ``timeout`` seconds. Kafka's group coordinator is the judge, not anyone's clock:

- ``ALIVE``: the group has members. A member that stops heartbeating (crash, kill -9, a host
  or network loss) stays a member until the coordinator expires it, ``timeout`` seconds after
  its last heartbeat. A static member sends no LeaveGroup when it closes, so a restart shorter
  than ``timeout`` is never seen as a death; a longer one is.
- ``GONE``: the group exists but has no member: no process of the deployment has heartbeated
  for at least ``timeout`` seconds. The group survives its members because every announcer
  commits an offset with its metadata (Kafka keeps an empty group's offsets for
  ``offsets.retention.minutes``, 7 days by default).
- ``UNKNOWN``: no such group (the deployment never announced: an older version, the feature
  off, or gone for longer than the offsets' retention). The decision table then applies the
  rule it always had (respect the claim for ``handoff_timeout``).

The decision table (:func:`neli_orchestrate.decision.decide`) takes a ``GONE`` deployment's
``CLAIMED``, ``RUNNING`` or ``FAILED`` record over at once with a larger token. A wrong verdict
(a live deployment whose announcer was paused past ``timeout``) costs a re-run at most: the
late executor finds the newer claim and does not run (tokens and the fenced ledger producer).

.. note:: The verdict says nothing about the deployment's *workers*: a worker of a ``GONE``
   deployment may still start its executor. That executor acquires leadership and checks its
   claim first, finds the newer token and does not run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from neli_orchestrate.core.client_settings import KafkaSettings, client_settings
from neli_orchestrate.core.config import NeliConfig
from neli_orchestrate.core.kafka import LeaderTopicAdmin
from neli_orchestrate.core.namespace import derive
from neli_orchestrate.errors import ConfigError, KafkaUnavailableError

__all__ = [
    "ANNOUNCER_ENV",
    "AnnouncerConfig",
    "DeploymentLiveness",
    "Liveness",
    "LivenessAnnouncer",
    "LivenessReader",
    "liveness_group",
    "spawn_announcer",
]

log = logging.getLogger(__name__)

#: Environment variable carrying an :class:`AnnouncerConfig` (JSON) to a spawned announcer.
ANNOUNCER_ENV = "NELI_LIVENESS_ANNOUNCER"
_CLIENT_PREFIX = "neli-liveness/"
#: Default seconds without a heartbeat after which a deployment counts as gone.
DEFAULT_LIVENESS_TIMEOUT = 10.0


def liveness_group(namespace: str, deployment: str) -> str:
    """The consumer group whose members say that ``deployment`` is alive."""
    return derive(namespace).liveness_group(deployment)


class Liveness(StrEnum):
    """What Kafka says about a deployment."""

    #: Its liveness group has members (heartbeats within the session timeout).
    ALIVE = "ALIVE"
    #: Its liveness group has no member: silent for longer than its liveness timeout.
    GONE = "GONE"
    #: No liveness information (never announced, or the feature is off there): today's rule.
    UNKNOWN = "UNKNOWN"


@dataclass(frozen=True)
class DeploymentLiveness:
    """One reading of a deployment's liveness group."""

    deployment: str
    state: Liveness
    #: Live announcers now (ALIVE), else 0.
    members: int = 0
    #: ALIVE: wall-clock start (epoch seconds) of its oldest live announcer; GONE: start of the
    #: last announcer that recorded itself; None if unknown.
    since: float | None = None
    #: The announced liveness timeout (seconds), if the reader fetched the announcement.
    timeout: float | None = None
    detail: str = ""

    @property
    def gone(self) -> bool:
        """True if Kafka shows no process of the deployment for longer than its timeout."""
        return self.state is Liveness.GONE

    def describe(self) -> str:
        """One line for logs, decisions and the CLI."""
        text = f"deployment {self.deployment!r} {self.state.value}"
        if self.state is Liveness.ALIVE:
            text += f" ({self.members} announcer(s)"
            text += f", since {_iso(self.since)})" if self.since is not None else ")"
        elif self.state is Liveness.GONE:
            text += " (no liveness member"
            if self.timeout is not None:
                text += f" for over its {self.timeout:g} s timeout"
            text += ")"
        return text + (f": {self.detail}" if self.detail else "")


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


@dataclass(frozen=True)
class AnnouncerConfig:
    """Where and how a deployment announces it is alive.

    ``timeout`` (seconds) is the liveness group's session timeout: how long after its last
    heartbeat a silent deployment counts as gone. It must lie within the broker's
    ``group.min.session.timeout.ms``/``group.max.session.timeout.ms`` (6 s to 30 min by
    default). Longer than the deployment's usual restart, so a restart is not a death.
    ``kafka_config`` carries connection and security settings (``security.*``, ``sasl.*``,
    ``ssl.*``, ...).
    """

    bootstrap_servers: str
    namespace: str
    deployment: str
    timeout: float = DEFAULT_LIVENESS_TIMEOUT
    #: What keeps the announcer (scheduler, triggerer, daemon, sidecar); part of its member id.
    component: str = "process"
    kafka_config: Mapping[str, Any] = field(default_factory=dict)
    poll_interval: float = 0.5

    def __post_init__(self) -> None:
        from neli_orchestrate.core.namespace import derive

        derive(self.namespace)  # ConfigError naming the fix
        for name in ("bootstrap_servers", "deployment", "component"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ConfigError(f"AnnouncerConfig.{name} must be a non-empty string")
        for name in ("timeout", "poll_interval"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(f"AnnouncerConfig.{name} must be a positive number of seconds,"
                                  f" got {value!r}")
        _announcer_settings(self, "-", 0.0)   # ConfigError for a required key in kafka_config
        if self.poll_interval * 3 > self.timeout:
            raise ConfigError(f"AnnouncerConfig.poll_interval ({self.poll_interval:g} s) must be"
                              f" at most a third of timeout ({self.timeout:g} s)")

    @property
    def group(self) -> str:
        return liveness_group(self.namespace, self.deployment)

    @property
    def leader_topic(self) -> str:
        from neli_orchestrate.core.namespace import derive

        return derive(self.namespace).leader_topic

    def to_json(self) -> str:
        return json.dumps({"bootstrap_servers": self.bootstrap_servers,
                           "namespace": self.namespace, "deployment": self.deployment,
                           "timeout": self.timeout, "component": self.component,
                           "kafka_config": dict(self.kafka_config),
                           "poll_interval": self.poll_interval})

    @classmethod
    def from_json(cls, text: str) -> AnnouncerConfig:
        try:
            values = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"{ANNOUNCER_ENV} is not JSON: {exc}") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{ANNOUNCER_ENV} must be a JSON object")
        return cls(**values)


def _announcer_settings(c: AnnouncerConfig, instance_id: str, since: float) -> KafkaSettings:
    """The announcer's consumer settings (core's one builder): its group membership, static id
    and session are the announcement, so kafka_config may not replace them."""
    session_ms = int(c.timeout * 1000)
    return client_settings(c.bootstrap_servers, logger=__name__ + ".librdkafka",
                           user=c.kafka_config, required={
                               "group.id": c.group,
                               "group.instance.id": instance_id,
                               "group.protocol": "classic",
                               "session.timeout.ms": session_ms,
                               "heartbeat.interval.ms": max(10, session_ms // 5),
                               "enable.auto.commit": False,
                           }, call={"client.id": f"{_CLIENT_PREFIX}{int(since * 1000)}"})


class LivenessAnnouncer:
    """Keeps this deployment's liveness member in its group on a background thread.

    ``start()`` returns at once; the member joins within a few hundred milliseconds (a broker
    that cannot be reached is retried for ever, logged). ``close()`` stops heartbeating without
    leaving the group (static membership): the deployment counts as gone ``timeout`` seconds
    later unless another announcer of it is up by then.
    """

    def __init__(self, config: AnnouncerConfig, *,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.since = wall_clock()
        self._stop = threading.Event()
        self._joined = threading.Event()
        self._recorded = threading.Event()
        self._thread: threading.Thread | None = None
        self.instance_id = (f"{config.deployment}/{config.component}/{socket.gethostname()}/"
                            f"{os.getpid()}")

    def start(self) -> LivenessAnnouncer:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name=f"neli-liveness-{self.config.deployment}")
            self._thread.start()
        return self

    def wait_joined(self, timeout: float) -> bool:
        """True once the member joined and recorded its announcement (tests, start-up logs)."""
        return self._recorded.wait(timeout)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10 + self.config.timeout)

    def __enter__(self) -> LivenessAnnouncer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _consumer_config(self) -> KafkaSettings:
        return _announcer_settings(self.config, self.instance_id, self.since)

    def _announcement(self) -> str:
        return json.dumps({"deployment": self.config.deployment, "since": self.since,
                           "timeout": self.config.timeout, "component": self.config.component,
                           "instance": self.instance_id})

    def _run(self) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        from neli_orchestrate.core.confluent import new_consumer

        c = self.config
        backoff = c.poll_interval
        while not self._stop.is_set():
            consumer = None
            try:
                consumer = new_consumer(self._consumer_config())

                def on_assign(cons: Any, partitions: list[Any]) -> None:
                    # Fetch nothing: membership is the message.
                    cons.assign(partitions)
                    cons.pause(partitions)
                    self._joined.set()

                consumer.subscribe([c.leader_topic], on_assign=on_assign)
                log.info("liveness of deployment %r: announcing in group %r (member %s,"
                         " timeout %g s)", c.deployment, c.group, self.instance_id, c.timeout)
                while not self._stop.is_set():
                    consumer.poll(c.poll_interval)
                    if self._joined.is_set() and not self._recorded.is_set():
                        try:
                            consumer.commit(offsets=[TopicPartition(
                                c.leader_topic, 0, 0, metadata=self._announcement())],
                                asynchronous=False)
                        except KafkaException as exc:
                            log.warning("liveness of %r: cannot record the announcement yet"
                                        " (%s); retrying", c.deployment, exc)
                        else:
                            self._recorded.set()
                            log.info("liveness of deployment %r recorded in group %r",
                                     c.deployment, c.group)
                backoff = c.poll_interval
            except Exception:  # noqa: BLE001 - keep announcing whatever Kafka does
                log.exception("liveness announcer of %r failed; restarting in %.1f s",
                              c.deployment, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, c.timeout / 3)
            finally:
                if consumer is not None:
                    try:
                        consumer.close()  # static member: no LeaveGroup, expires after timeout
                    except Exception:  # noqa: BLE001 - closing a broken client
                        log.debug("closing the liveness consumer failed", exc_info=True)
                self._joined.clear()
                self._recorded.clear()


class LivenessReader:
    """Reads deployments' liveness groups through the Kafka seam's admin (read-only, no join).

    ``admin`` is a :class:`~neli_orchestrate.core.kafka.LeaderTopicAdmin` (what
    ``ConfluentKafka().admin(settings)`` makes, or a test's fake); a confluent-kafka
    ``AdminClient`` is accepted too and read through the same seam.
    """

    def __init__(self, admin: LeaderTopicAdmin | Any, namespace: str, *,
                 request_timeout: float = NeliConfig.request_timeout) -> None:
        from neli_orchestrate.core.confluent import as_seam_admin

        admin = as_seam_admin(admin)
        self._admin: LeaderTopicAdmin = admin
        self.namespace = namespace
        self.request_timeout = request_timeout

    def read(self, deployment: str, *, details: bool = False) -> DeploymentLiveness:
        """The liveness of ``deployment``; ``details`` also fetches its announcement (timeout,
        since of a gone one). Raises :class:`KafkaUnavailableError` when Kafka does not answer.
        """
        return self._read(liveness_group(self.namespace, deployment), deployment, details)

    def read_all(self) -> list[DeploymentLiveness]:
        """Every deployment of the namespace that ever announced (for ``status``), by name."""
        prefix = liveness_group(self.namespace, "")
        try:
            listing = self._admin.list_groups(self.request_timeout)
        except Exception as exc:  # noqa: BLE001 - KafkaUnavailableError, a denied ACL
            raise KafkaUnavailableError(f"cannot list consumer groups: {exc}") from exc
        groups = sorted(g for g in listing if g.startswith(prefix))
        return [self._read(g, g[len(prefix):], True) for g in groups]

    def _read(self, group: str, deployment: str, details: bool) -> DeploymentLiveness:
        try:
            description = self._admin.describe_group(group, self.request_timeout)
        except Exception as exc:  # noqa: BLE001 - KafkaUnavailableError, a denied ACL
            raise KafkaUnavailableError(f"cannot describe liveness group {group!r}: {exc}"
                                        ) from exc
        if description is None:
            return DeploymentLiveness(deployment, Liveness.UNKNOWN, detail="never announced")
        members = description.members
        announced = self._announcement(group) if details else {}
        timeout_s = announced.get("timeout")
        if members:
            starts = [s for s in (_since(m.client_id) for m in members) if s is not None]
            return DeploymentLiveness(deployment, Liveness.ALIVE, members=len(members),
                                      since=min(starts) if starts else None,
                                      timeout=timeout_s if isinstance(timeout_s, int | float)
                                      else None)
        if description.state == "EMPTY":
            since = announced.get("since")
            return DeploymentLiveness(
                deployment, Liveness.GONE,
                since=since if isinstance(since, int | float) else None,
                timeout=timeout_s if isinstance(timeout_s, int | float) else None)
        return DeploymentLiveness(deployment, Liveness.UNKNOWN,
                                  detail=f"group state {description.state}")

    def _announcement(self, group: str) -> dict[str, Any]:
        try:
            offsets = self._admin.group_offsets(group, self.request_timeout)
        except Exception:  # noqa: BLE001 - details are optional
            log.debug("cannot read the announcement of %r", group, exc_info=True)
            return {}
        for offset in offsets:
            try:
                value = json.loads(offset.metadata or "")
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
        return {}


def _since(client_id: str | None) -> float | None:
    if not client_id or not client_id.startswith(_CLIENT_PREFIX):
        return None
    try:
        return int(client_id[len(_CLIENT_PREFIX):]) / 1000
    except ValueError:
        return None


def spawn_announcer(config: AnnouncerConfig) -> subprocess.Popen[bytes]:
    """Start an announcer process that lives as long as this process (it exits when its parent
    is gone). Keeps Kafka clients out of a process that forks (an Airflow scheduler)."""
    env = dict(os.environ)
    env[ANNOUNCER_ENV] = config.to_json()  # in the environment: no secrets on a command line
    return subprocess.Popen(
        [sys.executable, "-m", "neli_orchestrate.liveness", "--from-env", "--exit-with-parent"],
        env=env, stdin=subprocess.DEVNULL, start_new_session=False)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m neli_orchestrate.liveness``: announce a deployment's liveness (a sidecar)."""
    parser = argparse.ArgumentParser(
        prog="python -m neli_orchestrate.liveness",
        description="Keep a deployment's liveness member in Kafka until stopped (SIGTERM).")
    parser.add_argument("--bootstrap-servers")
    parser.add_argument("--namespace")
    parser.add_argument("--deployment")
    parser.add_argument("--timeout", type=float, default=DEFAULT_LIVENESS_TIMEOUT,
                        help="seconds of silence after which the deployment counts as gone")
    parser.add_argument("--component", default="sidecar")
    parser.add_argument("--from-env", action="store_true",
                        help=f"read the configuration (JSON) from ${ANNOUNCER_ENV}")
    parser.add_argument("--exit-with-parent", action="store_true",
                        help="exit when the process that started this one is gone")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="exit when this process is no longer the parent (a child that"
                        " exec'd into the announcer)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        if args.from_env:
            config = AnnouncerConfig.from_json(os.environ.get(ANNOUNCER_ENV, ""))
        else:
            missing = [n for n in ("bootstrap_servers", "namespace", "deployment")
                       if not getattr(args, n)]
            if missing:
                parser.error("missing " + ", ".join("--" + n.replace("_", "-") for n in missing))
            config = AnnouncerConfig(bootstrap_servers=args.bootstrap_servers,
                                     namespace=args.namespace, deployment=args.deployment,
                                     timeout=args.timeout, component=args.component)
    except (ConfigError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)  # noqa: T201 - command-line tool
        return 2
    import signal

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    parent = args.parent_pid if args.parent_pid is not None else os.getppid()
    watch = args.exit_with_parent or args.parent_pid is not None
    if watch and os.getppid() != parent:
        return 0  # the parent is gone already
    with LivenessAnnouncer(config):
        while not stop.wait(0.5):
            if watch and os.getppid() != parent:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
