"""Roles and their partitions: role j leads through partition j mod M, named roles by a stable hash.

The mapping must be identical in every process, host and Python version, so named roles use
CRC-32 (``zlib.crc32``, the same as ``java.util.zip.CRC32``) of their UTF-8 bytes, never
``hash()`` (salted per process).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Protocol

from neli_orchestrate.errors import ConfigError

__all__ = [
    "HashSlots",
    "Role",
    "check_role",
    "check_roles",
    "partition_for",
    "stable_hash",
]

Role = int | str
"""A role: an integer index (partition = index mod M) or a name (partition = crc32 mod M)."""


def stable_hash(key: str | bytes) -> int:
    """Return the CRC-32 of ``key`` (UTF-8 for text): the same in every process and language."""
    data = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    return zlib.crc32(data) & 0xFFFFFFFF


def check_role(role: object) -> Role:
    """Return ``role`` if it is a valid role (int >= 0 or non-empty str), else raise ConfigError."""
    if isinstance(role, bool) or not isinstance(role, (int, str)):
        raise ConfigError(
            f"role {role!r} must be an int >= 0 or a non-empty str, not {type(role).__name__}"
        )
    if isinstance(role, int) and role < 0:
        raise ConfigError(f"role {role} must be >= 0 (role j leads through partition j mod M)")
    if isinstance(role, str) and not role:
        raise ConfigError("a role name must not be empty")
    return role


def check_roles(roles: Iterable[object]) -> tuple[Role, ...]:
    """Validate a collection of roles: at least one, each valid, no duplicates."""
    if isinstance(roles, (str, bytes)):
        raise ConfigError(
            f"NeliConfig.roles must be a sequence of roles, not the string {roles!r}; "
            f"write roles=({roles!r},)"
        )
    result = tuple(check_role(r) for r in roles)
    if not result:
        raise ConfigError("NeliConfig.roles must name at least one role")
    seen: set[Role] = set()
    for role in result:
        if role in seen:
            raise ConfigError(f"NeliConfig.roles lists {role!r} twice")
        seen.add(role)
    return result


def partition_for(role: Role, partitions: int) -> int:
    """Return the leader-topic partition through which ``role`` is led (topic of ``partitions``)."""
    if partitions < 1:
        raise ValueError(f"a topic has at least one partition, not {partitions}")
    check_role(role)
    if isinstance(role, int):
        return role % partitions
    return stable_hash(role) % partitions


class _Leads(Protocol):
    def leads(self, role: Role) -> bool: ...


class HashSlots:
    """Shard keys over a fixed number of hash slots, each slot a NELI role.

    Usage::

        slots = HashSlots(16)
        config = NeliConfig(..., roles=slots.roles, partitions=16)
        with Neli(config) as neli:
            if neli.leads(slots.role_for("customer-42")): ...

    The key-to-slot mapping never changes while members come and go; NELI only moves whole
    slots between members, so membership changes reassign as little as possible.
    """

    def __init__(self, slots: int) -> None:
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ConfigError(f"HashSlots needs at least one slot, not {slots!r}")
        self.slots = slots

    @property
    def roles(self) -> tuple[int, ...]:
        """The roles of all slots: ``0 .. slots-1``."""
        return tuple(range(self.slots))

    def role_for(self, key: str | bytes) -> int:
        """Return the slot (role) that owns ``key``: ``crc32(key) mod slots``."""
        return stable_hash(key) % self.slots

    def owned(self, neli: _Leads) -> list[int]:
        """Return the slots this member leads right now."""
        return [slot for slot in range(self.slots) if neli.leads(slot)]

    def partition_of(self, key: str | bytes, partitions: int) -> int:
        """Return the leader-topic partition that arbitrates ``key``'s slot."""
        return partition_for(self.role_for(key), partitions)

    def __repr__(self) -> str:
        return f"HashSlots({self.slots})"

