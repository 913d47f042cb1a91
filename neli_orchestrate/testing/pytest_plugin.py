"""pytest plugin, opt-in: a real Kafka broker for your tests.

The package declares no ``pytest11`` entry point, so installing it loads nothing into anyone's
pytest. A suite opts in with ``pytest_plugins = ["neli_orchestrate.testing.pytest_plugin"]`` in
its top ``conftest.py`` (this repository's ``tests/conftest.py`` does), or on the command line
with ``pytest -p neli_orchestrate.testing.pytest_plugin``.

Fixtures:

- ``kafka_broker`` (session): bootstrap servers of a broker. ``NELI_TEST_BOOTSTRAP_SERVERS``
  points the tests at an existing cluster; otherwise a :class:`LocalKafka` is started once per
  session (``NELI_TEST_KAFKA_VERSION`` picks its Kafka release, e.g. ``3.9.1``). A broker
  that cannot start *fails* the requesting tests; it never skips them.
- ``kafka_admin`` (session): a ``confluent_kafka.admin.AdminClient`` for that broker.
- ``new_topic`` (function): ``new_topic(partitions=1, config=None) -> name`` creates a fresh,
  uniquely named topic.
- ``secured_kafka`` (session): a :class:`~neli_orchestrate.testing.secured_kafka.SecuredLocalKafka`
  (SASL/SCRAM, StandardAuthorizer, ACLs), started on first request only, so tests that do not
  ask for it pay nothing. It fails, never skips, when the broker cannot start.
- ``secured_kafka_tls`` (session): the same over ``SASL_SSL``, its certificate signed by a CA
  generated per broker (``secured_kafka_tls.ca_location``).
- ``spark_cluster`` (session): a :class:`~neli_orchestrate.testing.spark_cluster.LocalSparkCluster`
  (Spark standalone master + worker from the pyspark wheel, REST submission server on), started
  on first request only. It fails, never skips, when the cluster cannot start.

Markers registered here: ``kafka``, ``spark``, ``airflow``, ``dagster`` (tests that need the
named real component).
"""

from __future__ import annotations

import gc
import logging
import os
import re
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from neli_orchestrate.testing.local_kafka import LocalKafka, LocalKafkaError
from neli_orchestrate.testing.secured_kafka import SecuredLocalKafka

BOOTSTRAP_ENV = "NELI_TEST_BOOTSTRAP_SERVERS"
#: Kafka release the ``kafka_broker`` fixture starts (default: the pinned one); the
#: compatibility job runs a subset of the suite against the oldest and newest supported.
VERSION_ENV = "NELI_TEST_KAFKA_VERSION"

# the fixtures' clients log through Python logging, never raw to stderr
_librdkafka_log = logging.getLogger("neli_orchestrate.testing.librdkafka")

NewTopicFactory = Callable[..., str]


def pytest_configure(config: pytest.Config) -> None:
    for name, text in [
        ("kafka", "needs a real Kafka broker (kafka_broker fixture)"),
        ("spark", "runs real spark-submit / PySpark"),
        ("airflow", "runs real Airflow"),
        ("dagster", "runs real Dagster"),
    ]:
        config.addinivalue_line("markers", f"{name}: {text}")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    _release_capture_streams()


def _release_capture_streams() -> None:
    """Point logging handlers that hold pytest's capture streams back at the real streams.

    A library that configures logging while pytest captures output (Airflow does, on first
    import inside a test) binds a ``StreamHandler`` to pytest's captured ``sys.stdout``. pytest
    closes that stream once the session ends, so every record logged afterwards - by a daemon
    thread still draining, an ``atexit`` hook, a librdkafka client destroyed at exit - ends as
    a ``--- Logging error ---`` traceback (pytest-dev/pytest#5502, #5282). This runs while the
    capture streams are still open (``pytest_unconfigure`` precedes pytest's own clean-up).
    """
    captured = {id(sys.stdout): sys.__stdout__, id(sys.stderr): sys.__stderr__}
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)]
    for lg in loggers:
        for handler in lg.handlers:
            if not isinstance(handler, logging.StreamHandler) or isinstance(
                    handler, logging.FileHandler):
                continue
            stream = handler.stream
            if stream is sys.__stdout__ or stream is sys.__stderr__:
                continue
            real = captured.get(id(stream))
            if real is None and type(stream).__module__.startswith("_pytest"):
                real = sys.__stderr__
            if real is not None:
                try:
                    handler.setStream(real)
                except ValueError:  # flushing a capture stream that is already closed
                    handler.stream = real


def _check_reachable(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient

    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "socket.timeout.ms": 5000,
                            "logger": _librdkafka_log}
    admin = AdminClient(conf)
    try:
        admin.list_topics(timeout=10)
    except Exception as exc:  # noqa: BLE001
        raise LocalKafkaError(f"{BOOTSTRAP_ENV}={bootstrap} is not reachable: {exc}") from exc


#: Seconds a session fixture's broker or Spark daemon gets to stop on SIGTERM at the end of
#: the session before it is killed: its data is thrown away, so no graceful shutdown is owed.
SESSION_END_GRACE = 5.0


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[str]:
    """Bootstrap servers of a real Kafka broker for this test session."""
    external = os.environ.get(BOOTSTRAP_ENV)
    if external:
        try:
            _check_reachable(external)
        except LocalKafkaError as exc:
            pytest.fail(str(exc), pytrace=False)
        yield external
        return
    version = os.environ.get(VERSION_ENV, "").strip()
    kafka = LocalKafka(version=version) if version else LocalKafka()
    try:
        kafka.start()
    except LocalKafkaError as exc:
        kafka.stop()
        pytest.fail(f"Kafka broker could not start: {exc}", pytrace=False)
    try:
        yield kafka.bootstrap_servers
    finally:
        # Kafka clients a test leaked (kept alive by a reference cycle, e.g. an exception's
        # traceback) are destroyed while the broker still answers: a client that outlives it
        # retries its connection and librdkafka prints "Connect ... refused" at exit.
        gc.collect()
        kafka.stop(timeout=SESSION_END_GRACE)


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[Any]:
    """A real Spark standalone cluster (master + one worker) on loopback for this session."""
    from neli_orchestrate.testing.spark_cluster import LocalSparkCluster, LocalSparkError

    cluster = LocalSparkCluster()
    try:
        cluster.start()
    except LocalSparkError as exc:
        cluster.stop()
        pytest.fail(f"Spark standalone cluster could not start: {exc}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop(timeout=SESSION_END_GRACE)


@pytest.fixture(scope="session")
def kafka_admin(kafka_broker: str):  # type: ignore[no-untyped-def]
    """An AdminClient connected to ``kafka_broker``."""
    from confluent_kafka.admin import AdminClient

    conf: dict[str, Any] = {"bootstrap.servers": kafka_broker, "logger": _librdkafka_log}
    return AdminClient(conf)


@pytest.fixture
def new_topic(kafka_admin, request: pytest.FixtureRequest) -> NewTopicFactory:  # type: ignore[no-untyped-def]
    """Factory that creates a fresh topic: ``new_topic(partitions=1, config=None) -> name``."""
    from confluent_kafka.admin import NewTopic

    stem = re.sub(r"[^A-Za-z0-9._-]", "_", request.node.name)[:80]

    def create(partitions: int = 1, config: Mapping[str, str] | None = None) -> str:
        name = f"t.{stem}.{uuid.uuid4().hex[:8]}"
        topic = NewTopic(name, partitions, 1, config=dict(config or {}))
        kafka_admin.create_topics([topic], operation_timeout=15)[name].result(timeout=30)
        return name

    return create


@pytest.fixture(scope="session")
def secured_kafka() -> Iterator[SecuredLocalKafka]:
    """A broker that authenticates (SASL/SCRAM) and authorizes (ACLs); started lazily."""
    kafka = SecuredLocalKafka()
    try:
        kafka.start(timeout=300.0)  # SCRAM set-up adds work; shared CI machines are slow
    except LocalKafkaError as exc:
        kafka.stop()
        pytest.fail(f"secured Kafka broker could not start: {exc}", pytrace=False)
    try:
        yield kafka
    finally:
        kafka.stop(timeout=SESSION_END_GRACE)


@pytest.fixture(scope="session")
def secured_kafka_tls() -> Iterator[SecuredLocalKafka]:
    """Like ``secured_kafka``, over SASL_SSL with a generated CA (``.ca_location``)."""
    kafka = SecuredLocalKafka(tls=True)
    try:
        kafka.start(timeout=300.0)
    except LocalKafkaError as exc:
        kafka.stop()
        pytest.fail(f"secured TLS Kafka broker could not start: {exc}", pytrace=False)
    try:
        yield kafka
    finally:
        kafka.stop(timeout=SESSION_END_GRACE)
