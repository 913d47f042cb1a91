"""NeliLeadershipTrigger: wait in the triggerer until this deployment may lead a role (or run).

Usage (what the deferrable gate and sensor do)::

    self.defer(trigger=NeliLeadershipTrigger(role="daily", run_key="dag/2013-01-05T00:00:00+00:00"),
               method_name="execute_complete")

Events (``event.payload``):

- ``{"status": "leader", ...}``: this deployment could lead ``role`` just now (and, with a
  run key, the ledger no longer tells it to wait).
- ``{"status": "done", "record": {...}}``: with a run key: the run is COMPLETED (or failed for
  good); the task resumes and skips or fails.
- ``{"status": "error", "message": ...}``: the trigger could not check (bad configuration).

The trigger only reads (ledger replay, a short leadership attempt that it releases at once); it
never claims. The resumed task decides again, because leadership can move between the event and
the task resuming. Every Kafka call runs in a worker thread (``asyncio.to_thread``): nothing
blocks the triggerer's event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from neli_orchestrate.airflow.claims import describe, open_singleton, record_to_dict
from neli_orchestrate.errors import ConfigError, KafkaUnavailableError

logger = logging.getLogger(__name__)

#: Seconds before the first check. Airflow 3.3 fails a deferred task whose trigger fires so
#: soon that the resumed try is RUNNING before the scheduler drains the executor's stale
#: "success" event of the deferring try (apache/airflow#72716, #71580; observed here with
#: LocalExecutor after ~6 s). Waiting this long first keeps clear of that window.
MIN_FIRST_CHECK = 15.0


class NeliLeadershipTrigger(BaseTrigger):
    """Fire when this deployment can lead ``role`` (and, given ``run_key``, may run it).

    :param role: the singleton role.
    :param run_key: optional run key: also wait while the ledger says WAIT, fire ``done`` when
        the run completed.
    :param neli_conn_id: ``neli`` or ``kafka`` connection.
    :param deployment: overrides the connection's deployment id.
    :param acquire_timeout: seconds one leadership attempt may take.
    :param poll_interval: seconds between checks.
    :param first_check: seconds before the first check (default ``MIN_FIRST_CHECK``, or
        ``poll_interval`` if larger).
    :param wait_started_at: wall-clock time the waiting task first deferred; echoed in every
        event so the task's ``timeout`` counts the whole wait across deferrals.
    """

    def __init__(
        self,
        *,
        role: str,
        run_key: str | None = None,
        neli_conn_id: str = "neli_default",
        deployment: str | None = None,
        acquire_timeout: float | None = None,
        poll_interval: float = 30.0,
        first_check: float | None = None,
        wait_started_at: float | None = None,
    ) -> None:
        super().__init__()
        self.role = role
        self.run_key = run_key
        self.neli_conn_id = neli_conn_id
        self.deployment = deployment
        self.acquire_timeout = acquire_timeout
        self.poll_interval = float(poll_interval)
        self.first_check = (
            float(first_check)
            if first_check is not None
            else max(MIN_FIRST_CHECK, self.poll_interval)
        )
        self.wait_started_at = wait_started_at

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "role": self.role,
                "run_key": self.run_key,
                "neli_conn_id": self.neli_conn_id,
                "deployment": self.deployment,
                "acquire_timeout": self.acquire_timeout,
                "poll_interval": self.poll_interval,
                "first_check": self.first_check,
                "wait_started_at": self.wait_started_at,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow.sdk import BaseHook

        try:
            connection = await BaseHook.aget_connection(self.neli_conn_id)
            # Importing the hook, parsing the connection and masking secrets: off the loop too.
            hook = await asyncio.to_thread(self._hook, connection)
        except Exception as exc:  # noqa: BLE001 - reported to the task, which fails
            yield self._event({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
            return
        checks = 0
        await asyncio.sleep(self.first_check)
        while True:
            checks += 1
            try:
                event = await asyncio.to_thread(self.check, hook)
            except ConfigError as exc:
                yield self._event({"status": "error", "message": str(exc)})
                return
            except KafkaUnavailableError as exc:
                self.log.warning("Kafka unavailable, checking again later: %s", exc)
                event = None
            if event is not None:
                event["checks"] = checks
                yield self._event(event)
                return
            await asyncio.sleep(self.poll_interval)

    def _event(self, payload: dict[str, Any]) -> TriggerEvent:
        if self.wait_started_at is not None:
            payload["wait_started_at"] = self.wait_started_at
        return TriggerEvent(payload)

    def _hook(self, connection: Any) -> Any:
        from neli_orchestrate.airflow.hooks.neli import NeliHook

        hook = NeliHook(
            self.neli_conn_id,
            deployment=self.deployment,
            acquire_timeout=self.acquire_timeout,
            connection=connection,
        )
        hook.settings  # noqa: B018 - parse now: a broken connection is reported at once
        return hook

    def check(self, hook: Any) -> dict[str, Any] | None:
        """One blocking check (run in a worker thread); an event payload, or None to wait."""
        with open_singleton(hook) as singleton:
            record = None
            if self.run_key is not None:
                record = singleton.status(self.role, self.run_key)
                decision = _decide(singleton, hook, record)
                if decision.outcome in ("SKIP_DONE", "GIVE_UP"):
                    return {
                        "status": "done",
                        "outcome": str(decision.outcome),
                        "record": record_to_dict(record),
                    }
                if decision.outcome == "WAIT":
                    self._waiting(f"{decision.reason} (latest record: {describe(record)})")
                    return None
            # Singleton.leads never joins a busy group (the busy-group rule lives there).
            if singleton.leads(self.role, self._leads_timeout(hook)):
                return {"status": "leader", "role": self.role, "deployment": hook.deployment}
            self._waiting(
                f"role {self.role!r} is led by another member"
                + (f" (latest record: {describe(record)})" if self.run_key else "")
            )
            return None

    def _waiting(self, reason: str) -> None:
        # One line per change of reason, not one per poll: the task's log stays readable.
        if reason != getattr(self, "_last_reason", None):
            self._last_reason = reason
            what = f"run {self.run_key!r}" if self.run_key else f"role {self.role!r}"
            self.log.info("Waiting for %s: %s", what, reason)

    def _leads_timeout(self, hook: Any) -> float:
        if self.acquire_timeout is not None:
            return float(self.acquire_timeout)
        configured = hook.settings.acquire_timeout
        # A check is a probe, not a wait: keep it well below the poll interval.
        return float(configured) if configured is not None else min(10.0, self.poll_interval)


def _decide(singleton: Any, hook: Any, record: Any) -> Any:
    """What the decision table says about ``record`` for this deployment, right now, with the
    claiming deployment's liveness as the gate reads it: a gone deployment's claim or failed
    try is not waited for (the resumed gate decides again, and takes it over)."""
    from neli_orchestrate.singleton.probe import decide_now

    return decide_now(singleton, record, member=f"{hook.deployment}-trigger")
