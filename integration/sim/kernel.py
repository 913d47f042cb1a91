"""Single-threaded discrete-event kernel: simulated time, seeded randomness, processes, network.

A *process* (an OS process in the real system: a gate task, an executor task) runs one or more
*threads*, each a generator that yields commands:

- ``(SLEEP, ms)``: resume after ``ms`` of simulated time;
- ``(CALL, fn, args)``: a request to the broker. ``fn(*args)`` runs at the broker when the
  request arrives (after a random one-way delay) and its result, or its exception, comes back
  after another delay. If the deployment is cut off from the broker when the request or the
  response travels, the thread gets :class:`~neli_orchestrate.errors.KafkaUnavailableError`
  after the request timeout instead (the request may still have been applied);
- ``(STEP, label)``: a named point of the protocol where the fault plan may crash or pause
  the process;
- ``(PARK,)``: wait until someone calls :meth:`Kernel.wake` (a scheduler waiting for a task,
  a watchdog waiting for the work or for lost leadership).

:meth:`Kernel.send` is the fire-and-forget form of a call (background heartbeats): the reply,
if any, is handed to a callback in the process.

Pausing a process (SIGSTOP) holds every resumption of its threads until it continues;
crashing it (kill -9) drops them. Everything is ordered by (time, sequence number), and all
randomness comes from one ``random.Random(seed)``, so a seed replays exactly.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Generator
from typing import Any

from neli_orchestrate.errors import KafkaUnavailableError

SLEEP = 0
CALL = 1
STEP = 2
PARK = 3

Command = tuple[Any, ...]
ThreadGen = Generator[Command, Any, Any]

# One trace entry: (time ms, actor, event, detail).
TraceEntry = tuple[int, str, str, str]


class SimCrash(Exception):
    """Raised by a broker operation to kill the calling process in the middle of it."""


class Violation(Exception):
    """An invariant failed; ``invariant`` names it (S1..S4, L1; ERROR: the model crashed)."""

    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"{invariant}: {message}")
        self.invariant = invariant
        self.message = message


class Deployment:
    """An orchestrator deployment (region): clock offset, network cut, outage."""

    __slots__ = ("name", "index", "clock_offset", "cut_until", "down", "immortal")

    def __init__(self, name: str, index: int, clock_offset: int, immortal: bool) -> None:
        self.name = name
        self.index = index
        #: Wall clock minus true time, ms (bounded by the config's clock error).
        self.clock_offset = clock_offset
        self.cut_until = -1
        self.down = False
        self.immortal = immortal


class Proc:
    """A simulated OS process."""

    __slots__ = (
        "pid", "name", "deployment", "kind", "alive", "paused", "deferred", "main",
        "on_exit", "crash_midway", "steps", "died_at",
    )

    def __init__(self, pid: int, name: str, deployment: Deployment, kind: str) -> None:
        self.pid = pid
        self.name = name
        self.deployment = deployment
        self.kind = kind
        self.alive = True
        self.paused = False
        self.deferred: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        self.main: Thread | None = None
        self.on_exit: Callable[[Proc, str, Any], None] | None = None
        #: Set by the fault plan: the next ledger write dies half-way (open transaction).
        self.crash_midway = False
        #: How often each step label was reached (fault plans target the n-th occurrence).
        self.steps: dict[str, int] = {}
        self.died_at = -1


class Thread:
    __slots__ = ("proc", "gen", "name", "parked")

    def __init__(self, proc: Proc, gen: ThreadGen, name: str) -> None:
        self.proc = proc
        self.gen = gen
        self.name = name
        self.parked = False


class Kernel:
    """Event queue, clock, randomness, network and process scheduling."""

    def __init__(
        self,
        seed: int,
        *,
        min_delay: int,
        max_delay: int,
        request_timeout: int,
        trace: bool = True,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0
        self._queue: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self.min_delay = min_delay
        self.max_delay = max_delay
        self.request_timeout = request_timeout
        self.trace: list[TraceEntry] = []
        self._trace_on = trace
        self._pids = 0
        self.events = 0
        #: Called as on_step(proc, label) -> None | ("crash",) | ("pause", ms).
        self.on_step: Callable[[Proc, str], tuple[Any, ...] | None] = lambda proc, label: None

    # -- events ---------------------------------------------------------------------------

    def at(self, when: int, fn: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (when, self._seq, fn, args))

    def after(self, delay: int, fn: Callable[..., None], *args: Any) -> None:
        self.at(self.now + delay, fn, *args)

    def run(self, until: int) -> bool:
        """Run events up to time ``until``; True if the queue drained (nothing left to happen)."""
        queue = self._queue
        pop = heapq.heappop
        events = 0
        try:
            while queue:
                if queue[0][0] > until:
                    return False
                when, _, fn, args = pop(queue)
                self.now = when
                events += 1
                fn(*args)
            return True
        finally:
            self.events += events

    def log(self, actor: str, event: str, detail: str = "") -> None:
        if self._trace_on:
            self.trace.append((self.now, actor, event, detail))

    def delay(self) -> int:
        return self.min_delay + int(self.rng.random() * (self.max_delay - self.min_delay + 1))

    # -- processes ------------------------------------------------------------------------

    def spawn(self, name: str, deployment: Deployment, kind: str) -> Proc:
        self._pids += 1
        return Proc(self._pids, f"{name}#{self._pids}", deployment, kind)

    def start(self, proc: Proc, gen: ThreadGen, name: str, *, main: bool = False) -> Thread:
        thread = Thread(proc, gen, name)
        if main:
            proc.main = thread
        self.at(self.now, self._resume, thread, None, None)
        return thread

    def wake(self, thread: Thread, value: Any = None) -> None:
        """Resume ``thread`` with ``value`` if it is parked when this is delivered (else no-op)."""
        self.at(self.now, self._wake, thread, value)

    def wake_at(self, when: int, thread: Thread) -> None:
        self.at(when, self._wake, thread, None)

    def _wake(self, thread: Thread, value: Any) -> None:
        proc = thread.proc
        if not proc.alive or not thread.parked:
            return
        if proc.paused:
            proc.deferred.append((self._wake, (thread, value)))
            return
        thread.parked = False
        self._resume(thread, value, None)

    def send(
        self, proc: Proc, fn: Callable[..., Any], args: tuple[Any, ...],
        reply: Callable[..., None], *extra: Any,
    ) -> None:
        """Fire-and-forget request; ``reply(result, exc, *extra)`` runs in the process if it
        comes back (lost on a cut, dropped if the process died, held while it is paused)."""
        self.at(self.now + self.delay(), self._send_arrive, proc, fn, args, reply, extra)

    #: Set by the simulated broker: until when the answer to a request to ``fn`` is held back
    #: (a stalled high watermark), or None.
    hold_reply: Callable[[Callable[..., Any]], int | None] | None = None

    def _send_arrive(
        self, proc: Proc, fn: Callable[..., Any], args: tuple[Any, ...],
        reply: Callable[..., None], extra: tuple[Any, ...],
    ) -> None:
        if proc.deployment.cut_until > self.now:
            return
        try:
            result, exc = fn(*args), None
        except Violation:
            raise
        except Exception as error:  # noqa: BLE001 - travels back to the caller
            result, exc = None, error
        when = self.now + self.delay()
        held = self.hold_reply(fn) if self.hold_reply is not None else None
        if held is not None and held > self.now:
            when = held + self.delay()
        self.at(when, self._send_reply, proc, result, exc, reply, extra)

    def _send_reply(
        self, proc: Proc, result: Any, exc: BaseException | None,
        reply: Callable[..., None], extra: tuple[Any, ...],
    ) -> None:
        if proc.deployment.cut_until > self.now or not proc.alive:
            return
        if proc.paused:
            proc.deferred.append((self._send_reply, (proc, result, exc, reply, extra)))
            return
        reply(result, exc, *extra)

    def crash(self, proc: Proc, why: str) -> None:
        if not proc.alive:
            return
        proc.alive = False
        proc.died_at = self.now
        proc.deferred.clear()
        self.log(proc.name, "CRASH", why)
        if proc.on_exit is not None:
            proc.on_exit(proc, "crashed", why)

    def pause(self, proc: Proc, duration: int) -> None:
        if not proc.alive or proc.paused:
            return
        proc.paused = True
        self.log(proc.name, "SIGSTOP", f"for {duration} ms")
        self.after(duration, self._continue, proc)

    def _continue(self, proc: Proc) -> None:
        if not proc.alive or not proc.paused:
            return
        proc.paused = False
        self.log(proc.name, "SIGCONT")
        deferred, proc.deferred = proc.deferred, []
        for fn, args in deferred:
            fn(*args)

    def _resume(self, thread: Thread, value: Any, exc: BaseException | None) -> None:
        proc = thread.proc
        if not proc.alive:
            return
        if proc.paused:
            proc.deferred.append((self._resume, (thread, value, exc)))
            return
        gen = thread.gen
        while True:
            try:
                command = gen.throw(exc) if exc is not None else gen.send(value)
            except StopIteration as stop:
                if proc.main is thread and proc.alive:
                    proc.alive = False
                    if proc.on_exit is not None:
                        proc.on_exit(proc, "exited", stop.value)
                return
            value, exc = None, None
            kind = command[0]
            if kind == SLEEP:
                self.at(self.now + command[1], self._resume, thread, None, None)
                return
            if kind == PARK:
                thread.parked = True
                return
            if kind == CALL:
                sent = self.now
                self.at(sent + self.delay(), self._arrive, thread, command[1], command[2], sent)
                return
            # STEP: the fault plan may act here.
            label = command[1]
            proc.steps[label] = proc.steps.get(label, 0) + 1
            action = self.on_step(proc, label)
            if action is None:
                continue
            if action[0] == "crash":
                self.crash(proc, f"at step {label}")
                return
            if action[0] == "pause":
                self.pause(proc, action[1])
                self.at(self.now, self._resume, thread, None, None)
                return
            if action[0] == "midway":
                proc.crash_midway = True
                continue
            raise AssertionError(f"unknown fault action {action!r}")

    def _unavailable(self, thread: Thread, sent: int) -> None:
        err = KafkaUnavailableError(f"request timed out after {self.request_timeout} ms")
        self.at(max(self.now, sent + self.request_timeout), self._resume, thread, None, err)

    def _arrive(
        self, thread: Thread, fn: Callable[..., Any], args: tuple[Any, ...], sent: int
    ) -> None:
        deployment = thread.proc.deployment
        if deployment.cut_until > self.now:
            self._unavailable(thread, sent)
            return
        try:
            result, exc = fn(*args), None
        except SimCrash as crash:
            self.crash(thread.proc, str(crash))
            return
        except Violation:
            raise
        except Exception as error:  # noqa: BLE001 - the broker's answer travels back as-is
            result, exc = None, error
        self.at(self.now + self.delay(), self._respond, thread, result, exc, sent)

    def _respond(self, thread: Thread, result: Any, exc: BaseException | None, sent: int) -> None:
        if thread.proc.deployment.cut_until > self.now:
            self._unavailable(thread, sent)
            return
        self._resume(thread, result, exc)
