"""Network namespaces for regions: each region in a namespace of its own, joined to the host
(where the broker runs) by a veth pair, so one region can be cut off from Kafka while the
others are not touched. Needs root and ``ip`` (iproute2); used by the chaos suite's
``network-cut`` scenario (``python -m integration.chaos --netns``).

Layout: the broker listens on :data:`BROKER_ADDRESS`, an address of the host's loopback
device. Region ``i`` lives in namespace ``<prefix>-<i>``: its end of the veth pair has
``10.213.<i>.2/24`` and a default route to the host end, ``10.213.<i>.1``. Its api-server
binds every address of the namespace; the host reaches it at ``10.213.<i>.2``.
:meth:`Netns.cut` sets the host end of the pair down: the region loses the broker (and the
host loses the region's api-server) until :meth:`Netns.heal`.
"""

from __future__ import annotations

import logging
import subprocess
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

BROKER_ADDRESS = "10.213.0.1"


class NetnsError(RuntimeError):
    pass


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {result.stderr.strip()} (needs root and iproute2)")


@dataclass
class Netns:
    """One region's namespace and veth pair."""

    name: str
    index: int

    @property
    def host_link(self) -> str:
        return f"nv{self.name[-6:]}h"  # interface names have at most 15 characters

    @property
    def region_link(self) -> str:
        return f"nv{self.name[-6:]}r"

    @property
    def address(self) -> str:
        """The region's address, as the host reaches it."""
        return f"10.213.{self.index}.2"

    def create(self) -> Netns:
        gateway = f"10.213.{self.index}.1"
        _ip("netns", "add", self.name)
        try:
            _ip("link", "add", self.host_link, "type", "veth", "peer", "name", self.region_link)
            _ip("link", "set", self.region_link, "netns", self.name)
            _ip("addr", "add", f"{gateway}/24", "dev", self.host_link)
            _ip("link", "set", self.host_link, "up")
            inside = ("netns", "exec", self.name, "ip")
            _ip(*inside, "link", "set", "lo", "up")
            _ip(*inside, "addr", "add", f"{self.address}/24", "dev", self.region_link)
            _ip(*inside, "link", "set", self.region_link, "up")
            _ip(*inside, "route", "add", "default", "via", gateway)
        except BaseException:
            self.delete()
            raise
        return self

    def cut(self) -> None:
        """Link down: the region can reach neither the broker nor the host."""
        _ip("link", "set", self.host_link, "down")
        logger.info("cut %s off (link %s down)", self.name, self.host_link)

    def heal(self) -> None:
        _ip("link", "set", self.host_link, "up")
        logger.info("healed %s (link %s up)", self.name, self.host_link)

    def delete(self) -> None:
        for args in (("link", "del", self.host_link), ("netns", "del", self.name)):
            try:
                _ip(*args)
            except NetnsError as exc:
                logger.debug("%s", exc)


def add_broker_address() -> None:
    """Give the host's loopback :data:`BROKER_ADDRESS` (idempotent)."""
    result = subprocess.run(["ip", "-o", "addr", "show", "dev", "lo"], capture_output=True,
                            text=True, timeout=30)
    if f" {BROKER_ADDRESS}/" not in result.stdout:
        _ip("addr", "add", f"{BROKER_ADDRESS}/32", "dev", "lo")


def host_kafka(**kwargs: Any) -> Any:
    """A :class:`~neli_orchestrate.testing.LocalKafka` (same arguments) whose client listener is
    on :data:`BROKER_ADDRESS`, which every namespace routes to; its controller stays on
    loopback. Not started."""
    from neli_orchestrate.testing.local_kafka import LocalKafka

    class HostKafka(LocalKafka):
        @property
        def bootstrap_servers(self) -> str:
            return f"{BROKER_ADDRESS}:{self.port}"

        def _security_properties(self) -> dict[str, str]:
            return {
                "listeners": f"PLAINTEXT://{BROKER_ADDRESS}:{self.port},"
                             f"CONTROLLER://127.0.0.1:{self.controller_port}",
                "advertised.listeners": f"PLAINTEXT://{BROKER_ADDRESS}:{self.port}",
            }

    return HostKafka(**kwargs)
