"""The chaos scenario of ``neli-orchestrate run --hold`` (issue #29): faults on the runner of a
held COMMAND, with every process of the work sampled from /proc.

Usage::

    python -m integration.chaos.hold --trials 10                 # every fault, 10 trials each
    python -m integration.chaos.hold --fault net-cut --trials 3
    python -m integration.chaos.hold --fault sigterm-setsid --broken no-subreaper  # must FAIL

One invocation starts one Kafka broker with two extra client listeners, one per deployment,
each advertised at a TCP proxy of its own (``integration/regions/delay_proxy.py``): every
connection a deployment's clients make goes through its proxy, so ``net-cut`` cuts one
deployment off Kafka (a black hole) while the other keeps its network. Each trial, in a fresh
namespace: ``east`` and ``west`` each run ``neli-orchestrate run --hold -- COMMAND``; east
leads first; the fault hits east; west takes the role over. COMMAND logs its pid and token,
starts a worker in a new session (``setsid -f``: it leaves COMMAND's process group and
session, and its parent exits, so it is an orphan) and, like the worker, takes its time over
SIGTERM (it drains for 30 s; the worker ignores SIGTERM): only the supervisor's SIGKILL after
``--grace`` ends them.

Faults (on east, once its COMMAND and worker run and west contends):

- ``kill-9``: SIGKILL of the runner (its keeper stops the work when the runner's pipe closes);
- ``sigstop``: SIGSTOP of the runner (the keeper's lease, the leadership deadline, runs out);
- ``net-cut``: east's proxy drops everything, both ways (the runner fences itself; a frozen
  fence is the lease's to catch);
- ``double-sigterm``: SIGTERM, and once COMMAND has got its SIGTERM, SIGTERM and SIGINT again
  (the stop must still end with SIGKILL and nothing alive);
- ``setsid-exit``: COMMAND exits on its own after starting its setsid worker (the worker must
  be gone before the role is released and any next stint starts).

Each trial samples /proc every 10 ms for every process of the work (COMMAND and worker, both
deployments), records one ``process`` event per process (first and last sample alive, the
end being the first sample that found it gone), the ledger's records and the fault, into
``<out>/<fault>-<n>.history.jsonl``, and checks it with the chaos history checker
(``integration/chaos/history.py``) at an allowance of 0: no two tokens' work alive in the same
sample (overlap 0.00 s), tokens strictly increasing, at most one COMPLETED per run key. It
also measures the take-over: fault → west's COMMAND first seen alive. The run writes
``<out>/summary.json`` and ``summary.md``; exit status 1 when any trial has a violation or
an error. ``--broken no-subreaper`` runs the runners with a keeper that neither is a child
subreaper nor uses a cgroup (a deliberately broken supervisor): the setsid worker escapes and
the checker must report the overlap. Results and the command line: docs/internals/chaos.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from integration.chaos.history import check, write
from integration.regions.delay_proxy import DelayProxy, broker_behind_proxies

logger = logging.getLogger("integration.chaos.hold")

REPO = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results" / "hold"
DEPLOYMENTS = ("east", "west")
ROLE = "daemon"
FAULTS = ("kill-9", "sigstop", "net-cut", "double-sigterm", "setsid-exit")
BROKEN = {"no-subreaper": "a keeper that is no child subreaper and makes no cgroup"}
#: The runners' timing: a 6 s session, so a trial takes about 20 s; everything else from the
#: default profile (heartbeat timeout a third of the session, grace derived from both).
TIMING = ("--session-timeout", "6")
#: Seconds between /proc samples.
TICK = 0.01

#: COMMAND and its worker: ``python -c WORK LOG MODE``. Modes: ``hold`` (start a setsid worker,
#: drain 30 s on SIGTERM), ``exit`` (start a setsid worker, exit 0 after 1.5 s), ``worker``
#: (ignore SIGTERM). Each logs ``start`` (and ``sigterm``) with pid, token and run key.
WORK = textwrap.dedent("""
    import json, os, signal, subprocess, sys, time
    log, mode = sys.argv[1], sys.argv[2]
    def note(event):
        with open(log, "a") as f:
            f.write(json.dumps({"event": event, "pid": os.getpid(), "mode": mode,
                                "token": os.environ.get("NELI_TOKEN"),
                                "run_key": os.environ.get("NELI_RUN_KEY"),
                                "deployment": os.environ.get("NELI_DEPLOYMENT")}) + "\\n")
    if mode == "worker":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        note("start")
        while True:
            time.sleep(0.05)
    def drain(signum, frame):
        note("sigterm")
        end = time.monotonic() + 30
        while time.monotonic() < end:
            time.sleep(0.02)
        sys.exit(0)
    signal.signal(signal.SIGTERM, drain)
    note("start")
    subprocess.Popen(["setsid", "-f", sys.executable, "-c", CODE, log, "worker"])
    end = time.monotonic() + (1.5 if mode == "exit" else 3600)
    while time.monotonic() < end:
        time.sleep(0.02)
""")
WORK = "CODE = " + repr(WORK) + "\n" + WORK


class HarnessError(RuntimeError):
    pass


# -- the world: a broker, a proxy per deployment ------------------------------------------------


class HoldWorld:
    """One broker; ``proxies[deployment]`` is the only way that deployment reaches it."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proxies: dict[str, DelayProxy] = {}
        self.kafka: Any = None

    def __enter__(self) -> HoldWorld:
        from neli_orchestrate.testing.local_kafka import free_port

        listener_ports = {name: free_port() for name in DEPLOYMENTS}
        try:
            for name in DEPLOYMENTS:
                self.proxies[name] = DelayProxy(("127.0.0.1", listener_ports[name])).start()
            self.kafka = broker_behind_proxies({n: p.port for n, p in self.proxies.items()},
                                       listener_ports)
            self.kafka.start(timeout=300)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.kafka is not None:
            self.kafka.stop()
        for proxy in self.proxies.values():
            proxy.stop()

    def bootstrap(self, deployment: str) -> str:
        return f"127.0.0.1:{self.proxies[deployment].port}"


# -- a trial -------------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of ``pid``; None once it is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    rest = data[data.rfind(b")") + 2:].split()
    return rest[0].decode(), rest[19].decode()


_TICKS = os.sysconf("SC_CLK_TCK")


def _started(identity: str) -> float:
    """The wall-clock time a process started, from its /proc start time (rounded down to a
    clock tick: never later than the truth, so an overlap is never hidden by it)."""
    since = time.clock_gettime(time.CLOCK_BOOTTIME) - int(identity) / _TICKS
    return time.time() - since


@dataclass
class Seen:
    pid: int
    token: int
    run_key: str
    deployment: str
    mode: str
    identity: str  # /proc start time: never confuse a recycled pid with this process
    start: float
    end: float | None = None


class Sampler:
    """Every TICK: which of the work's processes (from the work log) live, by /proc."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.seen: dict[int, Seen] = {}
        self.samples = 0
        self.both = 0  # samples that saw two tokens' processes alive
        self._offset = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hold-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def _read(self, now: float) -> None:
        if not self.log.exists():
            return
        with open(self.log, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        complete = data[:data.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.decode().splitlines():
            event = json.loads(line)
            if event["event"] != "start" or event["pid"] in self.seen:
                continue
            st = _stat(event["pid"])
            if st is None or st[0] in ("Z", "X"):
                # gone before its first sample: it lived between two samples at most
                self.seen[event["pid"]] = Seen(event["pid"], int(event["token"]),
                                               event["run_key"], event["deployment"],
                                               event["mode"], "", now, now)
                continue
            # its start: when /proc says it started (before it could write its line)
            self.seen[event["pid"]] = Seen(event["pid"], int(event["token"]), event["run_key"],
                                           event["deployment"], event["mode"], st[1],
                                           min(now, _started(st[1])))

    def sample(self) -> None:
        now = time.time()
        self._read(now)
        tokens = set()
        for p in self.seen.values():
            if p.end is not None:
                continue
            st = _stat(p.pid)
            if st is None or st[0] in ("Z", "X") or st[1] != p.identity:
                p.end = now  # the first sample that found it gone
            else:
                tokens.add(p.token)
        self.samples += 1
        self.both += len(tokens) >= 2

    def _run(self) -> None:
        while not self._stop.wait(TICK):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def alive(self, deployment: str | None = None) -> list[Seen]:
        return [p for p in self.seen.values() if p.end is None
                and (deployment is None or p.deployment == deployment)]

    def first(self, **match: Any) -> Seen | None:
        found = [p for p in self.seen.values()
                 if all(getattr(p, k) == v for k, v in match.items())]
        return min(found, key=lambda p: p.start) if found else None


@dataclass
class Runner:
    deployment: str
    proc: subprocess.Popen[str]
    stderr: Path
    stopped: bool = False

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)


@dataclass
class Trial:
    world: HoldWorld
    fault: str
    n: int
    root: Path
    namespace: str
    broken: str | None
    sampler: Sampler
    runners: dict[str, Runner] = field(default_factory=dict)

    def start(self, deployment: str, mode: str) -> Runner:
        env = {**os.environ, "NELI_DEPLOYMENT": deployment, "NELI_NAMESPACE": self.namespace,
               "NELI_BOOTSTRAP_SERVERS": self.world.bootstrap(deployment),
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        entry = ["-m", "neli_orchestrate.cli"]
        if self.broken == "no-subreaper":
            env["NELI_SUPERVISE_MECHANISM"] = "subreaper"  # no cgroup...
            entry = ["-c", _BROKEN_RUNNER.format(keeper=str(_broken_keeper(self.root)))]
        errors = self.root / f"{deployment}.stderr"
        proc = subprocess.Popen(
            [sys.executable, *entry, "-v", "run", "--hold", "--role", ROLE, *TIMING,
             "--restart-delay", "0.5", "--json", "--",
             sys.executable, "-c", WORK, str(self.sampler.log), mode],
            env=env, stdout=open(self.root / f"{deployment}.stdout", "w"),  # noqa: SIM115
            stderr=open(errors, "w"), text=True)  # noqa: SIM115
        runner = Runner(deployment, proc, errors)
        self.runners[deployment] = runner
        return runner

    def wait(self, what: str, timeout: float, condition: Any) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            for runner in self.runners.values():
                if runner.proc.poll() is not None and not runner.stopped:
                    raise HarnessError(f"{runner.deployment}'s runner exited with"
                                       f" {runner.proc.returncode} while waiting for {what}:"
                                       f" {runner.stderr.read_text()[-2000:]}")
            time.sleep(0.02)
        raise HarnessError(f"timed out after {timeout:g} s waiting for {what}")


#: ``--broken no-subreaper``: the runner with its keeper program replaced by a broken copy.
_BROKEN_RUNNER = (
    "import sys\n"
    "import neli_orchestrate.supervise.work as w\n"
    "w._KEEPER = {keeper!r}\n"
    "w.set_subreaper = lambda: False\n"
    "from neli_orchestrate.cli import main\n"
    "sys.exit(main())\n"
)


def _broken_keeper(root: Path) -> Path:
    """keeper.py, but neither a child subreaper nor in a cgroup: only its process tree."""
    from neli_orchestrate.supervise import keeper

    text = Path(keeper.__file__).read_text()
    broken = text.replace("    reaper = set_subreaper()\n", "    reaper = False\n")
    if broken == text:
        raise HarnessError("keeper.py changed: the no-subreaper mutation no longer applies")
    path = root / "broken_keeper.py"
    path.write_text(broken)
    return path


def run_trial(world: HoldWorld, fault: str, n: int, out: Path, workdir: Path,
              broken: str | None, timeout: float) -> dict[str, Any]:
    from neli_orchestrate.core.namespace import derive

    root = workdir / f"{fault}-{n:03d}"
    root.mkdir(parents=True, exist_ok=True)
    namespace = f"hold{uuid.uuid4().hex[:10]}"
    sampler = Sampler(root / "work.log").start()
    trial = Trial(world, fault, n, root, namespace, broken, sampler)
    began = time.time()
    error = None
    injected: dict[str, Any] = {"kind": fault, "region": "east"}
    takeover = None
    east_gone = None
    margin = None
    try:
        mode = "exit" if fault == "setsid-exit" else "hold"
        trial.start("east", mode)
        first = trial.wait("east's COMMAND and its setsid worker", 120,
                           lambda: sampler.first(deployment="east", mode="worker"))
        trial.start("west", mode)
        time.sleep(1.0)  # west's runner up and contending (its group joined) before the fault
        east = trial.runners["east"]
        at = time.time()
        if fault == "kill-9":
            east.stopped = True
            east.signal(signal.SIGKILL)
        elif fault == "sigstop":
            east.stopped = True
            east.signal(signal.SIGSTOP)
        elif fault == "net-cut":
            world.proxies["east"].cut()
        elif fault == "double-sigterm":
            east.stopped = True
            east.signal(signal.SIGTERM)
            trial.wait("east's COMMAND to get SIGTERM", 30,
                       lambda: '"sigterm"' in sampler.log.read_text())
            east.signal(signal.SIGTERM)
            east.signal(signal.SIGINT)
            injected["second_signal_after"] = round(time.time() - at, 3)
        elif fault == "setsid-exit":
            command = sampler.first(deployment="east", mode="exit")
            gone = trial.wait("east's COMMAND to exit on its own", 30,
                              lambda: command is not None and command.end is not None
                              and command.end)
            at = gone
        injected["at"] = at
        successor = trial.wait(
            "another stint's COMMAND", timeout,
            lambda: [p for p in sampler.seen.values()
                     if p.token != first.token and p.mode != "worker"])
        takeover = round(min(p.start for p in successor) - at, 3)
        # east's processes must all be gone now; give a leftover time to show itself
        left_deadline = time.monotonic() + 3.0
        while time.monotonic() < left_deadline and any(
                p.token == first.token for p in sampler.alive()):
            time.sleep(0.05)
        east_left = [p for p in sampler.seen.values()
                     if p.token == first.token and p.end is None]
        east_gone = max((p.end or time.time() for p in sampler.seen.values()
                         if p.token == first.token), default=None)
        if fault == "double-sigterm":
            code = _exit_within(east.proc, 30)
            injected["exit_status"] = code
            if code != 128 + signal.SIGTERM:
                raise HarnessError(f"east exited with {code} after SIGTERM, not 143")
        time.sleep(0.5)  # both stints' processes sampled side by side for a moment
        injected["east_left_after_takeover"] = [p.pid for p in east_left]
        if east_gone is not None:
            margin = round(min(p.start for p in successor) - east_gone, 3)
    except Exception as exc:  # noqa: BLE001 - a failed trial is a result, not a crash
        error = f"{type(exc).__name__}: {exc}"
        logger.exception("hold trial %s-%s", fault, n)
    finally:
        _end(trial)
        sampler.stop()
    ledger = _ledger(world, derive(namespace).ledger_topic)
    events = _events(ledger, sampler, injected)
    name = f"{fault}-{n:03d}"
    write(events, out / f"{name}.history.jsonl")
    violations = check(events, allowance=0.0)
    overlap = _overlap([e for e in events if e["kind"] == "process"])
    result = {
        "scenario": fault, "trial": n, "broken": broken, "error": error,
        "violations": violations, "overlap_seconds": round(overlap, 3),
        "samples": sampler.samples, "samples_two_tokens_alive": sampler.both,
        "takeover_seconds": takeover,
        "east_gone_after_fault": (round(east_gone - injected["at"], 3)
                                  if east_gone is not None and "at" in injected else None),
        "margin_seconds": margin,
        "mechanism": _mechanism(root / "east.stderr"),
        "tokens": sorted({p.token for p in sampler.seen.values()}),
        "processes": len(sampler.seen), "fault": injected,
        "seconds": round(time.time() - began, 1),
    }
    (out / f"{name}.json").write_text(json.dumps(result, indent=2, default=str))
    return result


def _mechanism(stderr: Path) -> str | None:
    """How the supervisor held east's work, from its log line ("... under keeper pid N: M")."""
    for line in stderr.read_text(errors="replace").splitlines():
        if "neli_orchestrate.supervise.work: started" in line and "under keeper pid" in line:
            return line.rsplit(": ", 1)[1].split("/sys/fs/cgroup")[0].rstrip(":").strip()
    return None


def _exit_within(proc: subprocess.Popen[str], seconds: float) -> int:
    try:
        return proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        raise HarnessError(f"the runner did not exit within {seconds:g} s") from None


def _end(trial: Trial) -> None:
    """Stop both runners (SIGCONT first), heal the cut, then kill whatever the work left."""
    trial.world.proxies["east"].heal() if trial.world.proxies["east"].is_cut else None
    for runner in trial.runners.values():
        runner.signal(signal.SIGCONT)
        runner.stopped = True
        runner.signal(signal.SIGTERM)
    for runner in trial.runners.values():
        try:
            runner.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            runner.proc.kill()
            runner.proc.wait(timeout=30)
    for p in trial.sampler.alive():  # a broken variant's escapee (by pid, ours only)
        st = _stat(p.pid)
        if st is not None and st[1] == p.identity:
            os.kill(p.pid, signal.SIGKILL)


def _ledger(world: HoldWorld, topic: str) -> list[Any]:
    from integration.regions.regions import ledger_history

    return [r for r in ledger_history(world.kafka.bootstrap_servers, topic) if r.role == ROLE]


def _events(ledger: Sequence[Any], sampler: Sampler,
            injected: dict[str, Any]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for seq, r in enumerate(ledger):
        events.append({"kind": "ledger", "seq": seq, "role": r.role, "run_key": r.run_key,
                       "state": str(r.state), "token": r.token, "deployment": r.deployment,
                       "at": r.at})
    now = time.time()
    for p in sorted(sampler.seen.values(), key=lambda p: p.start):
        events.append({"kind": "process", "role": ROLE, "run_key": p.run_key,
                       "token": p.token, "region": p.deployment, "pid": p.pid,
                       "mode": p.mode, "start": p.start,
                       "end": p.end if p.end is not None else now, "paused": 0.0})
    events.append({**{k: v for k, v in injected.items()
                      if isinstance(v, (str, int, float, type(None)))},
                   "kind": "fault", "fault": injected["kind"]})
    return events


def _overlap(processes: Sequence[dict[str, Any]]) -> float:
    """Seconds during which processes of two different tokens were alive at once."""
    edges = sorted([(p["start"], 1, p["token"]) for p in processes]
                   + [(p["end"], -1, p["token"]) for p in processes])
    alive: dict[int, int] = {}
    total, since = 0.0, None
    for at, step, token in edges:
        if since is not None:
            total += at - since
            since = None
        alive[token] = alive.get(token, 0) + step
        if sum(1 for c in alive.values() if c > 0) >= 2:
            since = at
    return total


# -- the run -------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(results: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    table = {}
    for fault in dict.fromkeys(r["scenario"] for r in results):
        rows = [r for r in results if r["scenario"] == fault]
        takeovers = [r["takeover_seconds"] for r in rows if r["takeover_seconds"] is not None]
        table[fault] = {
            "trials": len(rows),
            "errors": sum(1 for r in rows if r["error"]),
            "with_violations": sum(1 for r in rows if r["violations"]),
            "overlap_max_seconds": max(r["overlap_seconds"] for r in rows),
            "takeover_p50": percentile(takeovers, 0.5),
            "takeover_p99": percentile(takeovers, 0.99),
            "east_gone_max": max((r["east_gone_after_fault"] for r in rows
                                  if r["east_gone_after_fault"] is not None), default=None),
            "margin_min": min((r["margin_seconds"] for r in rows
                               if r["margin_seconds"] is not None), default=None),
            "mechanisms": sorted({str(r["mechanism"]) for r in rows}),
        }
    return table


def markdown(table: dict[str, dict[str, Any]]) -> str:
    def num(v: Any) -> str:
        return "–" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)

    lines = ["| fault | trials | with violations | errors | overlap (max, s) | "
             "east's work gone after the fault (max, s) | gap to the next stint (min, s) | "
             "take-over p50 (s) | p99 (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for fault, row in table.items():
        lines.append(f"| {fault} | {row['trials']} | {row['with_violations']} | "
                     f"{row['errors']} | {num(row['overlap_max_seconds'])} | "
                     f"{num(row['east_gone_max'])} | {num(row['margin_min'])} | "
                     f"{num(row['takeover_p50'])} | {num(row['takeover_p99'])} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m integration.chaos.hold", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fault", action="append", choices=[*FAULTS, "all"],
                        help="fault to inject (repeatable; default all)")
    parser.add_argument("--trials", type=int, default=1, help="trials per fault")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--timeout", type=float, default=90.0,
                        help="seconds for the take-over of one trial")
    parser.add_argument("--broken", choices=sorted(BROKEN), default=None,
                        help="run a deliberately broken supervisor (the run must fail)")
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    faults = [f for f in (args.fault or ["all"]) if f != "all"] or list(FAULTS)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="neli-chaos-hold-"))
    workdir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(filename=workdir / "chaos.log", level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = args.out / (f"broken-{args.broken}" if args.broken else "latest")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.json*"):
        old.unlink()
    print(f"chaos hold: workdir {workdir}, results {out}", flush=True)
    results = []
    with HoldWorld(workdir) as world:
        for _ in range(args.trials):  # round robin: a run cut short still covers every fault
            for fault in faults:
                n = 1 + sum(1 for r in results if r["scenario"] == fault)
                result = run_trial(world, fault, n, out, workdir, args.broken, args.timeout)
                results.append(result)
                error = f" ERROR {result['error']}" if result["error"] else ""
                print(f"chaos hold: {fault} #{n}: overlap={result['overlap_seconds']:.2f} s"
                      f" takeover={result['takeover_seconds']} s"
                      f" violations={len(result['violations'])}{error}", flush=True)
                for violation in result["violations"]:
                    print(f"  {violation}", flush=True)
    table = summarize(results)
    (out / "summary.json").write_text(json.dumps({"results": table}, indent=2))
    title = f"`run --hold` chaos{' (BROKEN: ' + BROKEN[args.broken] + ')' if args.broken else ''}"
    text = f"### {title}\n\n{markdown(table)}\n"
    (out / "summary.md").write_text(text)
    print(text, flush=True)
    bad = [r for r in results if r["violations"] or r["error"]]
    print(f"chaos hold: {len(results)} trials, {len(bad)} failed checks", flush=True)
    if args.workdir is None and not bad:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
