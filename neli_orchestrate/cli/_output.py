"""How commands show results: rich tables for people, ``--json`` for scripts, progress on stderr."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from neli_orchestrate.observe import iso_time

__all__ = ["emit", "fail", "json_option", "progress", "stderr", "stdout", "table", "when"]

# Wide enough that tables do not wrap when stdout is a pipe (rich defaults to 80 columns there).
stdout = Console(soft_wrap=False, width=None if sys.stdout.isatty() else 200)
stderr = Console(stderr=True)


def json_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--json``: print one JSON document on stdout instead of a table (every read command)."""
    return click.option("--json", "as_json", is_flag=True,
                        help="print JSON instead of a table")(func)


@contextlib.contextmanager
def progress(text: str) -> Iterator[None]:
    """A spinner on stderr while something slow runs; silent when stderr is not a terminal."""
    if stderr.is_terminal:
        with stderr.status(text):
            yield
    else:
        yield


#: Epoch seconds as an ISO-8601 UTC time (to the millisecond), '' for None.
when = iso_time


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]], *,
          width: int | None = None, whole: Sequence[str] = ()) -> None:
    """Print a table on stdout; with ``width``, laid out in at most that many columns (rich
    folds the widest cells, never those of the ``whole`` columns)."""
    out = Table(title=title, title_justify="left", show_lines=False)
    for column in columns:
        out.add_column(column, overflow="fold", no_wrap=column in whole)
    for row in rows:
        out.add_row(*(cell if isinstance(cell, Text) else escape("" if cell is None else str(cell))
                      for cell in row))
    stdout.print(out, width=None if width is None else min(width, stdout.width))


def emit(data: Any) -> None:
    """Print ``data`` as one JSON document on stdout."""
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def fail(message: str, code: int = 1) -> click.exceptions.Exit:
    """Print ``error: message`` on stderr; return an Exit to raise with ``code``."""
    stderr.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    return click.exceptions.Exit(code)
