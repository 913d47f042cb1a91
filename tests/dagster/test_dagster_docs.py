"""The Dagster guide's examples are the files the tests run, verbatim.

A code block preceded by ``<!-- excerpt: PATH -->`` in docs/guide/dagster.md must appear as is in
PATH (relative to the repository), so the guide cannot drift from the tested code.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guide" / "dagster.md"
EXCERPT = re.compile(r"<!-- excerpt: (?P<path>\S+) -->\n```python\n(?P<code>.*?)```", re.DOTALL)

pytestmark = [pytest.mark.dagster]


def _excerpts() -> list[tuple[str, str]]:
    return [(m["path"], m["code"]) for m in EXCERPT.finditer(GUIDE.read_text())]


def test_the_guide_quotes_the_example_and_the_tested_job() -> None:
    paths = {path for path, _ in _excerpts()}
    assert paths == {"dags/dagster_defs.py", "tests/dagster/dagster_test_defs.py"}


@pytest.mark.parametrize(("path", "code"), _excerpts(), ids=lambda value: value[:40])
def test_every_excerpt_in_the_guide_is_in_its_file(path: str, code: str) -> None:
    assert code in (REPO / path).read_text(), (
        f"docs/guide/dagster.md quotes {path} wrongly:\n{code}")
