"""The deployments of a namespace and whether Kafka shows them alive (``status``'s table).

Renders the read model's :func:`~neli_orchestrate.observe.collect_liveness` (any front door,
the CLI's ``status`` or the Airflow page, can show it).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from neli_orchestrate.cli._context import Target
from neli_orchestrate.cli._output import table, when
from neli_orchestrate.errors import KafkaUnavailableError
from neli_orchestrate.observe import collect_liveness

if TYPE_CHECKING:
    from neli_orchestrate.observe import DeploymentLiveness

__all__ = ["liveness_json", "print_liveness"]


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
