"""``neli-orchestrate run``: a command exactly once across deployments, or held while leading.

Usage (the same line in every region's crontab; each region sets its own ``NELI_DEPLOYMENT``)::

    neli-orchestrate run --role billing-export --run-key 'daily/{date}' -- ./export.sh
    neli-orchestrate run --hold --role dagster-daemon -- dagster-daemon run

One-shot (:func:`run_once`): :meth:`Singleton.claim` decides; if the run key is ours, COMMAND
runs in its own process group with ``NELI_TOKEN``, ``NELI_RUN_KEY``, ``NELI_ROLE``,
``NELI_DEPLOYMENT`` and ``NELI_NAMESPACE`` in its environment; its exit status becomes the
ledger's ``COMPLETED`` (0) or ``FAILED`` and this command's exit status. Another deployment's
completion prints ``done in <deployment> (token t)`` and exits 0; a live claim elsewhere is
waited on (``--wait-timeout``). A fence stops COMMAND's process group (SIGTERM, then SIGKILL
after ``--grace``) before anything is recorded and before leadership is released.

Hold (:func:`hold`): COMMAND runs while this deployment leads ROLE (each stint is a claim of its
own run key, ``hold/<time>/<deployment>/<pid>``, so the ledger shows who held it when, under
which token); it is stopped as soon as leadership is lost and started again when this
deployment leads again.

A guard process (:data:`_GUARD_SOURCE`) outlives a frozen or killed runner: the runner pings it
while it holds the claim; when the pings stop for the member's ``heartbeat_timeout`` (SIGSTOP,
kill -9 of the runner) the guard stops COMMAND's process group, so it is gone before a successor
can lead (after the session timeout). docs/guide/run.md describes the exit statuses and the run-key
templates.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import click

from neli_orchestrate.cli._context import Target, connection_options, setting_option
from neli_orchestrate.cli._output import stderr
from neli_orchestrate.errors import (
    AuthorizationError,
    ConfigError,
    FencedError,
    KafkaUnavailableError,
    NeliError,
)

__all__ = [
    "EXIT_CONFIG",
    "EXIT_FENCED",
    "EXIT_GAVE_UP",
    "EXIT_UNAVAILABLE",
    "EXIT_WAIT_TIMEOUT",
    "render_run_key",
    "run",
]

log = logging.getLogger(__name__)

#: Waited past ``--wait-timeout`` while another deployment held the run (sysexits EX_TEMPFAIL:
#: try again later). Nothing ran here.
EXIT_WAIT_TIMEOUT = 75
#: Fenced: leadership was lost while COMMAND ran; COMMAND was stopped and nothing recorded as
#: completed (another deployment takes the run over with a larger token).
EXIT_FENCED = 76
#: The run key failed for good (``--max-attempts`` reached); reset it to run it again.
EXIT_GAVE_UP = 77
#: The cluster refused the settings or a permission (sysexits EX_CONFIG): fix and re-run.
EXIT_CONFIG = 78
#: Kafka did not answer within ``--wait-timeout`` (sysexits EX_UNAVAILABLE).
EXIT_UNAVAILABLE = 69

#: Besides the claim's own environment form (``Claim.env``: ``NELI_TOKEN``, ``NELI_RUN_KEY``,
#: ``NELI_ROLE``, ``NELI_DEPLOYMENT``), COMMAND learns the namespace it ran in.
ENV_NAMESPACE = "NELI_NAMESPACE"


def _command_env(run: Any, target: Target) -> dict[str, str]:
    """COMMAND's environment: ours, plus the claim in its one environment form."""
    return {**os.environ, **run.claim.env(), ENV_NAMESPACE: target.namespace}


# -- run-key templates -----------------------------------------------------------------------


class _Minute(datetime):
    """A datetime whose plain ``{datetime}`` is ``YYYY-MM-DDTHH:MM`` (no seconds, no offset)."""

    def __str__(self) -> str:
        return self.strftime("%Y-%m-%dT%H:%M")


def _timezone(name: str) -> tzinfo | None:
    """``utc``, ``local`` (None: the host's zone) or an IANA zone name."""
    if name.lower() == "utc":
        return ZoneInfo("UTC")
    if name.lower() == "local":
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(f"unknown time zone {name!r}: use utc, local or an IANA name such as"
                          f" Europe/Berlin") from exc


def nominal_time(now: datetime, schedule: str | None) -> datetime:
    """``now`` (aware), or the latest tick of the cron ``schedule`` at or before it.

    Two regions whose cron lines fire a little apart (start-up delay, clock error) agree on
    the tick as long as both start before the next one.
    """
    if schedule is None:
        return now
    try:
        from croniter import croniter  # type: ignore[import-untyped]
    except ImportError as exc:
        raise ConfigError("--schedule needs croniter: pip install 'neli-orchestrate[cron]'"
                          " (or use {date}-style keys without --schedule)") from exc
    if not croniter.is_valid(schedule):
        raise ConfigError(f"--schedule {schedule!r} is not a cron expression (five fields,"
                          f" e.g. '0 2 * * *')")
    # get_prev is strictly before its start: start one minute past now's minute, so a tick at
    # exactly now's minute counts.
    start = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    tick: datetime = croniter(schedule, start).get_prev(datetime)
    return tick


def render_run_key(template: str, *, now: datetime | None = None, timezone: str = "utc",
                   schedule: str | None = None) -> str:
    """The run key of ``template`` at ``now`` (default: the current time) in ``timezone``.

    Fields: ``{date}`` (``2026-11-25``), ``{hour}`` (``2026-11-25T02``), ``{datetime}``
    (``2026-11-25T02:00``), ``{now:%Y%m%d}`` (any strftime format; also ``{date:...}``).
    With ``schedule`` (cron), the time is the schedule's latest tick at or before now.
    A template without braces is the run key itself; ``{{``/``}}`` are literal braces.
    """
    zone = _timezone(timezone)
    current = (now or datetime.now(tz=ZoneInfo("UTC"))).astimezone(zone)
    when = nominal_time(current, schedule)
    naive = _Minute(when.year, when.month, when.day, when.hour, when.minute, when.second)
    fields = {"date": when.date(), "datetime": naive, "now": naive,
              "hour": naive.strftime("%Y-%m-%dT%H")}
    try:
        key = template.format(**fields)
    except KeyError as exc:
        raise ConfigError(f"run key template {template!r}: unknown field {{{exc.args[0]}}};"
                          f" use {{date}}, {{hour}}, {{datetime}} or {{now:%Y%m%d}}") from None
    except (ValueError, IndexError) as exc:
        raise ConfigError(f"run key template {template!r}: {exc} (write {{{{ and }}}} for"
                          f" literal braces)") from None
    if not key.strip():
        raise ConfigError(f"run key template {template!r} renders an empty run key")
    return key


# -- COMMAND under the supervisor, and the signals that stop it -------------------------------


class Terminated(BaseException):  # noqa: N818 - a signal, not an error of ours
    """The runner received SIGTERM or SIGINT: stop COMMAND, record, exit 128 + signal.

    A BaseException, like KeyboardInterrupt: no ``except Exception`` (a Kafka retry loop)
    can swallow it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


class CommandFailed(Exception):
    """COMMAND exited non-zero (recorded FAILED with this message)."""

    def __init__(self, code: int, command: Sequence[str], why: str = "") -> None:
        super().__init__(why if code in (126, 127) and why else
                         f"command {list(command)[:3]} exited with status {code}{why}")
        self.code = code


class _Signals:
    """SIGTERM and SIGINT for the whole command, in two modes.

    *Armed* (nothing runs): the first signal raises :class:`Terminated` in the main thread, so
    a wait on Kafka ends at once. *Supervising* (from just before COMMAND starts until
    everything it started is confirmed gone): a signal is only remembered and wakes the
    waiting main thread, which stops the work itself; no signal, however many, can raise in
    the middle of a stop.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self.supervising = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._previous: dict[int, Any] = {}

    @property
    def wake(self) -> int:
        return self._wake_r

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handler)

    def restore(self) -> None:
        for sig, old in self._previous.items():
            signal.signal(sig, old)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _handler(self, signum: int, frame: object) -> None:
        again = self.received is not None
        first = self.received if self.received is not None else signum
        self.received = first
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"!")
        if self.supervising:
            if again:
                log.warning("%s while stopping the command: the stop goes on to the end",
                            signal.Signals(signum).name)
            return
        raise Terminated(first)

    def drain(self) -> None:
        with contextlib.suppress(OSError):
            os.set_blocking(self._wake_r, False)
            while os.read(self._wake_r, 512):
                pass
        os.set_blocking(self._wake_r, True)

    def check(self) -> None:
        """Raise :class:`Terminated` if a signal came while supervising."""
        if self.received is not None:
            raise Terminated(self.received)


def _supervise(run: Any, command: Sequence[str], env: Mapping[str, str], *, grace: float,
               ping_interval: float, signals: _Signals) -> int:
    """Run COMMAND under ``run`` (a :class:`~neli_orchestrate.singleton.run.Run`); its exit status.

    Every way out stops everything COMMAND started before this returns or raises (so before
    the claim block records or releases anything): a fence (the watchdog thread's callback
    stops it and returns once it is gone), SIGTERM/SIGINT (raised as :class:`Terminated` after
    the stop), COMMAND's own exit (its leftovers are stopped), a frozen or dead runner (the
    keeper stops it when the lease, the member's leadership deadline, runs out or the
    runner's pipe closes).
    """
    from neli_orchestrate.supervise.work import CommandNotStarted, start

    signals.supervising = True  # from here no signal raises until the work is gone
    try:
        signals.check()  # a signal before the start: nothing starts
        lease = run.lease_deadline()
        if lease is None:
            run.check()  # fenced already: FencedError, nothing started
            raise FencedError(f"role {run.role!r}: not leading when the command was to start",
                              role=run.role, token=run.token)
        try:
            work = start(command, env, grace=grace, lease=lease)
        except CommandNotStarted as exc:
            stderr.print(str(exc), highlight=False, markup=False)
            raise CommandFailed(exc.status, command, str(exc)) from None
        ending = _wait(run, work, ping_interval, signals)
    finally:
        signals.supervising = False
    if ending.left:
        log.error("processes of the command survived SIGKILL: %s", list(ending.left))
    signals.check()  # stopped for a signal: recorded FAILED by the claim block
    run.check()  # fenced: FencedError, nothing recorded
    if ending.cause == "lease ended":
        # the runner stalled past its leadership deadline yet kept leadership: the command was
        # stopped all the same, so the run failed (recorded FAILED; the same deployment retries)
        raise CommandFailed(ending.exit_status, command,
                            ": this runner's proof of leadership ran out and its keeper stopped"
                            " the command")
    if ending.cause not in ("exited",):
        log.warning("the command ended: %s", ending.cause)
    return ending.exit_status


def _wait(run: Any, work: Any, ping_interval: float, signals: _Signals) -> Any:
    """Wait for ``work`` while renewing its lease; stop it on a signal or a fence."""
    done = threading.Event()

    def renew() -> None:
        while not done.wait(ping_interval):
            work.renew(run.lease_deadline())  # None once fenced or not leading: not renewed

    threading.Thread(target=renew, name="neli-run-lease", daemon=True).start()
    run.on_fence(lambda reason: work.stop(f"fenced: {reason}"))
    try:
        while True:
            ending = work.wait(wake=signals.wake)
            if ending is not None:
                return ending
            signals.drain()
            if signals.received is not None:
                return work.stop(f"terminated by {signal.Signals(signals.received).name}")
    except BaseException as exc:
        work.stop(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        done.set()

# -- the command -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Settings:
    role: str
    deployment: str
    grace: float
    wait_timeout: float
    poll: float
    ping_interval: float
    signals: _Signals


def _singleton(target: Target, **values: Any) -> Any:
    """The Singleton of this deployment, from the cluster options and the settings options
    (one conversion: :meth:`NeliSettings.singleton_config`)."""
    from neli_orchestrate.settings import NeliSettings, parse
    from neli_orchestrate.singleton.singleton import Singleton

    settings = parse(NeliSettings, {**dict(target), **values}, where="option")
    return Singleton(settings.singleton_config())


def _result(as_json: bool, data: dict[str, Any], text: str | None, *, err: bool = False) -> None:
    """The result line: JSON on stdout with ``--json``, else ``text`` (stdout or stderr)."""
    if as_json:
        click.echo(json.dumps(data, sort_keys=False, default=str))
    elif text is not None:
        click.echo(text, err=err)


def run_once(single: Any, settings: _Settings, target: Target, run_key: str,
             command: Sequence[str], as_json: bool) -> int:
    """The one-shot form: the exit status (see the module docstring and docs/guide/run.md)."""
    from neli_orchestrate import Outcome

    base = {"role": settings.role, "run_key": run_key, "deployment": settings.deployment}
    deadline = time.monotonic() + settings.wait_timeout
    last_wait = ""
    while True:
        try:
            with single.claim(settings.role, run_key) as run:
                if run.should_run:
                    env = _command_env(run, target)
                    log.info("role %r run %r: %s with token %s", settings.role, run_key,
                             run.outcome, run.token)
                    code = _supervise(run, command, env, grace=settings.grace,
                                      ping_interval=settings.ping_interval,
                                      signals=settings.signals)
                    if code != 0:
                        raise CommandFailed(code, command)  # recorded FAILED by the claim
                    token = run.token
                else:
                    token = None
                outcome, reason, record = run.outcome, run.reason, run.record
        except CommandFailed as exc:
            from neli_orchestrate.observe import ledger_time

            handoff = single.config.policy.handoff_timeout
            _result(as_json, {**base, "result": "failed", "ran_in": settings.deployment,
                              "exit_status": exc.code},
                    f"{exc}: recorded FAILED for role {settings.role!r} run {run_key!r}; this"
                    f" deployment retries first (run the line again), other deployments may"
                    f" take the run over from {ledger_time(time.time() + handoff)}"
                    f" (--handoff-timeout {handoff:g} s)", err=True)
            return exc.code
        except FencedError as exc:
            settings.signals.check()  # a fence during a stop for a signal: terminated
            _result(as_json, {**base, "result": "fenced", "token": exc.token,
                              "exit_status": EXIT_FENCED},
                    f"fenced: {exc}. The command was stopped; nothing was recorded as"
                    f" completed.", err=True)
            return EXIT_FENCED
        except KafkaUnavailableError as exc:  # transient: wait, up to --wait-timeout
            settings.signals.check()
            if time.monotonic() >= deadline:
                stderr.print(f"error: {exc}", highlight=False, markup=False)
                return EXIT_UNAVAILABLE
            log.warning("%s; retrying", exc)
            time.sleep(settings.poll)
            continue
        if token is not None:
            _result(as_json, {**base, "result": "ran", "ran_in": settings.deployment,
                              "token": token, "exit_status": 0}, None)
            return 0
        if outcome is Outcome.SKIP_DONE:
            where = record.deployment if record is not None else "?"
            done_token = record.token if record is not None else None
            _result(as_json, {**base, "result": "done", "ran_in": where, "token": done_token,
                              "exit_status": 0}, f"done in {where} (token {done_token})")
            return 0
        if outcome is Outcome.GIVE_UP:
            _result(as_json, {**base, "result": "gave_up", "exit_status": EXIT_GAVE_UP},
                    f"gave up: {reason}. Reset it to run again: neli-orchestrate ledger reset"
                    f" {settings.role} {run_key} --reason ...", err=True)
            return EXIT_GAVE_UP
        # WAIT: another deployment holds a live claim or leads the role
        if reason != last_wait:
            log.info("waiting: %s", reason)
            last_wait = reason
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            _result(as_json, {**base, "result": "wait_timeout", "reason": reason,
                              "exit_status": EXIT_WAIT_TIMEOUT},
                    f"waited {settings.wait_timeout:g} s: {reason}", err=True)
            return EXIT_WAIT_TIMEOUT
        time.sleep(min(settings.poll, remaining))  # a signal raises Terminated (nothing runs)


def hold(single: Any, settings: _Settings, target: Target, command: Sequence[str],
         restart_delay: float, as_json: bool) -> int:
    """The hold form: COMMAND runs while this deployment leads ``role``; returns on SIGTERM."""
    stints = 0
    while True:
        stamp = datetime.now(tz=ZoneInfo("UTC")).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        run_key = f"hold/{stamp}/{settings.deployment}/{os.getpid()}"
        ran = False
        try:
            with single.claim(settings.role, run_key) as run:
                if run.should_run:
                    ran = True
                    stints += 1
                    env = _command_env(run, target)
                    _result(as_json, {"role": settings.role, "event": "leading",
                                      "deployment": settings.deployment, "token": run.token,
                                      "run_key": run_key},
                            f"leading {settings.role} (token {run.token}): starting command",
                            err=True)
                    code = _supervise(run, command, env, grace=settings.grace,
                                      ping_interval=settings.ping_interval,
                                      signals=settings.signals)
                    _result(as_json, {"role": settings.role, "event": "exited",
                                      "exit_status": code, "token": run.token},
                            f"command exited with status {code} while leading; restarting"
                            f" in {restart_delay:g} s", err=True)
                    if code != 0:
                        raise CommandFailed(code, command)
        except CommandFailed:
            pass
        except FencedError as exc:
            _result(as_json, {"role": settings.role, "event": "fenced", "token": exc.token},
                    f"fenced: {exc}. The command was stopped; contending again", err=True)
        except KafkaUnavailableError as exc:
            log.warning("%s; retrying", exc)
        # A signal that came while stopping the command, whatever else ended the stint (a
        # fence may be reported instead), ends the hold here; one from now on raises.
        settings.signals.check()
        time.sleep(restart_delay if ran else settings.poll)


def _first_contact(target: Target, then: str) -> None:
    """Ask the cluster once, within ``--timeout``; if no broker answers, say so at once in
    ``doctor``'s words (the address, what to check) instead of retrying silently. A signal
    ends the wait (the probe runs on a daemon thread)."""
    outcome: list[str] = []
    answered = threading.Event()

    def probe() -> None:
        try:
            target.admin_client().list_topics(timeout=target.timeout)
        except Exception as exc:  # noqa: BLE001 - reported below; the claim retries anyway
            outcome.append(exc.args[0].str() if exc.args and hasattr(exc.args[0], "str")
                           else str(exc))
        answered.set()

    threading.Thread(target=probe, name="neli-run-contact", daemon=True).start()
    if not answered.wait(target.timeout + 1.0) or outcome:
        why = outcome[0] if outcome else "no answer"
        stderr.print(f"warning: no broker at {target.bootstrap_servers} answered within"
                     f" {target.timeout:g} s ({why}): check the address, that the listener is"
                     f" reachable from here (DNS, firewall), and"
                     f" security.protocol/sasl.*/ssl.* (-X key=value); {then}",
                     highlight=False, markup=False)


#: Seconds the ledger's Kafka clients get to close when `run` leaves on a signal or an error.
CLOSE_ON_SIGNAL = 2.0


def _close_within(single: Any, seconds: float) -> None:
    """Close ``single`` on a helper thread; give up waiting after ``seconds``."""
    thread = threading.Thread(target=single.close, name="neli-run-close", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        log.warning("the ledger's Kafka clients did not close within %g s; leaving", seconds)


def guard_margin(resolved: Any) -> float:
    """Seconds from the end of a member's last proof of leadership (its lease) to the earliest
    moment another member may lead: ``session_timeout - heartbeat_timeout -
    group_heartbeat_interval - clock_error``, the slack of the exclusive-mode rule
    (:func:`neli_orchestrate.core.config` refuses a member without it)."""
    return float(resolved.session_timeout - resolved.heartbeat_timeout
                 - resolved.group_heartbeat_interval - resolved.clock_error)


def _guard_bounds(single: Any, grace: float | None) -> tuple[float, float]:
    """(grace, lease renewal interval) from the member's timing.

    The keeper stops COMMAND when the lease (the member's leadership deadline) runs out; the
    stop (grace, then SIGKILL and its confirmation) must end before another member may lead.
    A grace, or a timing, for which it cannot is refused here, with the arithmetic.
    """
    from neli_orchestrate.supervise.keeper import KILL_BUDGET

    resolved = single.config.neli.resolved
    session, heartbeat = resolved.session_timeout, resolved.heartbeat_timeout
    margin = guard_margin(resolved)
    arithmetic = (f"session_timeout {session:g} - heartbeat_timeout {heartbeat:g} -"
                  f" group_heartbeat_interval {resolved.group_heartbeat_interval:g} -"
                  f" clock_error {resolved.clock_error:g} = {margin:g} s between the end of"
                  f" this member's last proof of leadership and the earliest moment another"
                  f" deployment may lead")
    budget = margin
    if resolved.ride_through > 0:
        # A lease that rode through a broker's crash leaves only the stop budget before a
        # successor may lead (docs/internals/protocol.md, 8a): the stop must fit that too.
        budget = min(margin, resolved.stop_budget)
        arithmetic += (f", of which a lease that rode through a broker's crash leaves"
                       f" stop_budget (session_timeout - heartbeat_timeout) / 2 ="
                       f" {resolved.stop_budget:g} s")
    limit = round(budget - KILL_BUDGET, 3)
    if limit <= 0:
        raise ConfigError(
            f"this timing cannot stop COMMAND in time: {arithmetic}, and stopping it needs"
            f" the grace plus {KILL_BUDGET:g} s for SIGKILL and its confirmation; shorten"
            f" --heartbeat-timeout or raise --session-timeout")
    if grace is None:
        grace = min(limit, max(0.0, (session - heartbeat) / 2))
    elif grace < 0:
        raise ConfigError(f"--grace must be zero or more seconds, got {grace:g}")
    elif grace > limit:
        raise ConfigError(
            f"--grace {grace:g} s is too long: {arithmetic}, and the stop takes the grace plus"
            f" {KILL_BUDGET:g} s for SIGKILL and its confirmation, so the grace may be at"
            f" most {limit:g} s; shorten --grace, shorten --heartbeat-timeout or raise"
            f" --session-timeout")
    return grace, min(0.25, heartbeat / 4)


# allow_interspersed_args off: everything from COMMAND on is COMMAND's, even without "--"
@click.command(context_settings={"allow_interspersed_args": False})
@connection_options
@click.option("--role", required=True, help="the singleton role (unit of mutual exclusion)")
@click.option("--run-key", default=None,
              help="the run (unit of exactly-once); templates {date}, {hour}, {datetime}, "
                   "{now:%Y%m%d} (required unless --hold)")
@click.option("--hold", "hold_mode", is_flag=True,
              help="keep COMMAND running while this deployment leads ROLE (restart it when "
                   "leading again) instead of running it once")
@setting_option("deployment", "--deployment", "-d", envvar="NELI_DEPLOYMENT",
                show_envvar=True, required=False, default=socket.gethostname,
                show_default="this host's name")
@click.option("--timezone", "timezone_name", default="utc", show_default=True,
              help="zone of the run-key template's time: utc, local or an IANA name")
@click.option("--schedule", default=None, metavar="CRON",
              help="the run key's time is this cron schedule's latest tick (needs croniter)")
@click.option("--wait-timeout", type=float, default=3600.0, show_default=True,
              help=f"seconds to wait while another deployment holds the run (then exit "
                   f"{EXIT_WAIT_TIMEOUT})")
@click.option("--grace", type=float, default=None,
              help="seconds between SIGTERM and SIGKILL when COMMAND is stopped (limit: session "
                   "- heartbeat timeout - group heartbeat - clock error - 1 s; default: half of "
                   "session minus heartbeat timeout, within the limit)")
@setting_option("handoff_timeout", "--handoff-timeout",
                help="seconds a FAILED run waits for its own deployment to retry before another "
                     "may take it over")
@setting_option("max_attempts", "--max-attempts")
@click.option("--restart-delay", type=float, default=5.0, show_default=True,
              help="--hold: seconds before contending again after COMMAND exited")
@setting_option("profile", "--profile", help="timing profile of the role's group")
@setting_option("group_protocol", "--group-protocol", help="group protocol of the role's group")
@setting_option("session_timeout", "--session-timeout")
@setting_option("heartbeat_timeout", "--heartbeat-timeout")
@click.option("--json", "as_json", is_flag=True, help="print the result as one JSON line")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(target: Target, role: str, run_key: str | None, hold_mode: bool, deployment: str,
        timezone_name: str, schedule: str | None, wait_timeout: float, grace: float | None,
        handoff_timeout: float, max_attempts: int | None, restart_delay: float, profile: str,
        group_protocol: str | None, session_timeout: float | None,
        heartbeat_timeout: float | None,
        as_json: bool, command: tuple[str, ...]) -> int:
    """Run COMMAND once across every deployment of the namespace (or hold it while leading).

    \b
    neli-orchestrate run --role export --run-key 'daily/{date}' -- ./export.sh
    neli-orchestrate run --hold --role dagster-daemon -- dagster-daemon run

    Exit status: COMMAND's own when it ran here; 0 and "done in <deployment> (token t)" when
    another deployment completed it; 75 waited past --wait-timeout; 76 fenced (COMMAND stopped,
    nothing recorded as completed); 77 the run key failed for good; 78 refused settings or
    permission; 69 Kafka unavailable. COMMAND gets NELI_TOKEN, NELI_RUN_KEY, NELI_ROLE,
    NELI_DEPLOYMENT and NELI_NAMESPACE in its environment.
    """
    if not deployment or not deployment.strip():
        raise click.BadParameter("must name this deployment", param_hint="--deployment")
    if wait_timeout < 0:
        raise click.BadParameter("must be zero or more seconds", param_hint="--wait-timeout")
    if hold_mode:
        if run_key is not None or schedule is not None:
            raise click.BadParameter("--hold takes no --run-key/--schedule: each leadership"
                                     " stint records its own run key", param_hint="--hold")
        key = ""
    else:
        if run_key is None:
            raise click.BadParameter("is required (or --hold)", param_hint="--run-key")
        try:
            key = render_run_key(run_key, timezone=timezone_name, schedule=schedule)
        except ConfigError as exc:
            raise click.BadParameter(str(exc), param_hint="--run-key") from None
    try:
        single = _singleton(
            target, deployment=deployment.strip(), profile=profile,
            group_protocol=group_protocol, session_timeout=session_timeout,
            heartbeat_timeout=heartbeat_timeout,
            acquire_timeout=max(5.0, min(60.0, wait_timeout)) if not hold_mode else 60.0,
            handoff_timeout=handoff_timeout, max_attempts=max_attempts)
        grace, ping = _guard_bounds(single, grace)
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None
    session = single.config.neli.resolved.session_timeout
    signals = _Signals()
    settings = _Settings(role=role, deployment=deployment.strip(), grace=grace,
                         wait_timeout=wait_timeout, poll=min(2.0, max(0.1, session / 5)),
                         ping_interval=ping, signals=signals)
    base = {"role": role, **({"run_key": key} if key else {}), "deployment": settings.deployment}
    signals.install()
    try:
        if click.get_current_context().get_parameter_source(
                "bootstrap_servers") is click.core.ParameterSource.DEFAULT:
            stderr.print(f"note: no --bootstrap-servers or NELI_BOOTSTRAP_SERVERS given: using"
                         f" {target.bootstrap_servers}", highlight=False, markup=False)
        _first_contact(target, "retrying" + ("" if hold_mode else
                                             f" for up to --wait-timeout {wait_timeout:g} s"))
        try:
            if hold_mode:
                code = hold(single, settings, target, command, restart_delay, as_json)
            else:
                code = run_once(single, settings, target, key, command, as_json)
        except BaseException:
            # Leaving on a signal or an error: nothing of ours runs any more and the role is
            # released; closing the ledger's clients may wait on an unreachable cluster.
            _close_within(single, CLOSE_ON_SIGNAL)
            raise
        single.close()
        return code
    except Terminated as exc:
        # Whatever ran here was stopped before this (and, if a claim was held, recorded FAILED).
        _result(as_json, {**base, "result": "terminated", "exit_status": 128 + exc.signum},
                f"{exc}: stopped", err=True)
        return 128 + exc.signum
    except (AuthorizationError, ConfigError) as exc:
        stderr.print(f"error: {exc}", highlight=False, markup=False)
        return EXIT_CONFIG
    except NeliError as exc:
        stderr.print(f"error: {exc}", highlight=False, markup=False)
        return 1
    finally:
        signals.restore()
