"""A delaying TCP proxy: latency between "regions" on one machine, whose kernel has no netem.

Usage::

    with DelayProxy(upstream=("127.0.0.1", 9092), one_way=0.015, jitter=0.002) as proxy:
        proxy.port              # clients connect here; bytes reach upstream 15 ms (±2) later
        proxy.set_delay(0.030)  # change it while connections are open
        proxy.requests          # Kafka requests seen from clients, by API key
        proxy.cut()             # a network partition for this proxy's clients only
        proxy.heal()            # and its end
        proxy.drop("10.213.31.2", "up")  # one way: what that peer sends is dropped

``host`` is the address the proxy listens on (loopback unless given: the region-loss chaos
scenario binds the host end of a network namespace's veth pair, so other namespaces reach it).

``cut()`` is a black hole, not a refusal: from then on nothing read from either side of any
connection (open or new) is forwarded, and no connection is closed, so a client learns of the
partition only through its own timeouts, as with a lost route (a connection opened during the
cut is accepted and then silent: no upstream connection is tried, so a dead upstream shows no
refusal either). ``heal()`` forwards again on
new connections and closes every connection that was open during the cut (bytes were dropped
from its streams), as a client's TCP stack would after a long partition. ``drop(peer,
direction)`` is a one-way partition of the connections whose client has address ``peer``:
``"up"`` drops what that client sends, ``"down"`` what it is sent; the other direction keeps
flowing. ``heal()`` ends it the same way.

Every chunk read from one side is written to the other ``one_way`` (plus a uniform jitter of at
most ``jitter``) seconds after it was read, in order: each direction is one FIFO, so a chunk
whose jitter is smaller still waits for the one before it and a TCP stream is never
reordered. A round trip through the proxy therefore costs ``2 × one_way`` more than without
it. Bandwidth is not limited. The client-to-upstream direction is also parsed as Kafka
request frames (a 4-byte length, then the request whose first two bytes are the API key), so
a benchmark can count the requests one operation makes (``requests``, ``reset_counts``).

Harness code (integration/, not the wheel): one asyncio loop in a daemon thread; loopback only.
"""

from __future__ import annotations

import asyncio
import collections
import random
import struct
import threading
import time
from typing import Any

__all__ = ["DelayProxy", "KAFKA_API_NAMES"]

#: Names of the Kafka API keys a client of this package sends (for the benchmark's tables).
KAFKA_API_NAMES = {
    0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 8: "OffsetCommit",
    9: "OffsetFetch", 10: "FindCoordinator", 11: "JoinGroup", 12: "Heartbeat",
    13: "LeaveGroup", 14: "SyncGroup", 15: "DescribeGroups", 16: "ListGroups",
    18: "ApiVersions", 19: "CreateTopics", 22: "InitProducerId", 24: "AddPartitionsToTxn",
    25: "AddOffsetsToTxn", 26: "EndTxn", 28: "TxnOffsetCommit", 32: "DescribeConfigs",
    33: "AlterConfigs", 36: "SaslHandshake", 44: "IncrementalAlterConfigs",
    60: "DescribeCluster", 68: "ConsumerGroupHeartbeat", 69: "ConsumerGroupDescribe",
    75: "DescribeTopicPartitions",
}


#: How early a precise proxy's timer wakes before a chunk is due (the loop's timers round up
#: to whole milliseconds, and the thread needs a moment to be scheduled).
_TIMER_SLACK = 0.002


class DelayProxy:
    """Forward ``127.0.0.1:port`` to ``upstream`` with a one-way delay in each direction."""

    def __init__(self, upstream: tuple[str, int], *, one_way: float = 0.0, jitter: float = 0.0,
                 port: int = 0, seed: int | None = None, host: str = "127.0.0.1",
                 precise: bool = False) -> None:
        """``precise``: deliver each chunk at its due time to within tens of microseconds
        instead of up to about a millisecond late (the event loop's timers round up to whole
        milliseconds): the loop wakes a little early and yields until the chunk is due, which
        costs CPU. For latency benchmarks; the chaos suite does without."""
        if one_way < 0 or jitter < 0:
            raise ValueError(f"delays must be >= 0, not one_way={one_way} jitter={jitter}")
        self.upstream = upstream
        self.one_way = one_way
        self.jitter = jitter
        self.precise = precise
        #: chunks delivered, and the sum and max of how late each was against its due time (s)
        self._lateness = [0, 0.0, 0.0]
        self._want_port = port
        self.host = host
        self.port = 0
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._counts: collections.Counter[int] = collections.Counter()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="delay-proxy",
                                        daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._cut = False
        #: one-way partitions: (client address, "up" or "down")
        self._drops: set[tuple[str, str]] = set()
        #: connections (client writer, upstream writer) open during a cut: closed on heal
        self._poisoned: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self._open: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        #: clients that connected during a cut (no upstream connection): closed on heal
        self._swallowed: set[asyncio.StreamWriter] = set()

    # -- control (any thread) ----------------------------------------------------------------

    def start(self) -> DelayProxy:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self.port = future.result(timeout=10)
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def set_delay(self, one_way: float, jitter: float | None = None) -> None:
        """Change the delay; it applies to every chunk read from now on."""
        if one_way < 0 or (jitter is not None and jitter < 0):
            raise ValueError("delays must be >= 0")
        self.one_way = one_way
        if jitter is not None:
            self.jitter = jitter

    @property
    def is_cut(self) -> bool:
        return self._cut

    def cut(self) -> None:
        """Stop forwarding anything, on every connection open now or opened later."""
        self._cut = True
        asyncio.run_coroutine_threadsafe(self._poison_open(), self._loop).result(timeout=10)

    def drop(self, peer: str, direction: str) -> None:
        """A one-way partition: from now on, drop what clients at ``peer`` send (``"up"``) or
        are sent (``"down"``), on every connection, open or new, until :meth:`heal`."""
        if direction not in ("up", "down"):
            raise ValueError(f"direction must be 'up' or 'down', not {direction!r}")
        self._drops.add((peer, direction))
        asyncio.run_coroutine_threadsafe(self._poison_open(peer), self._loop).result(timeout=10)

    def heal(self) -> None:
        """Forward again; close the connections the cut or a one-way drop broke."""
        asyncio.run_coroutine_threadsafe(self._heal(), self._loop).result(timeout=10)

    @property
    def requests(self) -> dict[int, int]:
        """Kafka requests clients sent through the proxy since the last reset, by API key."""
        with self._lock:
            return dict(self._counts)

    @property
    def lateness(self) -> dict[str, float]:
        """How late delayed chunks left the proxy since the last reset: count, mean and max
        (ms). A chunk due at once (no delay) is not counted."""
        with self._lock:
            count, total, worst = self._lateness
        return {"chunks": count, "mean_ms": round(1000 * total / count, 3) if count else 0.0,
                "max_ms": round(1000 * worst, 3)}

    def reset_counts(self) -> None:
        with self._lock:
            self._counts.clear()
            self._lateness = [0, 0.0, 0.0]

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the loop ------------------------------------------------------------------------------

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._accept, self.host, self._want_port)
        return int(self._server.sockets[0].getsockname()[1])

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        tasks = [t for t in asyncio.all_tasks(self._loop) if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _poison_open(self, peer: str | None = None) -> None:
        self._poisoned.extend(pair for pair in self._open
                              if peer is None or _peer(pair[0]) == peer)

    async def _heal(self) -> None:
        self._cut = False
        self._drops.clear()
        poisoned, self._poisoned = self._poisoned, []
        for writer in list(self._swallowed):
            writer.close()
        for pair in poisoned:
            for writer in pair:
                writer.close()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self._cut:  # a black hole: no refusal, no close, whether upstream lives or not
            await self._swallow(client_r, client_w)
            return
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()
            return
        self._writers.update((client_w, up_w))
        pair = (client_w, up_w)
        self._open.add(pair)
        peer = _peer(client_w)
        if self._cut or any(p == peer for p, _ in self._drops):
            self._poisoned.append(pair)
        frames = _FrameCounter(self._count)
        try:
            await asyncio.gather(self._pump(client_r, up_w, frames.feed, (peer, "up")),
                                 self._pump(up_r, client_w, None, (peer, "down")))
        except asyncio.CancelledError:  # the proxy stops: this connection ends with it
            pass
        finally:
            self._open.discard(pair)
            for writer in (client_w, up_w):
                self._writers.discard(writer)
                writer.close()

    async def _swallow(self, client_r: asyncio.StreamReader,
                       client_w: asyncio.StreamWriter) -> None:
        """Read and drop what a client sends during a cut; the connection is closed on heal."""
        self._writers.add(client_w)
        self._swallowed.add(client_w)
        try:
            while await client_r.read(65536):
                pass
        except ConnectionError:
            pass
        finally:
            self._swallowed.discard(client_w)
            self._writers.discard(client_w)
            client_w.close()

    def _count(self, api_key: int) -> None:
        with self._lock:
            self._counts[api_key] += 1

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    inspect: Any, way: tuple[str, str] = ("", "")) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    writer.close()
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    if not self.precise:
                        await asyncio.sleep(wait)
                    else:
                        if wait > _TIMER_SLACK:
                            await asyncio.sleep(wait - _TIMER_SLACK)
                        while time.monotonic() < due:
                            await asyncio.sleep(0)  # other connections' chunks go meanwhile
                    late = time.monotonic() - due
                    with self._lock:
                        self._lateness[0] += 1
                        self._lateness[1] += late
                        self._lateness[2] = max(self._lateness[2], late)
                try:
                    writer.write(data)
                    await writer.drain()
                except ConnectionError:  # the other side went away: so does this direction
                    return

        sender = asyncio.create_task(deliver())
        try:
            while True:
                data = await reader.read(65536)
                if self._cut or way in self._drops:  # dropped: broken until heal
                    if not data:
                        break
                    continue
                if inspect is not None and data:
                    inspect(data)
                delay = self.one_way + (self._random.uniform(0, self.jitter)
                                        if self.jitter else 0.0)
                # one FIFO per direction: a chunk due earlier still waits for the one before
                queue.put_nowait((time.monotonic() + delay, data))
                if not data:
                    break
            await sender
        except (ConnectionError, asyncio.CancelledError):
            sender.cancel()
            raise


def _peer(writer: asyncio.StreamWriter) -> str:
    """The address of a connection's client."""
    return str((writer.get_extra_info("peername") or ("",))[0])


class _FrameCounter:
    """Splits a client's byte stream into Kafka request frames and reports each API key."""

    def __init__(self, report: Any) -> None:
        self._report = report
        self._buffer = bytearray()
        self._need: int | None = None

    def feed(self, data: bytes) -> None:
        self._buffer += data
        while True:
            if self._need is None:
                if len(self._buffer) < 4:
                    return
                (self._need,) = struct.unpack(">i", self._buffer[:4])
                del self._buffer[:4]
            if len(self._buffer) < self._need:
                return
            frame = bytes(self._buffer[: self._need])
            del self._buffer[: self._need]
            self._need = None
            if len(frame) >= 2:
                self._report(struct.unpack(">h", frame[:2])[0])


def broker_behind_proxies(proxy_ports: dict[str, int], listener_ports: dict[str, int]) -> Any:
    """A LocalKafka (not started) with one more client listener per name, on
    ``listener_ports[name]`` and advertised at ``proxy_ports[name]``: the clients that
    bootstrap through a name's proxy reach the broker only through it."""
    from neli_orchestrate.testing.local_kafka import LocalKafka

    class ProxiedKafka(LocalKafka):
        def _write_config(self) -> None:
            super()._write_config()
            path = self.workdir / "server.properties"
            lines = []
            for line in path.read_text().splitlines():
                key, _, value = line.partition("=")
                for name in proxy_ports:
                    upper = name.upper()
                    if key == "listeners":
                        value += f",{upper}://127.0.0.1:{listener_ports[name]}"
                    elif key == "advertised.listeners":
                        value += f",{upper}://127.0.0.1:{proxy_ports[name]}"
                    elif key == "listener.security.protocol.map":
                        value += f",{upper}:PLAINTEXT"
                lines.append(f"{key}={value}")
            path.write_text("\n".join(lines) + "\n")

    return ProxiedKafka()
