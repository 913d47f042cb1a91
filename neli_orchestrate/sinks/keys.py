"""The one derivation of the key a table sink records a fencing token under.

A token-checked table sink stores "the highest token committed" per *sink key*: the role (whose
tokens are ordered), the run key, and what the write replaces (the partition
``column = value``). The key is built here and nowhere else; every sink (Delta via Spark, Delta
via delta-rs, Iceberg via Spark, pyiceberg) calls :func:`sink_key`.

Form::

    neli.v2/<role>/<run key>/<column>=<value>

Each part is escaped (``%``, ``/``, ``=`` and control characters become ``%XX`` of their UTF-8
bytes; everything else, unicode included, stays readable), so the key is injective: two
different ``(role, run key, column, value)`` tuples never give the same key, and
:func:`parse_sink_key` returns the tuple back. ``neli.v2/`` can never begin a key of the
previous release (``neli-orchestrate/<role>/<run key>``, joined with ``/`` unescaped, role
``-`` when None), so old and new keys never collide.

Reading the previous release's keys: :func:`legacy_app_id` returns the old key of
``(role, run key)`` only where it is unambiguous (neither part contains ``/``; then no other
pair joins to the same string) and the write replaces the default partition (value = run key,
the only partition the old release keyed). The Delta sinks read the token recorded under it as
well, so a table written by the previous release keeps refusing that release's stale writers.
"""

from __future__ import annotations

from neli_orchestrate.errors import ConfigError

#: The first part of every key; the previous release's keys start with ``neli-orchestrate/``.
KEY_PREFIX = "neli.v2"

#: The previous release's prefix (``neli-orchestrate/<role>/<run key>``).
LEGACY_PREFIX = "neli-orchestrate"

_ESCAPED = frozenset("%/=")


def _escape(part: str) -> str:
    out: list[str] = []
    for char in part:
        if char in _ESCAPED or ord(char) < 0x20 or char == "\x7f":
            out.extend(f"%{byte:02X}" for byte in char.encode("utf-8"))
        else:
            out.append(char)
    return "".join(out)


def _unescape(part: str) -> str:
    raw = bytearray()
    index = 0
    while index < len(part):
        char = part[index]
        if char == "%":
            raw.append(int(part[index + 1 : index + 3], 16))
            index += 3
        else:
            raw.extend(char.encode("utf-8"))
            index += 1
    return raw.decode("utf-8")


def require_role(role: object) -> str:
    """``role`` if it is a non-empty string; a ConfigError that says why otherwise."""
    if not isinstance(role, str) or not role:
        raise ConfigError(
            f"a token-checked sink needs the run's role (a non-empty string), got {role!r}: "
            "tokens are ordered only within one role, so a sink keyed without it would compare "
            "tokens of unrelated jobs. Pass role=run.role (the Dagster resource and the Airflow "
            "gate derive one; a spark-submit job reads it from spark.neli.role)"
        )
    return role


def require_run_key(run_key: object) -> str:
    """``run_key`` if it is a non-empty string; ConfigError otherwise."""
    if not isinstance(run_key, str) or not run_key:
        raise ConfigError(f"run_key must be a non-empty string, got {run_key!r}")
    return run_key


def run_prefix(role: str, run_key: str) -> str:
    """The prefix every key of ``(role, run key)`` starts with, whatever it replaces."""
    return f"{KEY_PREFIX}/{_escape(require_role(role))}/{_escape(require_run_key(run_key))}/"


def sink_key(role: str, run_key: str, column: str, value: object) -> str:
    """The key a sink records the token under for a write replacing ``column = value``."""
    if not isinstance(column, str) or not column:
        raise ConfigError(f"partition column must be a non-empty string, got {column!r}")
    return f"{run_prefix(role, run_key)}{_escape(column)}={_escape(str(value))}"


def parse_sink_key(key: str) -> tuple[str, str, str, str] | None:
    """``(role, run key, column, value)`` of a key made by :func:`sink_key`; None for others."""
    parts = key.split("/")
    if len(parts) != 4 or parts[0] != KEY_PREFIX or parts[3].count("=") != 1:
        return None
    column, value = parts[3].split("=")
    return _unescape(parts[1]), _unescape(parts[2]), _unescape(column), _unescape(value)


def legacy_app_id(role: str, run_key: str, column: str, value: object) -> str | None:
    """The previous release's key of this write, where it can be read without ambiguity.

    None when the write replaces another partition than the run key's own (the old release
    keyed only that one) or when role or run key contains ``/`` (the old key was ambiguous).
    """
    del column  # the old key did not name the column: any column holding the run key matched
    if str(value) != run_key or "/" in role or "/" in run_key:
        return None
    return f"{LEGACY_PREFIX}/{role}/{run_key}"
