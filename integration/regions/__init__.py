"""The regions demo: two real Airflow regions run one DAG; each date runs once.

Usage::

    ./demo                       # from a fresh clone: set-up, then this
    python -m integration.regions [--keep] [--workdir DIR]    # from the repository root

Development tooling, not the product: it lives in the repository, outside the wheel
(docs/internals/development.md, "Where things live").

It starts a local Kafka broker and two Airflow 3.3 regions (api-server, scheduler with
LocalExecutor, triggerer; own home, database and ports), triggers the nycflights example DAG
for three dates in both regions at once, kills -9 the task process of the region running one
date mid-job, and waits while the other region takes that date over. The job writes a Delta
table (``--sink delta``, the default; ``--sink directory`` for the directory guard) on
``local[*]`` or, with ``--spark-master local-cluster|spark://H:P``, on a standalone cluster.
Then it prints a table (date → region that ran it, the ledger's token, the Delta version and
the token that committed it from the table's own history, each region's asset event of the
date, its own or by proxy, where skipped, takeovers), a summary line with the
duplicate and lost counts, writes ``neli-demo-timeline.png`` and ``neli-demo-report.json``
into the working directory and prints the regions' UI URLs; ``--keep`` leaves them running
until Ctrl-C. Exit status 0 only when duplicates = 0 and lost = 0.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]

DATES = ("2013-01-01", "2013-01-02", "2013-01-03")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="./demo",
        description="Two Airflow regions run the nycflights DAG for three dates; one region's "
        "task is killed mid-job and the other takes over; each date runs exactly once.",
    )
    parser.add_argument("--keep", action="store_true",
                        help="leave Kafka and both regions running (Ctrl-C stops them)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where homes, databases, broker data and output go "
                        "(default: a temporary directory, removed at the end)")
    parser.add_argument("--output-dir", type=Path, default=Path.cwd(),
                        help="where the PNG and the JSON report are written (default: .)")
    parser.add_argument("--bootstrap", default=None,
                        help="use this Kafka cluster instead of starting a local broker")
    parser.add_argument("--no-kill", action="store_true", help="run without the fault")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds to wait for the runs (default 600)")
    parser.add_argument("--spark-master", default=None, type=_master,
                        metavar="local-cluster|spark://HOST:PORT",
                        help="run the Spark jobs on a standalone cluster (PySpark client mode: "
                        "executors on the worker); 'local-cluster' starts one here. Default: "
                        "local[*] inside each task")
    parser.add_argument("--sink", choices=("delta", "directory"), default="delta",
                        help="where the job writes: a Delta table whose commits carry the token "
                        "(default) or Parquet behind the directory guard")
    return parser


def _master(value: str) -> str:
    from integration.regions.world import spark_master_arg

    try:
        return spark_master_arg(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; return 0 when every date ran exactly once (duplicates = lost = 0)."""
    from rich.console import Console

    from integration.regions.world import Settings, World, log_to_file, remove_workdir

    args = _parser().parse_args(argv)
    console = Console(log_path=False)  # the time, then our line: no source-file column
    if not console.is_terminal:  # piped or logged: wide enough for every column, not 80
        console.width = 160
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="neli-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log_to_file(workdir / "demo.log")
    began = time.monotonic()
    world: World | None = None
    try:
        with console.status("starting") as status:
            def progress(text: str) -> None:
                console.log(text)
                status.update(text)

            world = World.start(
                Settings(workdir=workdir, bootstrap_servers=args.bootstrap, sink=args.sink,
                         spark_master=args.spark_master),
                progress,
            )
            for region in world.regions or []:
                console.log(f"{region.name} is up: {region.api_url}")
        report, history, runs, asset_events = _run(world, console, kill=not args.no_kill,
                                                   timeout=args.timeout)
        args.output_dir.mkdir(parents=True, exist_ok=True)
        png = args.output_dir / "neli-demo-timeline.png"
        from integration.regions.timeline import draw_timeline

        assert world.observer is not None
        draw_timeline(report, world.observer, history, list(world.settings.regions), png,
                      title="neli-orchestrate demo", fences=world.fences(runs))
        data = report.to_json()
        data["wall_seconds"] = round(time.monotonic() - began, 1)
        data["bootstrap_servers"] = world.bootstrap
        data["ledger_topic"] = world.ledger_topic
        data["sink"] = world.settings.sink
        data["table"] = str(world.table) if world.settings.sink == "delta" else None
        data["spark_master"] = world.spark_master
        data["regions"] = {r.name: r.api_url for r in world.regions or []}
        data["leadership"] = [vars(s) for s in world.observer.leadership]
        data["executions"] = [vars(s) for s in world.observer.executions]
        data["asset_events"] = asset_events
        (args.output_dir / "neli-demo-report.json").write_text(json.dumps(data, indent=2))
        _print_result(console, world, report, png, time.monotonic() - began, asset_events)
        if args.keep:
            console.print("[bold]--keep:[/] the regions keep running; Ctrl-C stops them.")
            try:
                threading.Event().wait()
            except KeyboardInterrupt:
                pass
        return 0 if report.duplicates == 0 and report.lost == 0 else 1
    finally:
        if world is not None:
            with console.status("stopping the regions and Kafka"):
                world.stop()
        if args.workdir is None:
            remove_workdir(workdir)


def _run(world, console, *, kill: bool, timeout: float):  # type: ignore[no-untyped-def]
    from rich.live import Live

    dates = list(DATES)
    runs = world.trigger(dates)
    console.log(f"triggered {', '.join(dates)} in {' and '.join(runs)} at once")
    killed = None
    deadline = time.monotonic() + timeout
    with Live(_status_table(world, runs, dates, None), console=console,
              refresh_per_second=2) as live:
        while True:
            if kill and killed is None:
                span = world.mid_job(dates)
                if span is not None:
                    fault = world.kill_task(span)
                    killed = fault
                    console.log(
                        f"[red]kill -9[/] the task process of {fault.region} running "
                        f"{fault.date} mid-job (token {span.token}, pids {fault.pids})"
                    )
            live.update(_status_table(world, runs, dates, killed))
            if _all_done(world, runs):
                break
            if time.monotonic() > deadline:
                console.log("[red]runs did not finish in time[/]")
                break
            time.sleep(1.0)
        report, history = world.assess(dates, runs)
        events = world.asset_events(dates)
        # The last frame says how each date ended, not who leads (nobody does any more).
        live.update(_status_table(world, runs, dates, killed, report=report, events=events))
    console.print(_LEGEND)
    return report, history, runs, events


_LEGEND = (
    "[dim]skipped: the gate found the date claimed or done in the other region; "
    "success (proxy): the region's own try ran into the other region's completion and "
    "recorded the date's asset event by proxy instead of running it[/]"
)


def _all_done(world, runs) -> bool:  # type: ignore[no-untyped-def]
    from integration.regions.regions import TERMINAL_RUN_STATES
    from integration.regions.world import DAG_ID

    for name, by_date in runs.items():
        region = world.region(name)
        for run_id in by_date.values():
            if region.dag_run(DAG_ID, run_id)["state"] not in TERMINAL_RUN_STATES:
                return False
    return True


_STYLE = {"success": "green", "running": "yellow", "deferred": "cyan", "skipped": "dim",
          "failed": "red", "up_for_retry": "magenta", "queued": "blue", "scheduled": "blue"}


def _status_table(world, runs, dates, killed, report=None,  # type: ignore[no-untyped-def]
                  events=None):
    """The live table; with ``report`` and ``events`` (the runs ended), the last frame, whose
    last column is where each date ran instead of who leads now."""
    from rich.table import Table

    from integration.regions.world import DAG_ID

    outcomes = {o.date: o for o in report.dates} if report is not None else {}
    table = Table(title="runs (gate → Spark job → report)", expand=False)
    table.add_column("date")
    for name in runs:
        table.add_column(name)
    table.add_column("outcome" if report is not None else "leader now")
    for date in dates:
        cells = []
        for name, by_date in runs.items():
            try:
                tis = world.region(name).task_instances(DAG_ID, by_date[date])
            except Exception:  # noqa: BLE001 - the table is best effort while runs start
                cells.append("…")
                continue
            parts = []
            for task in ("claim_run", "daily_performance", "report"):
                state = (tis.get(task) or {}).get("state") or "none"
                text = f"[{_STYLE.get(state, 'white')}]{state}[/]"
                neli = ((events or {}).get(date) or {}).get(name)
                if task == "daily_performance" and state == "success" and neli and neli.get(
                        "proxy"):
                    text += " (proxy)"
                parts.append(text)
            cells.append(" → ".join(parts))
        outcome = outcomes.get(date)
        if report is None:
            last = world.observer.leader_of(date) or "-"
        elif outcome is not None and outcome.ran_in:
            last = f"ran in {outcome.ran_in} (token {outcome.token})"
        else:
            last = "[red]not run[/]"
        if killed is not None and killed.date == date:
            last += f"  [red](killed in {killed.region})[/]"
        table.add_row(date, *cells, last)
    return table


def _asset_cell(events: dict[str, dict[str, object] | None]) -> str:
    """One date's asset event in each region: ``us-east-1 ran t6 · eu-west-1 proxy t6``."""
    parts = []
    for region, neli in events.items():
        if neli is None:
            parts.append(f"{region} [red]none[/]")
        else:
            kind = "proxy" if neli.get("proxy") else "ran"
            parts.append(f"{region} {kind} t{neli.get('token')}")
    return " · ".join(parts) or "-"


def _print_result(console, world, report, png: Path, wall: float,  # type: ignore[no-untyped-def]
                  asset_events=None) -> None:
    from rich.table import Table

    delta = world.settings.sink == "delta"
    table = Table(title="each date, across the regions")
    columns = ["date", "ran in", "ledger token"]
    if delta:
        # from the Delta table's own history: the version holding the date, the token in it
        columns += ["Delta version", "Delta token", "Delta commits (v: token)"]
    else:
        columns += ["output token"]
    # each region's asset event of the date (its own, or by proxy), from its REST API
    columns += ["asset event (each region)"]
    for column in (*columns, "skipped in", "failed in (reason)", "takeovers"):
        table.add_column(column)
    for outcome in report.dates:
        failed = "; ".join(f"{r}: {why[:70]}" for r, why in outcome.failed_in.items()) or "-"
        takeover = str(outcome.takeovers)
        if outcome.takeover_seconds:
            takeover += " (" + ", ".join(f"{s:.1f} s" for s in outcome.takeover_seconds) + ")"
        if delta:
            last = outcome.table_versions[-1] if outcome.table_versions else (None, None)
            sink = [str(last[0]), str(last[1]),
                    ", ".join(f"{v}: {t}" for v, t in outcome.table_versions) or "-"]
        else:
            sink = [str(outcome.sink_token)]
        sink.append(_asset_cell((asset_events or {}).get(outcome.date) or {}))
        table.add_row(outcome.date, outcome.ran_in or "[red]nobody[/]", str(outcome.token),
                      *sink, ", ".join(outcome.skipped_in) or "-", failed, takeover)
    console.print(table)
    colour = "green" if report.duplicates == 0 and report.lost == 0 else "red"
    console.print(
        f"[bold {colour}]duplicates = {report.duplicates}, lost = {report.lost}[/] "
        f"({len(report.dates)} dates, {len(world.settings.regions)} regions, "
        f"{len(report.faults)} fault(s), {wall:.0f} s, Spark on {world.spark_master}, "
        f"sink {world.settings.sink})"
    )
    if delta:
        console.print(f"Delta table: {world.table}")
    for problem in report.problems:
        console.print(f"[red]  {problem}[/]")
    console.print(f"timeline: {png.resolve()}")
    for region in world.regions or []:
        console.print(f"{region.name} UI: {region.api_url}")
