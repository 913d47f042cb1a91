"""Shared deferral of the NELI sensors: wait in the triggerer, then decide again on resume."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException

if TYPE_CHECKING:
    from airflow.sdk import Context


class DeferrableNeliSensor(BaseSensorOperator):
    """A sensor that, with ``deferrable=True``, waits in ``NeliLeadershipTrigger`` between pokes.

    Subclasses set ``role``, ``neli_conn_id``, ``deployment``, ``acquire_timeout`` and
    ``deferrable``, implement ``poke``, and may narrow the trigger with
    :meth:`_trigger_run_key`. The trigger only says "worth asking again": on resume the
    sensor pokes once more and never trusts the trigger's word.
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
        return self._poke_or_defer(context)

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        """Resume after the trigger fired: poke again (decide again, never trust the trigger)."""
        event = event or {}
        if event.get("status") == "error":
            raise AirflowException(f"NELI trigger failed: {event.get('message')}")
        return self._poke_or_defer(context)

    def _poke_or_defer(self, context: Context) -> Any:
        result = self.poke(context)
        if result:
            return result.xcom_value if isinstance(result, PokeReturnValue) else None
        from neli_orchestrate.airflow.triggers.leader import NeliLeadershipTrigger

        self.defer(
            trigger=NeliLeadershipTrigger(
                role=self.role,
                run_key=self._trigger_run_key(),
                neli_conn_id=self.neli_conn_id,
                deployment=self.deployment,
                acquire_timeout=self.acquire_timeout,
                poll_interval=self.poke_interval,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )
