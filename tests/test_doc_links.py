"""The docs hold together: every relative link in README.md and docs/ opens a file, every
repository path the code and the docs cite exists, and the index lists both parts."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"

#: ``[text](target)`` and ``![alt](target)``; a target ends at whitespace (a title) or ``)``.
_INLINE = re.compile(r"!?\[[^\]]*\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)")
#: ``[label]: target`` reference definitions.
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s|$)", re.MULTILINE)
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
#: A repository path cited in prose, a docstring or a message: ``docs/guide/spark.md``,
#: ``neli_orchestrate/core/kafka.py``, ``tests/cli/test_run.py`` (globs and folders are not).
_CITED = re.compile(r"(?<![\w./-])(?:neli_orchestrate|tests|integration|dags|docs|\.ci)/"
                    r"[\w./-]*\w\.(?:py|md|toml|xml|json|png|properties)\b")


def markdown_files(repo: Path = REPO) -> list[Path]:
    return [repo / "README.md", repo / "CHANGELOG.md", *sorted((repo / "docs").rglob("*.md"))]


def relative_links(text: str) -> list[str]:
    """The relative link targets of a Markdown text, without anchors; code is not Markdown."""
    text = _CODE_SPAN.sub("", _FENCE.sub("", text))
    targets = _INLINE.findall(text) + _REFERENCE.findall(text)
    found = []
    for target in targets:
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("#", "/")):
            continue  # http:, mailto:, an anchor in the same page, a site-absolute path
        found.append(target.split("#", 1)[0].split("?", 1)[0])
    return found


def broken_links(repo: Path = REPO) -> list[str]:
    broken = []
    for page in markdown_files(repo):
        for target in relative_links(page.read_text()):
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(repo)}: {target}")
    return broken


def test_every_relative_link_opens_a_file() -> None:
    assert broken_links() == []


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    (tmp_path / "docs" / "guide").mkdir(parents=True)
    (tmp_path / "CHANGELOG.md").write_text("")
    (tmp_path / "README.md").write_text("[guide](docs/guide/a.md) [gone](docs/a.md)\n")
    (tmp_path / "docs" / "guide" / "a.md").write_text(
        "[up](../../README.md#top) [web](https://example.org/x.md) [here](#words)\n"
        "`[not a link](code.md)`\n```\n[nor this](fenced.md)\n```\n"
        "![image](images/missing.png)\n[ref]: ../internals/moved.md\n")
    assert broken_links(tmp_path) == [
        "README.md: docs/a.md",
        "docs/guide/a.md: images/missing.png",
        "docs/guide/a.md: ../internals/moved.md",
    ]


def _cited_files() -> list[Path]:
    """Tracked text files that may cite docs: code, pages, config, the CI and demo scripts."""
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    return [REPO / name for name in names
            if "/results/" not in name and (REPO / name).is_file()
            and name != "tests/test_doc_links.py"  # its examples are broken on purpose
            and (name.endswith((".py", ".md", ".toml", ".in")) or name.startswith(".ci/")
                 or name == "demo")]


def test_every_cited_path_exists() -> None:
    """Docstrings, error messages, comments and pages that name a file of the repository name
    one that is there (``docs/spark.md`` after the page moved to ``docs/guide/``, or
    ``neli_orchestrate/singleton.py`` after it became a package, sends a reader nowhere)."""
    missing = []
    for path in _cited_files():
        name = str(path.relative_to(REPO))
        for cited in sorted(set(_CITED.findall(path.read_text(errors="replace")))):
            if not (REPO / cited).exists():
                missing.append(f"{name}: {cited}")
    assert missing == []


def test_the_index_lists_the_guide_and_the_internals() -> None:
    index = (DOCS / "README.md").read_text()
    linked = {str((DOCS / target).resolve().relative_to(DOCS)) for target in relative_links(index)}
    pages = {str(page.relative_to(DOCS)) for page in DOCS.rglob("*.md") if page.name != "README.md"}
    assert pages - linked == set(), "a page the index does not list"
    assert index.index("guide/") < index.index("internals/"), "the user guide comes first"


def test_every_page_is_in_the_guide_or_the_internals() -> None:
    loose = [p.name for p in DOCS.iterdir() if p.is_file() and p.name != "README.md"]
    assert loose == [], "a page belongs in docs/guide/ (users) or docs/internals/ (contributors)"


def test_where_things_live_names_every_part_of_the_tree() -> None:
    """The table at the top of development.md has a row for every module and subpackage of
    the package and every folder of integration/: a newcomer finds the room for any change."""
    text = (DOCS / "internals" / "development.md").read_text()
    table = text[text.index("## Where things live"):]
    table = table[:table.index("\n\n", table.index("| to change"))]
    package = REPO / "neli_orchestrate"
    parts = [f"neli_orchestrate/{p.name}/" if p.is_dir() else f"neli_orchestrate/{p.name}"
             for p in package.iterdir()
             if p.name not in ("__init__.py", "py.typed", "__pycache__")
             and (p.suffix == ".py" or (p / "__init__.py").exists())]
    parts += [f"integration/{p.name}/" for p in (REPO / "integration").iterdir()
              if p.is_dir() and p.name != "__pycache__"]
    missing = [part for part in sorted(parts)
               if f"`{part}" not in table and f"`{part.rstrip('/')}`" not in table]
    assert missing == []
