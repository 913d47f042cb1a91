"""NeliLeaderSensor: wait until this deployment leads a role (deployment-level leadership).

Usage::

    leading = NeliLeaderSensor(task_id="leading", role="eu-reports", mode="reschedule")
    leading >> build_reports            # runs only in the region that leads "eu-reports"

For DAGs that should run in one region at a time as a whole. For exactly-once runs of a
singleton task use LeaderGateOperator + a fenced operator instead: this sensor only observes
leadership at one moment and holds nothing afterwards.

.. note:: Leadership can move right after the sensor succeeds (a deployment dies, a rebalance).
   The sensor does not fence what runs after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import PokeReturnValue
from airflow.sdk.exceptions import AirflowFailException

from neli_orchestrate.airflow.claims import open_singleton
from neli_orchestrate.airflow.hooks.neli import NeliHook
from neli_orchestrate.airflow.sensors.base import DeferrableNeliSensor, default_deferrable
from neli_orchestrate.errors import ConfigError, KafkaUnavailableError

if TYPE_CHECKING:
    from airflow.sdk import Context


class NeliLeaderSensor(DeferrableNeliSensor):
    """Succeed once this deployment leads ``role``; poke, reschedule or deferrable.

    :param role: the role (templated).
    :param neli_conn_id: ``neli`` or ``kafka`` connection.
    :param deployment: overrides the connection's deployment id.
    :param acquire_timeout: seconds one poke waits to become leader (connection default, else
        the smaller of 10 s and ``poke_interval``).
    :param deferrable: wait in the triggerer (NeliLeadershipTrigger) instead of a worker slot;
        default ``[operators] default_deferrable``.

    Pushes ``{"role", "deployment"}`` as XCom on success.
    """

    template_fields: Sequence[str] = ("role",)
    ui_color = "#d7e4ec"

    def __init__(
        self,
        *,
        role: str,
        neli_conn_id: str = NeliHook.default_conn_name,
        deployment: str | None = None,
        acquire_timeout: float | None = None,
        deferrable: bool | None = None,
        poke_interval: float | timedelta = 30,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        if not role:
            raise ValueError(f"{type(self).__name__} {self.task_id!r}: role must not be empty")
        self.role = role
        self.neli_conn_id = neli_conn_id
        self.deployment = deployment
        self.acquire_timeout = acquire_timeout
        self.deferrable = default_deferrable() if deferrable is None else deferrable

    def _hook(self) -> NeliHook:
        return NeliHook(
            self.neli_conn_id, deployment=self.deployment, acquire_timeout=self.acquire_timeout
        )

    def _probe_timeout(self, hook: NeliHook) -> float:
        if self.acquire_timeout is not None:
            return float(self.acquire_timeout)
        configured = hook.settings.acquire_timeout
        return float(configured) if configured is not None else min(10.0, self.poke_interval)

    def poke(self, context: Context) -> bool | PokeReturnValue:
        """One attempt: does this deployment lead the role now?"""
        hook = self._hook()
        try:
            with open_singleton(hook) as singleton:
                # Singleton.leads answers False without joining while the group is busy.
                leads = singleton.leads(self.role, self._probe_timeout(hook))
        except ConfigError as exc:
            raise AirflowFailException(f"NELI configuration error: {exc}") from exc
        except KafkaUnavailableError as exc:
            self.log.warning("Kafka unavailable, will try again: %s", exc)
            return False
        if not leads:
            self.log.info("Role %r is led by another deployment; waiting", self.role)
            return False
        self.log.info("Deployment %r leads role %r", hook.deployment, self.role)
        return PokeReturnValue(
            is_done=True, xcom_value={"role": self.role, "deployment": hook.deployment}
        )

