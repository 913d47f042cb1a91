"""What happened in a multi-region run, observed from outside: leadership, Spark executions,
faults, the ledger; and the checks on it (duplicates, lost runs, takeover times).

Usage::

    observer = Observer(regions, bootstrap, groups={"2013-01-01": "ns.nycflights_daily/2013-01-01"})
    observer.start()
    ...                                     # run the DAGs, inject faults (observer.fault(...))
    observer.stop()
    report = assess(observer, ledger_history(bootstrap, ledger_topic), dates, run_key_of)
    report.duplicates, report.lost

The observer polls, every ``interval`` seconds, (a) each role's consumer group (who is
assigned the leader topic's partition: the leader), mapping the member back to its region
through the process id in the member name and the harness marker in that process's
environment, and (b) the Spark driver JVMs of every region (``spark.neli.token`` and
``--date`` from their command line). The checks use only this and the committed ledger.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from integration.regions.regions import MARKER_ENV, AirflowRegion

logger = logging.getLogger(__name__)

_TOKEN = re.compile(r"spark\.neli\.token=(\d+)")
#: The example job's first line once its SparkContext exists (dags/jobs/nycflights_daily.py):
#: the application's start time (SparkContext.startTime, epoch seconds) and its token.
_APP_STARTED = re.compile(
    r"NELI application \S+ started at (\d+(?:\.\d+)?) \(token (\d+), run key ([^)\s]+)\)")
_LAUNCHER = "org.apache.spark.launcher.Main"
# member names are "<host>_<pid>_<start>" (core config), optionally "#<suffix>"
_MEMBER_PID = re.compile(r"_(\d+)_\d+(?:#\w+)?$")


@dataclass
class Span:
    """An interval [start, end] (epoch seconds) when ``region`` held/did something for ``date``."""

    region: str
    date: str
    start: float
    end: float
    token: int | None = None
    pid: int | None = None


@dataclass
class Fault:
    """A fault injected on purpose: ``kind`` (kill, stop, ...), where, when."""

    kind: str
    region: str
    date: str
    at: float
    pids: list[int] = field(default_factory=list)
    #: when a paused process was resumed (SIGSTOP → SIGCONT), else None
    resumed_at: float | None = None
    detail: str = ""


class Observer(threading.Thread):
    """Polls leadership of the role groups and the regions' Spark JVMs (see module docstring)."""

    def __init__(
        self,
        regions: Sequence[AirflowRegion],
        bootstrap_servers: str,
        groups: Mapping[str, str],
        *,
        interval: float = 0.5,
        kafka_config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(name="neli-observer", daemon=True)
        self.by_marker = {r.marker: r.name for r in regions}
        self.by_home = {str(Path(r.home).resolve()): r.name for r in regions}
        self.bootstrap_servers = bootstrap_servers
        self.groups = dict(groups)  # date -> consumer group of its role
        self.interval = interval
        self.kafka_config = dict(kafka_config or {})
        self.leadership: list[Span] = []
        self.executions: list[Span] = []
        self.faults: list[Fault] = []
        self.started_at = time.time()
        self._open_leads: dict[str, Span] = {}  # date -> open span
        self._open_jvms: dict[int, Span] = {}  # pid -> open span
        self._pid_region: dict[int, str | None] = {}
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self.errors = 0

    # -- public ----------------------------------------------------------------------------

    def unwatch(self, date: str) -> None:
        """Stop observing the role of ``date`` (its spans stay recorded)."""
        with self._lock:
            self.groups.pop(date, None)
            span = self._open_leads.pop(date, None)
            if span is not None:
                span.end = time.time()

    def fault(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)
        now = time.time()
        with self._lock:
            for span in self._open_leads.values():
                span.end = now
            for span in self._open_jvms.values():
                span.end = now
            self._open_leads.clear()
            self._open_jvms.clear()

    def running_jvms(self) -> list[Span]:
        """Spark executions observed as running now (copies)."""
        with self._lock:
            return [Span(**asdict(s)) for s in self._open_jvms.values()]

    def leader_of(self, date: str) -> str | None:
        with self._lock:
            span = self._open_leads.get(date)
            return span.region if span else None

    # -- polling ---------------------------------------------------------------------------

    def run(self) -> None:
        from confluent_kafka.admin import AdminClient

        conf: dict[str, Any] = {
            **self.kafka_config,
            "bootstrap.servers": self.bootstrap_servers,
            "logger": logging.getLogger(__name__ + ".librdkafka"),
        }
        # Role groups are polled in a thread of their own: a describe that times out (broker
        # down) must not slow down the Spark JVM polls the overlap check rests on.
        groups = threading.Thread(target=self._groups_loop, args=(conf, AdminClient),
                                  name="neli-observer-groups", daemon=True)
        groups.start()
        while not self._halt.is_set():
            began = time.monotonic()
            try:
                self._poll_jvms()
            except Exception as exc:  # noqa: BLE001 - an observer never stops the run
                self.errors += 1
                logger.warning("observer: polling Spark JVMs failed: %s", exc)
            self._halt.wait(max(0.0, self.interval - (time.monotonic() - began)))
        groups.join(timeout=30)

    def _groups_loop(self, conf: dict[str, Any], admin_class: Any) -> None:
        admin = admin_class(conf)
        failing = 0  # consecutive polls in which no group could be described
        while not self._halt.is_set():
            began = time.monotonic()
            try:
                failing = 0 if self._poll_groups(admin) else failing + 1
            except Exception as exc:  # noqa: BLE001 - an observer never stops the run
                self.errors += 1
                failing += 1
                logger.warning("observer: polling role groups failed: %s", exc)
            if failing >= 3:
                # After a broker restart an admin client can stay wedged (every request times
                # out): start a new one.
                logger.warning("observer: %d polls failed, new admin client", failing)
                admin = admin_class(conf)
                failing = 0
            self._halt.wait(max(0.0, self.interval - (time.monotonic() - began)))

    def _region_of_pid(self, pid: int) -> str | None:
        if pid not in self._pid_region:
            import psutil

            try:
                region = self._region_of(psutil.Process(pid))
            except (psutil.Error, OSError):
                return None  # gone before we looked: try again next time (never cached)
            self._pid_region[pid] = region
        return self._pid_region[pid]

    def _region_of(self, proc: Any) -> str | None:
        # The harness marker is in the environment of every process a region starts, but
        # Airflow's task processes set their title over it; they run in the region's home.
        for _ in range(4):
            marker = proc.environ().get(MARKER_ENV)
            if marker in self.by_marker:
                return self.by_marker[marker]
            cwd = proc.cwd()
            for home, name in self.by_home.items():
                if cwd == home or cwd.startswith(home + os.sep):
                    return name
            proc = proc.parent()
            if proc is None:
                return None
        return None

    def _poll_jvms(self) -> None:
        import psutil

        now = time.time()
        seen: set[int] = set()
        for proc in psutil.process_iter(["pid", "name", "cmdline"]):
            if proc.info["name"] != "java":
                continue
            cmdline = proc.info["cmdline"] or []
            text = " ".join(cmdline)
            match = _TOKEN.search(text)
            # spark-submit first runs a short launcher JVM that only builds the real command
            if match is None or "--date" not in cmdline or _LAUNCHER in cmdline:
                continue
            region = self._region_of_pid(proc.pid)
            if region is None:
                continue
            seen.add(proc.pid)
            with self._lock:
                if proc.pid not in self._open_jvms:
                    date = cmdline[cmdline.index("--date") + 1]
                    span = Span(region, date, now, now, int(match.group(1)), proc.pid)
                    self._open_jvms[proc.pid] = span
                    self.executions.append(span)
                self._open_jvms[proc.pid].end = now
        with self._lock:
            for pid in [p for p in self._open_jvms if p not in seen]:
                del self._open_jvms[pid]

    def _poll_groups(self, admin: Any) -> bool:
        """Record who leads each watched role; False when no group could be described."""
        groups = dict(self.groups)
        if not groups:
            return True
        futures = admin.describe_consumer_groups(list(groups.values()), request_timeout=20)
        now = time.time()
        described = 0
        for date, group in groups.items():
            try:
                description = futures[group].result(timeout=30)
            except Exception as exc:  # noqa: BLE001 - reported, the next poll tries again
                self.errors += 1
                logger.warning("observer: describing group %r failed: %s", group, exc)
                continue
            described += 1
            now = time.time()
            leader: tuple[str, int] | None = None
            for member in description.members or []:
                assignment = getattr(member, "assignment", None)
                partitions = getattr(assignment, "topic_partitions", None) or []
                if not partitions:
                    continue
                match = _MEMBER_PID.search(member.client_id or "")
                if match is None:
                    continue
                pid = int(match.group(1))
                region = self._region_of_pid(pid)
                if region is not None:
                    leader = (region, pid)
            with self._lock:
                span = self._open_leads.get(date)
                if span is not None and (leader is None or (span.region, span.pid) != leader):
                    del self._open_leads[date]
                    span = None
                if leader is not None:
                    if span is None:
                        span = Span(leader[0], date, now, now, pid=leader[1])
                        self._open_leads[date] = span
                        self.leadership.append(span)
                    span.end = now
        return described > 0


# -- assessment ---------------------------------------------------------------------------------


@dataclass
class DateOutcome:
    """What happened to one date across the regions."""

    date: str
    run_key: str
    ran_in: str | None  # deployment of the COMPLETED record
    token: int | None
    completed: int  # COMPLETED records in the ledger for the run key
    claims: list[tuple[str, int, float]]  # (deployment, token, at): first record of each token
    takeovers: int
    #: per fault on this date: seconds from the fault to the next claim (any region: the
    #: other region's gate or the faulted region's own Airflow retry)
    takeover_seconds: list[float]
    skipped_in: list[str]
    failed_in: dict[str, str]  # region -> reason (task FAILED)
    overlaps: list[str]  # descriptions of overlapping live executions
    sink_token: int | None  # token of the published output (commit marker, last Delta commit)
    #: (Delta version, token) of every commit of the date in the table's history, oldest first
    table_versions: list[tuple[int, int | None]] = field(default_factory=list)
    #: per fault on this date (as ``takeover_seconds``): seconds from the fault to the start of
    #: the Spark application (its SparkContext) that ran a token claimed after the fault, the
    #: job continuing the run; a fault after which no such application started has none
    running_seconds: list[float] = field(default_factory=list)
    #: the region of each of those applications (the other region, or the faulted one's own
    #: Airflow retry)
    running_in: list[str] = field(default_factory=list)
    #: per fault: seconds to the first driver JVM (spark-submit) of such a token the observer
    #: saw (polled every 0.5 s); running minus launch is Spark's own start-up
    launch_seconds: list[float] = field(default_factory=list)


@dataclass
class Report:
    """The checks of one run: ``duplicates`` and ``lost`` must both be 0."""

    dates: list[DateOutcome]
    duplicates: int
    lost: int
    faults: list[Fault]
    problems: list[str]
    started_at: float
    finished_at: float

    def to_json(self) -> dict[str, Any]:
        return {
            "duplicates": self.duplicates,
            "lost": self.lost,
            "problems": self.problems,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "dates": [asdict(d) for d in self.dates],
            "faults": [asdict(f) for f in self.faults],
        }


@dataclass
class TableState:
    """A date's commits in a Delta table's history and the rows the table holds for it now."""

    #: (version, token) of each commit whose ``neli.run_key`` is the date, oldest first; token
    #: None for a commit without the token's user metadata
    commits: list[tuple[int, int | None]]
    rows: int | None = None  # rows of the date in the table now
    distinct_rows: int | None = None  # distinct keys among them (a duplicate row shows here)
    written_rows: int | None = None  # rows the last commit of the date wrote (numOutputRows)


def check_table(date: str, state: TableState, completed: int | None,
                claimed: Iterable[int]) -> list[str]:
    """The sink check of a token-checked table: what is wrong with ``date``'s commits.

    Every committed version of the date carries the COMPLETED record's token, or a lower token
    the ledger shows claimed (a take-over superseded it); the last one carries the COMPLETED
    token; and the date's rows are that commit's (as many as it wrote, no key twice).
    """
    if completed is None:
        return []  # lost: counted as such
    problems = []
    claimed = set(claimed)
    if not state.commits:
        return [f"{date}: no commit of the date in the table's history, COMPLETED has token "
                f"{completed}"]
    for version, token in state.commits:
        if token is None:
            problems.append(f"{date}: table version {version} carries no token")
        elif token > completed:
            problems.append(f"{date}: table version {version} has token {token}, above the "
                            f"COMPLETED token {completed}")
        elif token < completed and token not in claimed:
            problems.append(f"{date}: table version {version} has token {token}, which the "
                            "ledger never claimed")
    last_version, last_token = state.commits[-1]
    if last_token != completed:
        problems.append(f"{date}: the last commit (version {last_version}) has token "
                        f"{last_token}, COMPLETED has {completed}")
    if state.rows is not None and state.written_rows is not None and (
            state.rows != state.written_rows):
        problems.append(f"{date}: the table holds {state.rows} rows of the date, the winning "
                        f"commit wrote {state.written_rows}")
    if state.rows is not None and state.distinct_rows is not None and (
            state.rows != state.distinct_rows):
        problems.append(f"{date}: {state.rows - state.distinct_rows} duplicate rows")
    return problems


def paused_seconds(fault_list: Iterable[Fault], region: str, start: float, end: float) -> float:
    """Seconds of [start, end] during which ``region``'s work was frozen by a SIGSTOP fault."""
    total = 0.0
    for fault in fault_list:
        if not fault.kind.startswith("stop") or fault.region != region:
            continue
        stop_end = fault.resumed_at if fault.resumed_at is not None else end
        total += max(0.0, min(end, stop_end) - max(start, fault.at))
    return total


def assess(
    observer: Observer,
    history: Sequence[Any],
    dates: Sequence[str],
    run_key_of: Callable[[str], str],
    *,
    task_states: Mapping[str, Mapping[str, tuple[str, str]]] | None = None,
    sink_token: Callable[[str], int | None] | None = None,
    table_state: Callable[[str], TableState] | None = None,
    fence_allowance: float = 2.0,
    app_starts: Callable[[str], Sequence[tuple[str, int, float]]] | None = None,
) -> Report:
    """Check one run: duplicates, lost runs, takeover times; docs/internals/chaos.md has the rules.

    - duplicate: a run key COMPLETED more than once; two Spark executions of one date that
      overlap in time for longer than ``fence_allowance`` while neither was frozen (a frozen
      worker is a zombie the sink must refuse, not a second live execution); a published output
      whose token is not the COMPLETED record's; with ``table_state`` (a Delta sink), every
      problem :func:`check_table` finds in the date's commits and rows.
    - lost: a date without a COMPLETED record.
    ``task_states``: date -> region -> (state of the Spark task, reason) from the orchestrator.
    ``app_starts``: date -> (region, token, epoch) of each Spark application's start (from the
    tasks' logs, :func:`application_starts`), for ``running_seconds``.
    """
    by_key: dict[str, list[Any]] = defaultdict(list)
    for record in history:
        by_key[record.run_key].append(record)
    outcomes = []
    duplicates = lost = 0
    problems: list[str] = []
    for date in dates:
        key = run_key_of(date)
        records = by_key.get(key, [])
        completed = [r for r in records if str(r.state) == "COMPLETED"]
        # a claim: the first record of each token (CLAIMED, or RUNNING when a retry re-claims)
        claims: list[tuple[str, int, float]] = []
        for record in records:
            if record.token not in {c[1] for c in claims}:
                claims.append((record.deployment, record.token, record.at))
        final = completed[-1] if completed else None
        if len(completed) > 1:
            duplicates += len(completed) - 1
            problems.append(f"{date}: COMPLETED {len(completed)} times")
        if final is None:
            lost += 1
            problems.append(f"{date}: never COMPLETED (ledger: {[str(r.state) for r in records]})")
        # live executions overlapping in time
        runs = sorted((s for s in observer.executions if s.date == date), key=lambda s: s.start)
        overlaps = []
        for i, first in enumerate(runs):
            for second in runs[i + 1 :]:
                if (first.region, first.token) == (second.region, second.token):
                    continue  # one execution seen as two processes
                start, end = max(first.start, second.start), min(first.end, second.end)
                if end <= start:
                    continue
                live = (end - start) - max(
                    paused_seconds(observer.faults, first.region, start, end),
                    paused_seconds(observer.faults, second.region, start, end),
                )
                if live > fence_allowance:
                    overlaps.append(
                        f"{first.region} (token {first.token}) and {second.region} "
                        f"(token {second.token}) ran at once for {live:.1f} s"
                    )
        if overlaps:
            duplicates += len(overlaps)
            problems.extend(f"{date}: {o}" for o in overlaps)
        published = sink_token(date) if sink_token else None
        if sink_token and final is not None and published != final.token:
            duplicates += 1
            problems.append(
                f"{date}: published output has token {published}, COMPLETED has {final.token}"
            )
        table = table_state(date) if table_state else None
        if table is not None:
            if sink_token is None:
                published = table.commits[-1][1] if table.commits else None
            found = check_table(date, table, final.token if final else None,
                                (c[1] for c in claims))
            duplicates += len(found)
            problems.extend(found)
        takeover_seconds = []
        running_seconds: list[float] = []
        running_in: list[str] = []
        launch_seconds: list[float] = []
        starts = sorted(app_starts(date), key=lambda a: a[2]) if app_starts else []
        for fault in observer.faults:
            if fault.date != date:
                continue
            later = [c for c in claims if c[2] > fault.at]
            if later:
                takeover_seconds.append(round(later[0][2] - fault.at, 3))
            tokens = {c[1] for c in later}
            started = [a for a in starts if a[1] in tokens]
            if started:
                running_seconds.append(round(started[0][2] - fault.at, 3))
                running_in.append(started[0][0])
            launched = [e.start for e in observer.executions
                        if e.date == date and e.token in tokens]
            if launched:
                launch_seconds.append(round(min(launched) - fault.at, 3))
        states = (task_states or {}).get(date, {})
        outcomes.append(
            DateOutcome(
                date=date,
                run_key=key,
                ran_in=final.deployment if final else None,
                token=final.token if final else None,
                completed=len(completed),
                claims=claims,
                takeovers=max(0, len({c[1] for c in claims}) - 1),
                takeover_seconds=takeover_seconds,
                skipped_in=sorted(r for r, (s, _) in states.items() if s == "skipped"),
                failed_in={r: why for r, (s, why) in states.items() if s == "failed"},
                overlaps=overlaps,
                sink_token=published,
                table_versions=list(table.commits) if table is not None else [],
                running_seconds=running_seconds,
                running_in=running_in,
                launch_seconds=launch_seconds,
            )
        )
    return Report(
        dates=outcomes,
        duplicates=duplicates,
        lost=lost,
        faults=[f for f in observer.faults if f.date in dates],
        problems=problems,
        started_at=observer.started_at,
        finished_at=time.time(),
    )


def application_starts(log: str) -> list[tuple[int, float]]:
    """(token, start epoch) of each Spark application start the example job logged in ``log``
    (a task's log, or spark-submit's output)."""
    return [(int(m.group(2)), float(m.group(1))) for m in _APP_STARTED.finditer(log)]


def kill_tree(pid: int, sig: int) -> list[int]:
    """Send ``sig`` to ``pid`` and every process below it; return the pids signalled."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    sent = []
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(sig)
            sent.append(proc.pid)
    return sent
