"""``neli-orchestrate demo``: two Airflow regions, one broker, three dates, one kill -9."""

from __future__ import annotations

import click


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                      "help_option_names": []},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def demo(args: tuple[str, ...]) -> int:
    """Run the two-region demo (options: neli-orchestrate demo --help; see docs/guide/demo.md)."""
    # The demo keeps its own argparse options so `python -m neli_orchestrate.demo` and this
    # command take the same flags; it needs the airflow and spark extras, imported only here.
    from neli_orchestrate.demo import main

    return main(list(args))
