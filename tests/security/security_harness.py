"""Helpers of the security tests."""

from __future__ import annotations

import pytest


def logged(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records)


