"""``neli-orchestrate`` command line: local Kafka for development and demos.

    neli-orchestrate kafka start [--background] [--port P]   # prints the bootstrap address
    neli-orchestrate kafka status
    neli-orchestrate kafka stop
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from neli_orchestrate.testing.local_kafka import KAFKA_VERSION, LocalKafka, LocalKafkaError

log = logging.getLogger("neli_orchestrate.cli")


def _state_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "neli-orchestrate" / "kafka"


def _read_state(state_dir: Path) -> dict[str, object] | None:
    try:
        return json.loads((state_dir / "kafka.json").read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def _is_our_broker(pid: int, workdir: str) -> bool:
    """True if ``pid`` is alive and is the broker started from ``workdir`` (not a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return "kafka.Kafka" in cmdline and workdir in cmdline


def _kafka_start(args: argparse.Namespace) -> int:
    state_dir = _state_dir(args.state_dir)
    state = _read_state(state_dir)
    if state and _is_our_broker(int(state["pid"]), str(state["workdir"])):  # type: ignore[call-overload]
        print(f"already running: {state['bootstrap_servers']} (pid {state['pid']})")
        return 0
    workdir = state_dir / "broker"
    kafka = LocalKafka(workdir=workdir, port=args.port, die_with_parent=not args.background,
                       version=args.version)
    try:
        kafka.start(timeout=args.timeout)
    except LocalKafkaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    info = {"pid": kafka.pid, "bootstrap_servers": kafka.bootstrap_servers,
            "workdir": str(workdir), "log": str(kafka.log_path), "version": args.version}
    if args.background:
        (state_dir / "kafka.json").write_text(json.dumps(info, indent=2))
        print(kafka.bootstrap_servers)
        return 0
    print(kafka.bootstrap_servers, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.is_set() and kafka.process is not None and kafka.process.poll() is None:
        stop.wait(0.5)
    kafka.stop()
    return 0


def _kafka_stop(args: argparse.Namespace) -> int:
    state_dir = _state_dir(args.state_dir)
    state = _read_state(state_dir)
    if not state:
        print("not running (no state file)")
        return 0
    pid, workdir = int(state["pid"]), str(state["workdir"])  # type: ignore[call-overload]
    if _is_our_broker(pid, workdir):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + args.timeout
        while _is_our_broker(pid, workdir) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _is_our_broker(pid, workdir):
            os.kill(pid, signal.SIGKILL)
            while _is_our_broker(pid, workdir):
                time.sleep(0.05)
    (state_dir / "kafka.json").unlink(missing_ok=True)
    print(f"stopped (pid {pid})")
    return 0


def _kafka_status(args: argparse.Namespace) -> int:
    state = _read_state(_state_dir(args.state_dir))
    if state and _is_our_broker(int(state["pid"]), str(state["workdir"])):  # type: ignore[call-overload]
        print(f"running: {state['bootstrap_servers']} (pid {state['pid']}, log {state['log']})")
        return 0
    print("not running")
    return 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="neli-orchestrate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    top = parser.add_subparsers(dest="command", required=True)
    kafka = top.add_parser("kafka", help="a local single-node Kafka broker (KRaft) on loopback")
    sub = kafka.add_subparsers(dest="action", required=True)
    for name, func, text in [
        ("start", _kafka_start, "start the broker and print its bootstrap address"),
        ("stop", _kafka_stop, "stop the background broker"),
        ("status", _kafka_status, "say whether the background broker runs (exit 3 if not)"),
    ]:
        p = sub.add_parser(name, help=text)
        p.set_defaults(func=func)
        p.add_argument("--state-dir", help="where the pid/state file and broker data live "
                       "(default: $XDG_STATE_HOME/neli-orchestrate/kafka)")
        p.add_argument("--timeout", type=float, default=90.0, help="seconds to wait (default 90)")
        if name == "start":
            p.add_argument("--background", action="store_true",
                           help="return once ready and leave the broker running")
            p.add_argument("--port", type=int, default=None, help="listener port (default: free)")
            p.add_argument("--version", default=KAFKA_VERSION, help="Kafka version")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
