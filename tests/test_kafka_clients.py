"""One builder of Kafka client settings, one precedence, and one place that makes clients.

- :func:`neli_orchestrate.core.client_settings.client_settings` layers required > per call >
  user extras > defaults, and refuses a user extra that names a required key;
- only ``core/confluent.py`` constructs a confluent-kafka client (an AST scan of the package,
  shown failing on a deliberate construction), and its constructors take only the builder's
  settings;
- librdkafka's log lines still reach Python's ``logging`` (real broker).
"""

from __future__ import annotations

import ast
import logging
import shutil
import time
from pathlib import Path

import pytest

from neli_orchestrate.core.client_settings import KafkaSettings, client_settings
from neli_orchestrate.errors import ConfigError

PACKAGE = Path(__file__).resolve().parents[1] / "neli_orchestrate"

#: The seam's implementation: the only module that may construct a client.
SEAM = Path("core/confluent.py")
#: The test harness starts its own brokers and probes them before any of the package's
#: settings exist; it is not a client of a user's cluster.
HARNESS = Path("testing")
CLIENT_CLASSES = {"Producer", "Consumer", "AdminClient", "SerializingProducer",
                  "DeserializingConsumer"}


def constructions(root: Path) -> list[str]:
    """``path:line`` of every construction of a confluent-kafka client outside the seam, and
    every import of a client class (an import is how a construction starts)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative == SEAM or relative.parts[0] == HARNESS.name:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in CLIENT_CLASSES:
                    found.append(f"{relative}:{node.lineno} calls {name}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "confluent_kafka"):
                for alias in node.names:
                    if alias.name in CLIENT_CLASSES:
                        found.append(f"{relative}:{node.lineno} imports {alias.name}")
    return found


def test_no_module_outside_the_seam_constructs_a_kafka_client() -> None:
    assert constructions(PACKAGE) == []


@pytest.mark.parametrize("line", [
    "import confluent_kafka\nconfluent_kafka.Consumer({'group.id': 'x'})",
    "from confluent_kafka.admin import AdminClient",
    "def _k():\n    import confluent_kafka\n    return confluent_kafka\n_k().Producer({})",
])
def test_the_scan_catches_a_deliberate_construction(tmp_path: Path, line: str) -> None:
    copy = tmp_path / "neli_orchestrate"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "kafka",
                                                                 "table_formats"))
    target = copy / "observe.py"
    target.write_text(target.read_text() + f"\n{line}  # deliberately bad\n")
    assert [hit for hit in constructions(copy) if hit.startswith("observe.py")]


# -- the builder ---------------------------------------------------------------------------------

def test_precedence_required_over_call_over_user_over_defaults() -> None:
    settings = client_settings(
        "kafka:9092", logger="test.librdkafka",
        required={"isolation.level": "read_committed"},
        call={"fetch.wait.max.ms": 10, "client.id": "per-call"},
        user={"client.id": "users", "client.rack": "az1", "socket.nagle.disable": False},
        defaults={"socket.nagle.disable": True, "reconnect.backoff.ms": 10})
    assert isinstance(settings, KafkaSettings)
    assert settings["bootstrap.servers"] == "kafka:9092"
    assert settings["isolation.level"] == "read_committed"       # required
    assert settings["client.id"] == "per-call"                   # call over user
    assert settings["client.rack"] == "az1"                      # user
    assert settings["socket.nagle.disable"] is False             # user over default
    assert settings["reconnect.backoff.ms"] == 10                # default
    assert settings["logger"] is logging.getLogger("test.librdkafka")


def test_a_user_logger_replaces_the_default_one() -> None:
    mine = logging.getLogger("mine")
    assert client_settings("k:1", logger="x", user={"logger": mine})["logger"] is mine


@pytest.mark.parametrize("key", ["isolation.level", " Isolation.Level", "bootstrap.servers"])
def test_a_user_extra_never_overrides_a_required_key_silently(key: str) -> None:
    refusal = "(?i)kafka_config may not set .*(isolation|bootstrap)"
    with pytest.raises(ConfigError, match=refusal) as e:
        client_settings("kafka:9092", logger="x", required={"isolation.level": "read_committed"},
                        user={key: "read_uncommitted"},
                        why={"isolation.level": "a ledger reader sees only committed records"})
    assert "remove it from kafka_config" in str(e.value)
    if "isolation" in key.lower():
        assert "only committed records" in str(e.value)


def test_the_front_doors_and_the_ledger_refuse_a_required_key() -> None:
    from neli_orchestrate.ledger.kafka import KafkaLedgerConfig, ledger_settings
    from neli_orchestrate.liveness import AnnouncerConfig

    with pytest.raises(ConfigError, match="group.instance.id"):
        AnnouncerConfig(bootstrap_servers="k:1", namespace="acme", deployment="eu",
                        kafka_config={"group.instance.id": "fixed"})
    # a config that slipped past KafkaLedgerConfig's own check still cannot override
    config = KafkaLedgerConfig(bootstrap_servers="k:1")
    object.__setattr__(config, "kafka_config", {"enable.idempotence": False})
    with pytest.raises(ConfigError, match="enable.idempotence.*the ledger manages it"):
        ledger_settings(config, required={"enable.idempotence": True})


def test_every_client_of_the_package_takes_only_the_builders_settings() -> None:
    from neli_orchestrate.core.confluent import (
        ConfluentKafka,
        new_admin,
        new_consumer,
        new_producer,
    )

    for make in (new_admin, new_consumer, new_producer):
        with pytest.raises(TypeError, match="one builder"):
            make({"bootstrap.servers": "k:1"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="one builder"):
        ConfluentKafka().admin({"bootstrap.servers": "k:1"})


def test_the_member_clients_keep_their_settings() -> None:
    """The member's three clients through the builder: what the protocol sets wins, the user's
    security settings pass, the package's defaults yield to the user's."""
    from neli_orchestrate.core.config import NeliConfig
    from neli_orchestrate.core.confluent import (
        RECONNECT_BACKOFF_MS,
        consumer_settings,
        producer_settings,
        watcher_settings,
    )

    config = NeliConfig(bootstrap_servers="k:1", group_id="g", topic="t", group_protocol="classic",
                        kafka_config={"security.protocol": "SSL", "socket.nagle.disable": False,
                                      "client.id": "mine"})
    r = config.resolved
    consumer = consumer_settings(r)
    assert consumer["group.id"] == "g" and consumer["group.protocol"] == "classic"
    assert consumer["security.protocol"] == "SSL"
    assert consumer["socket.nagle.disable"] is False and consumer["client.id"] == "mine"
    assert consumer["reconnect.backoff.ms"] == RECONNECT_BACKOFF_MS
    assert producer_settings(r)["acks"] == "all"
    assert producer_settings(r)["enable.idempotence"] is False
    assert watcher_settings(r)["client.id"].endswith("-watch")   # per call, over the user's


def test_librdkafka_logs_go_through_logging(kafka_broker: str,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """A client made from ClusterSettings logs through ``neli_orchestrate.librdkafka``."""
    from neli_orchestrate.settings import ClusterSettings

    cluster = ClusterSettings(bootstrap_servers=kafka_broker, namespace="acme",
                              kafka_config={"debug": "broker"})
    caplog.set_level(logging.DEBUG, logger="neli_orchestrate.librdkafka")
    admin = cluster.admin_client()
    admin.list_topics(timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(
            r.name == "neli_orchestrate.librdkafka" for r in caplog.records):
        admin.poll(0.1)
    assert any(r.name == "neli_orchestrate.librdkafka" for r in caplog.records)
