"""Shared deferral of the NELI sensors: wait in the triggerer, then decide again on resume."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout

from neli_orchestrate.airflow.triggers.leader import NeliLeadershipTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

#: Key of the trigger event (and of the deferral) that carries when the sensor first deferred.
WAIT_STARTED_KEY = "wait_started_at"


def default_deferrable() -> bool:
    """``[operators] default_deferrable`` (``AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE``), as
    every deferrable operator of Airflow's own providers defaults to it."""
    from airflow.sdk.configuration import conf

    return bool(conf.getboolean("operators", "default_deferrable", fallback=False))


class DeferrableNeliSensor(BaseSensorOperator):
    """A sensor that, with ``deferrable=True``, waits in ``NeliLeadershipTrigger`` between pokes.

    Subclasses set ``role``, ``neli_conn_id``, ``deployment``, ``acquire_timeout`` and
    ``deferrable``, implement ``poke``, and may narrow the trigger with
    :meth:`_trigger_run_key`. The trigger only says "worth asking again": on resume the
    sensor pokes once more and never trusts the trigger's word.

    ``timeout`` counts the whole wait, across every deferral: each deferral gets only what is
    left of it (the first deferral's wall-clock time travels in the trigger and its event).
    """

    role: str
    neli_conn_id: str
    deployment: str | None
    acquire_timeout: float | None
    deferrable: bool

    def _trigger_run_key(self) -> str | None:
        return None

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        return self._poke_or_defer(context, started_at=time.time())

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        """Resume after the trigger fired: poke again (decide again, never trust the trigger)."""
        event = event or {}
        if event.get("status") == "error":
            raise AirflowException(f"NELI trigger failed: {event.get('message')}")
        started_at = event.get(WAIT_STARTED_KEY)
        return self._poke_or_defer(
            context, started_at=float(started_at) if started_at is not None else time.time()
        )

    def _poke_or_defer(self, context: Context, *, started_at: float) -> Any:
        result = self.poke(context)
        if result:
            return result.xcom_value if isinstance(result, PokeReturnValue) else None
        # Wall clock: the wait spans processes (worker, triggerer, worker again).
        remaining = self.timeout - (time.time() - started_at)
        if remaining <= 0:
            raise AirflowSensorTimeout(
                f"{self.task_id}: still waiting for role {self.role!r} after the sensor's "
                f"timeout of {self.timeout:g} s (counted across deferrals)"
            )
        self.defer(
            trigger=NeliLeadershipTrigger(
                role=self.role,
                run_key=self._trigger_run_key(),
                neli_conn_id=self.neli_conn_id,
                deployment=self.deployment,
                acquire_timeout=self.acquire_timeout,
                poll_interval=self.poke_interval,
                wait_started_at=started_at,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=remaining),
        )
