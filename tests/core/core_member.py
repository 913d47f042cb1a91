"""A NELI member as a separate process, for real-broker tests and the hand-over benchmark.

Usage: ``python core_member.py '<json settings>'``. It writes one JSON object per line to
``settings["out"]``: ``ready``, every leadership event (with the event's monotonic timestamp),
``barrier_start``/``barrier_end`` around a revoke barrier that blocks ``barrier_hold`` seconds,
``sample`` lines (is_leader per role, every ``sample_interval``) and ``closed``. Commands come
on stdin: ``close`` (graceful close, then exit). Timestamps are ``time.monotonic()``, which on
Linux is one clock for every process of the host.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from typing import Any

from neli_orchestrate.core.config import NeliConfig
from neli_orchestrate.core.events import LeaderEvent, LeaderRevoked
from neli_orchestrate.core.neli import Neli


class Out:
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
        self._lock = threading.Lock()

    def write(self, kind: str, **fields: Any) -> None:
        fields.setdefault("ts", time.monotonic())
        line = json.dumps({"kind": kind, "pid": os.getpid(), **fields})
        with self._lock:
            self._file.write(line + "\n")


def main() -> None:
    settings = json.loads(sys.argv[1])
    out = Out(settings.pop("out"))
    hold = float(settings.pop("barrier_hold", 0.0))
    sample_interval = float(settings.pop("sample_interval", 0.1))
    log_level = settings.pop("log_level", "WARNING")
    logging.basicConfig(level=log_level, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(threadName)s %(name)s %(message)s")
    if "roles" in settings:
        settings["roles"] = tuple(settings["roles"])

    def barrier(event: LeaderEvent) -> None:
        out.write("event", type=type(event).__name__, role=event.role, ts=event.timestamp,
                  reason=event.reason, seen=time.monotonic())
        if isinstance(event, LeaderRevoked) and hold > 0:
            out.write("barrier_start")
            time.sleep(hold)  # in-flight work finishing
            out.write("barrier_end")

    neli = Neli(NeliConfig(**settings), barrier)
    out.write("ready", member=neli.member_id)
    close_requested = threading.Event()

    def read_commands() -> None:
        for line in sys.stdin:
            if line.strip() == "close":
                close_requested.set()
                return
        close_requested.set()  # stdin closed: the harness is gone

    threading.Thread(target=read_commands, daemon=True).start()
    next_sample = 0.0
    while not close_requested.is_set():
        neli.pulse(0.02)
        now = time.monotonic()
        if now >= next_sample:
            out.write("sample", leads={str(r): neli.leads(r) for r in neli.roles})
            next_sample = now + sample_interval
    out.write("closing")
    neli.close()
    out.write("closed")


if __name__ == "__main__":
    main()
