"""What several benchmarks share: the percentile they report and the broker they run against.

Imported by the scripts next to it (``python integration/bench/<script>.py`` puts this
directory on ``sys.path``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


def percentile(values: list[float], q: float) -> float:
    """The sample at rank ``q`` (0..1) of the sorted values, rounded to the nearest index."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


@contextlib.contextmanager
def broker(bootstrap: str | None) -> Iterator[tuple[str, int | None]]:
    """``(bootstrap servers, broker pid)``: ``bootstrap`` as given (pid unknown), or a
    ``LocalKafka`` started here and stopped on exit."""
    if bootstrap is not None:
        yield bootstrap, None
        return
    from neli_orchestrate.testing import LocalKafka

    kafka = LocalKafka().start()
    try:
        yield kafka.bootstrap_servers, kafka.pid
    finally:
        kafka.stop()
