"""The sink key (neli_orchestrate.sinks.keys): one derivation, injective, role required, and
distinct from every key the previous release wrote."""

from __future__ import annotations

import itertools

import pytest

from neli_orchestrate.errors import ConfigError
from neli_orchestrate.sinks.keys import (
    KEY_PREFIX,
    LEGACY_PREFIX,
    legacy_app_id,
    parse_sink_key,
    run_prefix,
    sink_key,
)

TRICKY = ["a", "b", "c", "a/b", "b/c", "a%2Fb", "%", "%25", "=", "a=b", "date=x", "", " ",
          "ü", "日付", "🙂", "a\nb", "\x7f", "/", "//", "-", "neli.v2", "neli-orchestrate", "\\"]


def tuples():
    for role, run_key in itertools.product([t for t in TRICKY if t], repeat=2):
        for column, value in (("date", run_key), ("date", "2013-01-06"), ("d=a/t", ""),
                              ("date", "x/y")):
            yield role, run_key, column, value


def test_the_key_is_injective_over_tricky_names() -> None:
    seen: dict[str, tuple[str, str, str, str]] = {}
    for parts in tuples():
        key = sink_key(*parts)
        assert seen.setdefault(key, parts) == parts, f"{parts} and {seen[key]} share {key!r}"
        assert parse_sink_key(key) == parts
        assert key.startswith(run_prefix(parts[0], parts[1]))
        assert key.startswith(f"{KEY_PREFIX}/") and not key.startswith(f"{LEGACY_PREFIX}/")
    assert len(seen) > 2000


def test_the_issue_examples_do_not_collide() -> None:
    # role a/b with run key c against role a with run key b/c (the old key joined both with /)
    assert sink_key("a/b", "c", "date", "c") != sink_key("a", "b/c", "date", "c")
    assert run_prefix("a/b", "c") != run_prefix("a", "b/c")
    # the escape character itself: a literal "%2F" is not an escaped "/"
    assert sink_key("a%2Fb", "c", "date", "c") != sink_key("a/b", "c", "date", "c")
    # another role's prefix is never a prefix of this role's keys
    assert not sink_key("ab", "c", "date", "c").startswith(run_prefix("a", "b"))


@pytest.mark.parametrize("role", [None, "", 7])
def test_a_role_is_required(role: object) -> None:
    with pytest.raises(ConfigError, match="needs the run's role"):
        sink_key(role, "2013-01-05", "date", "2013-01-05")  # type: ignore[arg-type]


def test_legacy_keys_are_read_only_where_unambiguous() -> None:
    assert legacy_app_id("daily", "2013-01-05", "date", "2013-01-05") == (
        "neli-orchestrate/daily/2013-01-05")
    assert legacy_app_id("a/b", "c", "date", "c") is None  # the old key was ambiguous
    assert legacy_app_id("a", "b/c", "date", "b/c") is None
    assert legacy_app_id("daily", "2013-01-05", "date", "2013-01-06") is None  # not keyed then
