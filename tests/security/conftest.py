"""Shared fixtures of the security tests."""

from __future__ import annotations

import secrets
import uuid

import pytest


@pytest.fixture
def account(secured_kafka) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    user, password = f"svc-{uuid.uuid4().hex[:8]}", f"pw-{secrets.token_hex(8)}-secret"
    secured_kafka.add_user(user, password)
    return user, password
