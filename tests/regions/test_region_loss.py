"""The region-loss chaos scenario's pieces that need no cluster: the proxy's one-way partition
and the coordinator hash (integration/chaos/region_loss.py; the scenario itself runs outside CI,
its results are in docs/internals/chaos.md)."""

from __future__ import annotations

import socketserver
import threading

import pytest

from integration.chaos.region_loss import (
    ROLE,
    _java_hash,
    _partition_for,
    _place,
    markdown,
    summarize,
)
from integration.regions.delay_proxy import DelayProxy
from neli_orchestrate.core.namespace import derive


class _Recorder(socketserver.BaseRequestHandler):
    """Keeps what it receives (``server.got``) and sends it back."""

    def handle(self) -> None:
        while chunk := self.request.recv(4096):
            self.server.got.append(chunk)  # type: ignore[attr-defined]
            self.request.sendall(chunk)


@pytest.fixture
def recorder():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Recorder)
    server.daemon_threads = True
    server.got = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _wait_for(condition, seconds: float = 5.0) -> bool:
    event = threading.Event()
    for _ in range(int(seconds / 0.02)):
        if condition():
            return True
        event.wait(0.02)
    return condition()


def _connect(proxy: DelayProxy):
    import socket

    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    sock.settimeout(0.5)
    return sock


def test_a_one_way_drop_down_lets_the_request_through_and_loses_the_answer(recorder):
    with DelayProxy(recorder.server_address) as proxy:
        proxy.drop("127.0.0.1", "down")
        sock = _connect(proxy)
        sock.sendall(b"ping")
        assert _wait_for(lambda: b"".join(recorder.got) == b"ping")  # it arrived upstream
        with pytest.raises(TimeoutError):  # the answer is dropped, the stream stays open
            sock.recv(4)
        proxy.heal()
        sock.settimeout(10)
        assert sock.recv(4) == b""  # a stream that lost bytes is closed on heal
        sock.close()
        with _connect(proxy) as again:
            again.settimeout(10)
            again.sendall(b"back")
            assert again.recv(4) == b"back"


def test_a_one_way_drop_up_loses_the_request_and_spares_other_peers(recorder):
    with DelayProxy(recorder.server_address) as proxy:
        proxy.drop("10.213.99.2", "up")  # another peer's: this client is untouched
        with _connect(proxy) as sock:
            sock.settimeout(10)
            sock.sendall(b"free")
            assert sock.recv(4) == b"free"
        recorder.got.clear()
        proxy.drop("127.0.0.1", "up")
        with _connect(proxy) as sock:
            sock.sendall(b"lost")
            with pytest.raises(TimeoutError):
                sock.recv(4)
            assert recorder.got == []  # nothing reached upstream
        with pytest.raises(ValueError, match="direction"):
            proxy.drop("127.0.0.1", "sideways")


def test_the_coordinator_hash_is_javas_string_hash_code():
    # Kafka places a group (a transactional id) on partition abs(hashCode) % partitions
    assert _java_hash("hello") == 99162322
    assert _java_hash("Hello World") == -862545276
    assert _java_hash("polygenelubricants") == -(2**31)  # Integer.MIN_VALUE: abs() is 0
    assert _partition_for("polygenelubricants", 6) == 0
    assert _partition_for("Hello World", 6) == 862545276 % 6


def _ran(takeover: float, lost: int = 0) -> dict:
    return {"scenario": "region", "error": None, "violations": [], "lost": lost,
            "duplicates": 0, "restarts": [], "takeover_seconds": takeover,
            "completed_after_seconds": takeover + 12}


def test_a_trial_that_could_not_be_placed_is_counted_apart_not_as_a_lost_run() -> None:
    not_run = {"scenario": "region", "trial": 2, "not_run": "PlacementError: node 3 leads no"
               " offsets or no transaction-state partition", "seconds": 181.0}
    table = summarize([_ran(50.0), not_run, _ran(48.0)])
    row = table["region"]
    assert (row["trials"], row["not_run"], row["lost"], row["takeovers"]) == (2, 1, 0, 2)
    assert row["takeover_p99"] is not None and row["takeover_p99"] <= 50.0
    assert "| region | 2 | 1 |" in markdown(table)


def test_a_namespace_fits_the_preferred_layout_but_not_every_layout() -> None:
    # each node leads i and i + 3 of six partitions (the preferred layout): node 1 fits
    preferred = {p: 1 + p % 3 for p in range(6)}
    placed = _place({"__consumer_offsets": preferred, "__transaction_state": preferred}, 1)
    assert placed is not None
    name, where = placed
    names = derive(name)
    assert _partition_for(names.group_id(ROLE), 6) == where["group_partition"]
    assert _partition_for(names.transactional_id_prefix + ROLE, 6) == where["txn_partition"]
    # the group's and the transactional id's partitions keep one parity relation for every name
    tie = (where["group_partition"] - where["txn_partition"]) % 2
    # so a node leading offsets partition 0 and only a transaction-state partition of the other
    # parity can host no namespace (what left trials unplaced after a node's restart)
    lone = {p: 2 for p in range(6)}
    offsets, txn = {**lone, 0: 1}, {**lone, 1 - tie: 1}
    assert _place({"__consumer_offsets": offsets, "__transaction_state": txn}, 1) is None
