"""``neli-orchestrate``: see who leads, what ran where, and whether the settings hold.

\b
    neli-orchestrate status [--role R]              # leaders, members, protocol, lag per role
    neli-orchestrate ledger list [--state FAILED]   # latest state of every run key
    neli-orchestrate ledger history ROLE RUN_KEY    # every record of one run key
    neli-orchestrate run --role R --run-key 'daily/{date}' -- CMD   # CMD once, any region
    neli-orchestrate run --hold --role R -- CMD     # CMD while this deployment leads R
    neli-orchestrate doctor                         # each finding with its fix; exit 1 on errors
    neli-orchestrate kafka start [--background]     # a local broker for development

Read commands print tables, or JSON with ``--json``. Cluster options (``--bootstrap-servers``,
``--namespace``, ``-X key=value``) also come from ``NELI_BOOTSTRAP_SERVERS`` and
``NELI_NAMESPACE``. ``-v`` shows the library's (and librdkafka's) log lines on stderr.
"""

from __future__ import annotations

import logging
import sys

import click

from neli_orchestrate import __version__
from neli_orchestrate.cli.doctor import doctor
from neli_orchestrate.cli.kafka import kafka
from neli_orchestrate.cli.ledger import ledger
from neli_orchestrate.cli.run import run
from neli_orchestrate.cli.status import status

# The console script and ``python -m`` call ``main``; users run the command, they do not import
# it, so the package exports nothing (``cli`` and ``main`` stay importable from here).
__all__: list[str] = []


@click.group(help=__doc__, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="neli-orchestrate",
                      message="%(prog)s %(version)s")
@click.option("-v", "--verbose", count=True,
              help="log at INFO (-v) or DEBUG (-vv), librdkafka included")
def cli(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if verbose == 0:
        # librdkafka reports every refused connection and retry as an error; the commands
        # report what failed themselves, with the fix. -v shows those lines.
        for handler in logging.getLogger().handlers:
            handler.addFilter(_hide_librdkafka)


def _hide_librdkafka(record: logging.LogRecord) -> bool:
    return not record.name.endswith(("librdkafka", ".probe"))


# One line per command group; a new command (e.g. `kafka`) is a module with a click command
# and one add_command line here.
cli.add_command(status)
cli.add_command(ledger)
cli.add_command(doctor)
cli.add_command(kafka)
cli.add_command(run)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script's entry point)."""
    try:
        result = cli.main(args=argv, prog_name="neli-orchestrate", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    return int(result) if isinstance(result, int) else 0
