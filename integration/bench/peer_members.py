"""One contender of each lock service, as a process that ``peers.py`` drives.

Usage (``peers.py`` does this; by hand only to debug)::

    python integration/bench/peer_members.py zk '{"hosts": "127.0.0.1:2181", ...}'

Protocol, the same for every peer (and for the goNELI driver in ``goneli/main.go``): settings
as JSON in argv; JSON lines on stdout: ``ready`` (with ``start_s``, construction to
contending), ``acquired``, ``revoked`` / ``fenced`` (leadership ended; for a lease the time is
when the lease ended by the member's own clock), ``releasing``, ``closed``. The line
``release`` on stdin hands leadership over and exits. Times are Unix seconds (the wall clock
all processes of the host share; Go has no portable way to read Python's monotonic clock).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

_lock = threading.Lock()


def emit(kind: str, t: float | None = None, **fields: Any) -> None:
    with _lock:
        sys.stdout.write(json.dumps({"kind": kind, "t": time.time() if t is None else t,
                                     **fields}) + "\n")
        sys.stdout.flush()


def on_release(action: Callable[[], None]) -> threading.Thread:
    """Run ``action`` when 'release' arrives on stdin (or stdin closes)."""
    def read() -> None:
        for line in sys.stdin:
            if line.strip() == "release":
                break
        emit("releasing")
        action()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


# -- this project ------------------------------------------------------------------------------

def neli_member(s: dict[str, Any]) -> None:
    import logging
    import os

    from neli_orchestrate.core.config import NeliConfig
    from neli_orchestrate.core.events import (
        LeaderAcquired,
        LeaderEvent,
        LeaderFenced,
        LeaderRevoked,
    )
    from neli_orchestrate.core.neli import Neli

    logging.basicConfig(level=logging.WARNING, format="%(created).4f %(threadName)s %(message)s")
    if os.environ.get("NELI_BENCH_DEBUG"):
        for name in ("neli_orchestrate.core.neli", "neli_orchestrate.core.hints"):
            logging.getLogger(name).setLevel(logging.DEBUG)
    # Imports are not part of "start" for any peer (kazoo, psycopg are imported first too);
    # the library imports its Kafka client lazily, so import it here.
    import confluent_kafka  # noqa: F401
    import confluent_kafka.admin  # noqa: F401

    def wall(monotonic: float) -> float:
        return time.time() - (time.monotonic() - monotonic)

    def barrier(event: LeaderEvent) -> None:
        kind = {LeaderAcquired: "acquired", LeaderRevoked: "revoked",
                LeaderFenced: "fenced"}[type(event)]
        emit(kind, wall(event.timestamp), reason=event.reason)

    begin = time.time()
    neli = Neli(NeliConfig(**s), barrier)
    emit("ready", start_s=time.time() - begin)
    done = threading.Event()
    on_release(done.set)
    neli.background()       # the library's own pulser, as a user would run a waiting member
    done.wait()
    neli.close()
    emit("closed")


# -- ZooKeeper (kazoo's Election recipe) -----------------------------------------------------------

def zk_member(s: dict[str, Any]) -> None:
    from kazoo.client import KazooClient, KazooState

    begin = time.time()
    client = KazooClient(hosts=s["hosts"], timeout=s["session_timeout"])
    client.start(timeout=30)
    election = client.Election(s["path"], identifier=s["name"])
    emit("ready", start_s=time.time() - begin)
    stop = threading.Event()
    leading = threading.Event()

    def listener(state: str) -> None:
        # The usual kazoo advice: a suspended or lost session means "stop acting as leader".
        if state in (KazooState.SUSPENDED, KazooState.LOST) and leading.is_set():
            leading.clear()
            emit("fenced", reason=str(state))
            stop.set()

    client.add_listener(listener)
    on_release(stop.set)

    def lead() -> None:
        leading.set()
        emit("acquired")
        stop.wait()
        leading.clear()    # returning releases the lock (the znode is deleted)

    election.run(lead)
    client.stop()
    client.close()
    emit("closed")


# -- etcd (v3 election API through etcd's HTTP/JSON gateway) ------------------------------------

def etcd_member(s: dict[str, Any]) -> None:
    import base64
    import http.client

    host, port = s["endpoint"].split(":")

    def call(conn: http.client.HTTPConnection, path: str, body: dict[str, Any]
             ) -> dict[str, Any]:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        raw = conn.getresponse().read()
        # streaming endpoints answer one JSON object per line: the first is the answer
        first = raw.splitlines()[0] if raw else b"{}"
        return json.loads(first)  # type: ignore[no-any-return]

    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    begin = time.time()
    control = http.client.HTTPConnection(host, int(port), timeout=60)
    lease = call(control, "/v3/lease/grant", {"TTL": s["ttl"]})["ID"]
    emit("ready", start_s=time.time() - begin)
    stop = threading.Event()
    leading = threading.Event()
    leader_key: dict[str, Any] = {}
    ttl = int(s["ttl"])
    # etcd's Go client (clientv3 lease.go) takes a keep-alive answer's arrival + TTL as the
    # lease's deadline, and its deadlineLoop closes the keep-alive channel once a second
    # tick finds that deadline passed; concurrency.Session is Done then.
    lease_deadline = [time.time() + ttl]
    ended = threading.Lock()

    def end(reason: str) -> None:
        with ended:
            if leading.is_set():
                leading.clear()
                emit("fenced", reason=reason)
            stop.set()

    def keepalive() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=ttl)
        while not stop.wait(ttl / 3):
            try:
                result = call(conn, "/v3/lease/keepalive", {"ID": lease}).get("result", {})
            except (OSError, ValueError, http.client.HTTPException):
                # the Go client retries the stream; deadline_loop decides when the lease is over
                conn.close()
                conn = http.client.HTTPConnection(host, int(port), timeout=ttl)
                continue
            left = int(result.get("TTL", 0))
            if left <= 0:
                end("lease-lost")       # the Go client: a TTL <= 0 answer ends the session
                return
            lease_deadline[0] = time.time() + left

    def deadline_loop() -> None:
        while not stop.wait(1.0):
            if time.time() > lease_deadline[0]:
                end("keepalive-deadline")

    threading.Thread(target=keepalive, daemon=True).start()
    threading.Thread(target=deadline_loop, daemon=True).start()

    def release() -> None:
        with ended:
            resign = leading.is_set() and bool(leader_key)
            leading.clear()
        if resign:
            call(control, "/v3/election/resign", {"leader": leader_key})
        stop.set()

    on_release(release)
    campaign = http.client.HTTPConnection(host, int(port), timeout=3600)
    answer = call(campaign, "/v3/election/campaign",
                  {"name": b64(s["election"]), "lease": lease, "value": b64(s["name"])})
    with ended:
        if "leader" in answer and not stop.is_set():
            leader_key.update(answer["leader"])
            leading.set()
            emit("acquired")
    stop.wait()
    try:
        call(control, "/v3/lease/revoke", {"ID": lease})
    except (OSError, ValueError, http.client.HTTPException):
        pass
    emit("closed")


# -- PostgreSQL: a lease table with LISTEN/NOTIFY, and an advisory lock --------------------------

LEASE_SQL = """
INSERT INTO neli_lease AS l (name, holder, expires_at)
VALUES (%(name)s, %(holder)s, clock_timestamp() + make_interval(secs => %(ttl)s))
ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
WHERE l.expires_at < clock_timestamp() OR l.holder = EXCLUDED.holder
RETURNING holder
"""


def pg_lease_member(s: dict[str, Any]) -> None:
    import psycopg

    begin = time.time()
    conn = psycopg.connect(s["dsn"], autocommit=True)
    conn.execute("LISTEN neli_lease_released")
    emit("ready", start_s=time.time() - begin)
    ttl = s["ttl"]
    release_now = threading.Event()
    on_release(release_now.set)
    params = {"name": s["lease"], "holder": s["name"], "ttl": ttl}

    def try_acquire() -> float | None:
        sent = time.time()
        return sent + ttl if conn.execute(LEASE_SQL, params).fetchone() else None

    # follower: wait for a release notification, or poll every ttl/6 (the expiry case)
    deadline = try_acquire()
    while deadline is None and not release_now.is_set():
        for _ in conn.notifies(timeout=ttl / 6, stop_after=1):
            pass
        deadline = try_acquire()
    if deadline is not None:
        emit("acquired")
        lease = {"deadline": deadline}
        over = threading.Event()    # leadership has ended: fenced or released
        ended = threading.Lock()

        def end(t: float, reason: str) -> None:
            with ended:
                if not over.is_set():
                    over.set()
                    emit("fenced", t, reason=reason)

        def watchdog() -> None:
            # A renewal can hang (a cut network: the query waits for TCP to give up): the
            # lease still ends by the member's own clock.
            while not over.wait(max(0.0, lease["deadline"] - time.time())):
                if time.time() >= lease["deadline"]:
                    end(lease["deadline"], "lease-expired")

        threading.Thread(target=watchdog, daemon=True).start()
        # leader: renew every ttl/3
        while not over.is_set():
            if release_now.wait(max(0.0, min(ttl / 3, lease["deadline"] - time.time()))):
                with ended:
                    if over.is_set():
                        break
                    over.set()
                with conn.transaction():
                    conn.execute("UPDATE neli_lease SET expires_at = '-infinity' "
                                 "WHERE name = %(name)s AND holder = %(holder)s", params)
                    conn.execute("NOTIFY neli_lease_released")
                break
            if time.time() >= lease["deadline"]:
                end(lease["deadline"], "lease-expired")
                break
            renewed = try_acquire()
            if renewed is None or time.time() >= lease["deadline"]:
                end(lease["deadline"] if renewed is None else time.time(), "lease-lost")
                break
            lease["deadline"] = renewed
    release_now.wait()
    conn.close()
    emit("closed")


def pg_advisory_member(s: dict[str, Any]) -> None:
    import psycopg

    begin = time.time()
    conn = psycopg.connect(s["dsn"], autocommit=True)
    emit("ready", start_s=time.time() - begin)
    release_now = threading.Event()
    on_release(release_now.set)
    conn.execute("SELECT pg_advisory_lock(%s)", (s["key"],))   # blocks until granted
    emit("acquired")
    release_now.wait()
    conn.execute("SELECT pg_advisory_unlock(%s)", (s["key"],))
    conn.close()
    emit("closed")


MEMBERS: dict[str, Callable[[dict[str, Any]], None]] = {
    "neli": neli_member, "zk": zk_member, "etcd": etcd_member, "pg-lease": pg_lease_member,
    "pg-advisory": pg_advisory_member,
}

if __name__ == "__main__":
    MEMBERS[sys.argv[1]](json.loads(sys.argv[2]))
