"""``neli-orchestrate kafka start|status|stop``: a local single-node broker for development."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import click

from neli_orchestrate.cli._output import emit, fail, progress
from neli_orchestrate.testing.local_kafka import KAFKA_VERSION, LocalKafka, LocalKafkaError

__all__ = ["kafka"]


def _state_dir(arg: Path | None) -> Path:
    if arg:
        return arg
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


def _running(state_dir: Path) -> dict[str, object] | None:
    state = _read_state(state_dir)
    if state and _is_our_broker(int(state["pid"]), str(state["workdir"])):  # type: ignore[call-overload]
        return state
    return None


#: Over the test broker's settings (fast groups on one node): the KIP-848 session and
#: heartbeat a stock broker has, so that what works here works against a real cluster, and
#: `neli-orchestrate doctor` passes on it (a group whose settings cannot be written falls back to
#: the broker's session, which must fit the default profile's heartbeat timeout).
DEVELOPMENT_BROKER = {
    "group.consumer.session.timeout.ms": "45000",
    "group.consumer.heartbeat.interval.ms": "5000",
}

state_dir_option = click.option(
    "--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="where the pid/state file and broker data live "
         "(default: $XDG_STATE_HOME/neli-orchestrate/kafka)")
timeout_option = click.option("--timeout", type=float, default=90.0, show_default=True,
                              help="seconds to wait")


@click.group()
def kafka() -> None:
    """A local single-node Kafka broker (KRaft) on loopback, for development and demos."""


@kafka.command()
@state_dir_option
@timeout_option
@click.option("--background", is_flag=True, help="return once ready and leave the broker running")
@click.option("--port", type=int, default=None, help="listener port (default: a free one)")
@click.option("--version", default=KAFKA_VERSION, show_default=True, help="Kafka version")
def start(state_dir: Path | None, timeout: float, background: bool, port: int | None,
          version: str) -> int:
    """Start the broker and print its bootstrap address."""
    directory = _state_dir(state_dir)
    state = _running(directory)
    if state:
        click.echo(f"already running: {state['bootstrap_servers']} (pid {state['pid']})")
        return 0
    workdir = directory / "broker"
    broker = LocalKafka(workdir=workdir, port=port, die_with_parent=not background,
                        version=version, properties=DEVELOPMENT_BROKER)
    try:
        with progress(f"starting Kafka {version} (first start fetches jars with Maven)"):
            broker.start(timeout=timeout)
    except LocalKafkaError as exc:
        raise fail(str(exc)) from None
    info = {"pid": broker.pid, "bootstrap_servers": broker.bootstrap_servers,
            "workdir": str(workdir), "log": str(broker.log_path), "version": version}
    if background:
        (directory / "kafka.json").write_text(json.dumps(info, indent=2))
        click.echo(broker.bootstrap_servers)
        return 0
    click.echo(broker.bootstrap_servers)
    stop_event = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop_event.set())
    while (not stop_event.is_set() and broker.process is not None
           and broker.process.poll() is None):
        stop_event.wait(0.5)
    broker.stop()
    return 0


@kafka.command()
@state_dir_option
@timeout_option
def stop(state_dir: Path | None, timeout: float) -> int:
    """Stop the background broker."""
    directory = _state_dir(state_dir)
    state = _read_state(directory)
    if not state:
        click.echo("not running (no state file)")
        return 0
    pid, workdir = int(state["pid"]), str(state["workdir"])  # type: ignore[call-overload]
    if _is_our_broker(pid, workdir):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        with progress(f"stopping Kafka (pid {pid})"):
            while _is_our_broker(pid, workdir) and time.monotonic() < deadline:
                time.sleep(0.1)
        if _is_our_broker(pid, workdir):
            os.kill(pid, signal.SIGKILL)
            while _is_our_broker(pid, workdir):
                time.sleep(0.05)
    (directory / "kafka.json").unlink(missing_ok=True)
    click.echo(f"stopped (pid {pid})")
    return 0


@kafka.command()
@state_dir_option
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of text")
def status(state_dir: Path | None, as_json: bool) -> int:
    """Say whether the background broker runs (exit 3 if not)."""
    state = _running(_state_dir(state_dir))
    if as_json:
        emit({"running": state is not None, **(state or {})})
    elif state:
        click.echo(f"running: {state['bootstrap_servers']} (pid {state['pid']}, "
                   f"log {state['log']})")
    else:
        click.echo("not running")
    return 0 if state else 3
