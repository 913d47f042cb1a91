"""The public API: what users write in DAGs, jobs and tests, listed once in docs/guide/api.md.

Every package's ``__all__`` counts (the top level, the integrations, and packages that export
nothing); each public name has its own docstring and a line in docs/guide/api.md under its package.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from types import ModuleType

import neli_orchestrate

MAX_PUBLIC_NAMES = 40
PACKAGE_DIR = Path(neli_orchestrate.__file__).resolve().parent
API_PAGE = PACKAGE_DIR.parent / "docs" / "guide" / "api.md"


def packages() -> dict[str, ModuleType]:
    """Every package of the distribution, imported, by dotted name."""
    names = sorted(
        ".".join(("neli_orchestrate", *init.parent.relative_to(PACKAGE_DIR).parts))
        for init in PACKAGE_DIR.rglob("__init__.py")
    )
    return {name: importlib.import_module(name) for name in names}


def public_names() -> dict[str, list[str]]:
    """Each package's ``__all__`` (empty for a package that declares none)."""
    return {name: list(getattr(module, "__all__", [])) for name, module in packages().items()}


def documented_names(page: str) -> dict[str, list[str]]:
    """The names docs/guide/api.md lists: ``- `name```: bullets under ``## `package` `` headings."""
    listed: dict[str, list[str]] = {}
    package = None
    for line in page.splitlines():
        heading = re.fullmatch(r"## `([\w.]+)`", line)
        if heading:
            package = heading.group(1)
            listed.setdefault(package, [])
        elif line.startswith("## "):
            package = None
        elif package is not None and (bullet := re.match(r"- `(\w+)`", line)):
            listed[package].append(bullet.group(1))
    return listed


def test_at_most_40_public_names_in_all() -> None:
    exported = {package: names for package, names in public_names().items() if names}
    total = sum(len(names) for names in exported.values())
    assert total <= MAX_PUBLIC_NAMES, (
        f"{total} public names (at most {MAX_PUBLIC_NAMES}): "
        + ", ".join(f"{package} {len(names)}" for package, names in exported.items())
    )


def test_each_public_name_resolves_and_has_its_own_docstring() -> None:
    undocumented = []
    for package, names in public_names().items():
        module = importlib.import_module(package)
        for name in names:
            value = getattr(module, name)
            # A class's __doc__ is not inherited; a constant has none to give.
            doc = value.__doc__ if inspect.isclass(value) or inspect.isroutine(value) else None
            if not (doc and doc.strip()):
                undocumented.append(f"{package}.{name}")
    assert not undocumented, f"public names without a docstring of their own: {undocumented}"


def test_docs_api_lists_exactly_the_public_names() -> None:
    exported = {package: sorted(names) for package, names in public_names().items() if names}
    listed = {package: sorted(names) for package, names in
              documented_names(API_PAGE.read_text()).items()}
    missing = [f"{package}.{name}" for package, names in exported.items()
               for name in names if name not in listed.get(package, [])]
    extra = [f"{package}.{name}" for package, names in listed.items()
             for name in names if name not in exported.get(package, [])]
    assert not missing, f"public but not listed in docs/guide/api.md: {missing}"
    assert not extra, f"listed in docs/guide/api.md but not public: {extra}"


def test_packages_re_export_nothing_beyond_their_all() -> None:
    leftovers = []
    for package, module in packages().items():
        public = set(getattr(module, "__all__", []))
        for name, value in vars(module).items():
            if name.startswith("_") or name in public or isinstance(value, ModuleType):
                continue
            defined_in = getattr(value, "__module__", None)
            if isinstance(defined_in, str) and defined_in.startswith("neli_orchestrate"):
                if defined_in != package:
                    leftovers.append(f"{package}.{name} (from {defined_in})")
    assert not leftovers, f"re-exported but not public; import from the module instead: {leftovers}"


def test_the_top_level_is_what_users_write_in_dags_jobs_and_tests() -> None:
    assert sorted(neli_orchestrate.__all__) == sorted(
        [
            # the singleton run and its configuration
            "Singleton",
            "SingletonConfig",
            "Outcome",
            # the protocol core, its events, and the double for users' own tests
            "Neli",
            "NeliConfig",
            "LeaderAcquired",
            "LeaderRevoked",
            "LeaderFenced",
            "MockNeli",
            # errors a job or test catches
            "NeliError",
            "ConfigError",
            "FencedError",
            "SkippedRun",
            "AcquireTimeoutError",
            "KafkaUnavailableError",
            "StaleTokenError",
        ]
    )


def test_internals_stay_importable_from_their_own_modules() -> None:
    from neli_orchestrate.ledger.record import LedgerRecord
    from neli_orchestrate.singleton.run import Reservation, Run

    assert Run and Reservation and LedgerRecord
    assert not hasattr(importlib.import_module("neli_orchestrate.singleton"), "Run")
    assert not hasattr(importlib.import_module("neli_orchestrate.ledger"), "LedgerRecord")
