"""Roles map to partitions identically in every process: role j -> j mod M, names by CRC-32."""

from __future__ import annotations

import binascii
import os
import subprocess
import sys

import pytest

from neli_orchestrate.core.mock import MockNeli
from neli_orchestrate.core.roles import HashSlots, partition_for, stable_hash
from neli_orchestrate.errors import ConfigError


def test_integer_roles_map_modulo_the_partition_count() -> None:
    assert [partition_for(j, 3) for j in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_named_roles_use_crc32_of_their_utf8_bytes() -> None:
    for name in ("billing", "daily_flights/2013-01-01", "ünïcødé"):
        expected = binascii.crc32(name.encode("utf-8")) & 0xFFFFFFFF
        assert stable_hash(name) == expected
        assert partition_for(name, 7) == expected % 7
    assert stable_hash("billing") == 0xEC224CAA  # fixed forever: a changed value breaks groups


def test_role_mapping_is_identical_in_a_process_with_another_hash_seed() -> None:
    names = ["billing", "compaction", "daily_flights/2013-01-01"]
    code = ("from neli_orchestrate.core.roles import partition_for;"
            f"print([partition_for(n, 5) for n in {names!r}])")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == str([partition_for(n, 5) for n in names])


def test_invalid_roles_are_refused() -> None:
    for bad in (-1, "", 1.5, None, True):
        with pytest.raises(ConfigError):
            partition_for(bad, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        partition_for(0, 0)


def test_hash_slots_shard_keys_over_roles() -> None:
    slots = HashSlots(16)
    assert slots.roles == tuple(range(16))
    keys = [f"customer-{i}" for i in range(1000)]
    assigned = [slots.role_for(k) for k in keys]
    assert assigned == [stable_hash(k) % 16 for k in keys]
    assert len(set(assigned)) == 16          # every slot gets keys
    assert slots.partition_of("customer-1", 4) == slots.role_for("customer-1") % 4
    with pytest.raises(ConfigError):
        HashSlots(0)


def test_hash_slots_report_the_slots_a_member_leads() -> None:
    slots = HashSlots(4)
    neli = MockNeli(roles=slots.roles)
    neli.acquire(1)
    neli.acquire(3)
    neli.pulse()
    assert slots.owned(neli) == [1, 3]
