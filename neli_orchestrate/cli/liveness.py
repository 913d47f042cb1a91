"""The deployments of a namespace and whether Kafka shows them alive (``status``'s table).

A separate read model (:class:`~neli_orchestrate.liveness.LivenessReader`) so that any front
door (the CLI's ``status``, the Airflow page) can show it.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from neli_orchestrate.cli._context import Target
from neli_orchestrate.cli._output import table, when
from neli_orchestrate.errors import KafkaUnavailableError
from neli_orchestrate.liveness import DeploymentLiveness, LivenessReader

__all__ = ["collect_liveness", "is_liveness_group", "liveness_json", "print_liveness"]


def is_liveness_group(target: Target, group_id: str) -> bool:
    """True for a deployment's liveness group (not a role's NELI group)."""
    return target.names.is_liveness_group(group_id)


def collect_liveness(target: Target, admin: Any | None = None) -> list[DeploymentLiveness]:
    """Every deployment of the namespace that ever announced its liveness, by name."""
    if admin is None:
        from neli_orchestrate.core.confluent import ConfluentKafka

        admin = ConfluentKafka().admin(target.client_config())
    return LivenessReader(admin, target.namespace, request_timeout=target.timeout).read_all()


def liveness_json(found: list[DeploymentLiveness]) -> list[dict[str, Any]]:
    return [{**asdict(d), "state": d.state.value} for d in found]


def print_liveness(target: Target, found: list[DeploymentLiveness] | None = None) -> None:
    """Print the deployments table (read now if ``found`` is None); a Kafka error is a line."""
    if found is None:
        try:
            found = collect_liveness(target)
        except KafkaUnavailableError as exc:
            print_line(f"deployment liveness: not readable ({exc})")
            return
    if not found:
        print_line("deployment liveness: none announced (liveness off, or older versions);"
                   " claims are respected for handoff_timeout")
        return
    table("deployments (liveness in Kafka)",
          ["deployment", "state", "announcers", "since", "liveness timeout"],
          [(d.deployment, d.state.value, d.members or "-", when(d.since),
            "" if d.timeout is None else f"{d.timeout:g} s") for d in found])


def print_line(text: str) -> None:
    import click

    click.echo(text)
