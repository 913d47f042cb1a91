"""The package's public names: what users write in DAGs, jobs and tests, and nothing more."""

from __future__ import annotations

import importlib

import neli_orchestrate


def test_all_lists_what_users_write_and_each_name_resolves() -> None:
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
    for name in neli_orchestrate.__all__:
        assert getattr(neli_orchestrate, name) is not None


def test_internals_stay_importable_from_their_own_modules() -> None:
    singleton = importlib.import_module("neli_orchestrate.singleton")
    assert singleton.Run and singleton.Reservation
    assert importlib.import_module("neli_orchestrate.ledger").LedgerRecord
    assert "Run" not in neli_orchestrate.__all__ and "Reservation" not in neli_orchestrate.__all__
