"""NELI protocol core: leadership of roles induced from Kafka consumer-group partition assignment.

Usage::

    from neli_orchestrate.core import Neli, NeliConfig, LeaderFenced
    with Neli(NeliConfig(bootstrap_servers="127.0.0.1:9092", group_id="billing"),
              barrier=print) as neli:
        pulser = neli.background(lambda: do_a_bit_of_leader_work())

See ``docs/protocol.md`` for the protocol, its timing assumptions and profiles.
"""

from neli_orchestrate.core.clock import SYSTEM_CLOCK, Clock, FakeClock, SystemClock
from neli_orchestrate.core.config import (
    PROFILES,
    PROTECTED_KAFKA_SETTINGS,
    NeliConfig,
    ResolvedConfig,
    TimingProfile,
)
from neli_orchestrate.core.events import (
    Barrier,
    LeaderAcquired,
    LeaderEvent,
    LeaderFenced,
    LeaderRevoked,
)
from neli_orchestrate.core.mock import MockNeli
from neli_orchestrate.core.neli import Neli, NeliLike
from neli_orchestrate.core.pulser import Pulser
from neli_orchestrate.core.roles import HashSlots, Role, partition_for, stable_hash
from neli_orchestrate.errors import ConfigError, KafkaUnavailableError, NeliError

__all__ = [
    "Barrier",
    "Clock",
    "ConfigError",
    "FakeClock",
    "HashSlots",
    "KafkaUnavailableError",
    "LeaderAcquired",
    "LeaderEvent",
    "LeaderFenced",
    "LeaderRevoked",
    "MockNeli",
    "Neli",
    "NeliConfig",
    "NeliError",
    "NeliLike",
    "PROFILES",
    "PROTECTED_KAFKA_SETTINGS",
    "Pulser",
    "ResolvedConfig",
    "Role",
    "SYSTEM_CLOCK",
    "SystemClock",
    "TimingProfile",
    "partition_for",
    "stable_hash",
]
