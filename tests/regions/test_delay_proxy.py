"""The harness's delaying TCP proxy: it delays each direction, never reorders, counts requests."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from integration.regions.delay_proxy import DelayProxy


def _echo_server() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def _echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)


def _read(sock: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        assert chunk, "connection closed early"
        got += chunk
    return got


def test_a_round_trip_costs_at_least_twice_the_one_way_delay_and_the_stream_keeps_its_order():
    server, port = _echo_server()
    with DelayProxy(("127.0.0.1", port), one_way=0.05, jitter=0.02, seed=1) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
            started = time.monotonic()
            sock.sendall(b"ping")
            assert _read(sock, 4) == b"ping"
            assert time.monotonic() - started >= 0.1  # one way out, one way back
            # many small writes with jitter: the bytes come back in the order they were sent
            payload = b"".join(struct.pack(">I", i) for i in range(500))
            for i in range(0, len(payload), 8):
                sock.sendall(payload[i:i + 8])
            assert _read(sock, len(payload)) == payload
            proxy.set_delay(0.0, 0.0)
            sock.sendall(b"fast")
            assert _read(sock, 4) == b"fast"
    server.close()


def test_it_counts_kafka_requests_by_api_key_across_split_frames():
    server, port = _echo_server()
    with DelayProxy(("127.0.0.1", port)) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
            frames = b""
            for api_key in (18, 3, 0, 0, 22):
                body = struct.pack(">hhi", api_key, 0, 7) + b"x" * 20
                frames += struct.pack(">i", len(body)) + body
            for i in range(0, len(frames), 5):  # frames split across writes
                sock.sendall(frames[i:i + 5])
            _read(sock, len(frames))
        assert proxy.requests == {18: 1, 3: 1, 0: 2, 22: 1}
        proxy.reset_counts()
        assert proxy.requests == {}
    server.close()


def test_a_cut_drops_everything_for_this_proxys_clients_and_heal_breaks_old_connections():
    server, port = _echo_server()
    with DelayProxy(("127.0.0.1", port)) as proxy, DelayProxy(("127.0.0.1", port)) as other:
        before = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        before.sendall(b"ping")
        assert _read(before, 4) == b"ping"
        proxy.cut()
        during = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        with socket.create_connection(("127.0.0.1", other.port), timeout=10) as bystander:
            bystander.sendall(b"free")  # the other proxy's client is not cut
            assert _read(bystander, 4) == b"free"
        for sock in (before, during):
            sock.settimeout(0.5)
            sock.sendall(b"lost")
            with pytest.raises(TimeoutError):  # a black hole: no answer, no close
                sock.recv(4)
        proxy.heal()
        for sock in (before, during):  # streams that lost bytes are closed on heal
            sock.settimeout(10)
            assert sock.recv(4) == b""
            sock.close()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as after:
            after.sendall(b"back")
            assert _read(after, 4) == b"back"
    server.close()
