"""Reserve with the ledger writer kept from this process's last claim, against a real broker.

Another deployment's gate leads the role in between and fences the kept producer without
writing (it finds the run key claimed: WAIT). The next reserve here replays, sees nothing new,
and its commit is refused at the broker; it fences anew and decides again, so the claim lands
once, under a larger token. One protocol (the default profile's): the path is the ledger's.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest
from test_failure_paths_kafka import history, singleton

from neli_orchestrate import Outcome
from neli_orchestrate.ledger.record import RunState

pytestmark = pytest.mark.kafka


@pytest.fixture
def env(kafka_broker: str, tmp_path: Path) -> dict:  # type: ignore[type-arg]
    ns = f"t{uuid.uuid4().hex[:8]}"
    return {"bootstrap": kafka_broker, "namespace": ns, "ledger_topic": f"{ns}.ledger",
            "tmp": tmp_path, "timings": {}}


def test_a_reserve_whose_kept_writer_was_fenced_decides_again_under_a_new_fence(
    env: dict, caplog: pytest.LogCaptureFixture,  # type: ignore[type-arg]
) -> None:
    caplog.set_level(logging.INFO, logger="neli_orchestrate.singleton.singleton")
    with singleton(env, "us-east-1") as us, singleton(env, "eu-west-1") as eu:
        first = us.reserve("flights", "2013-01-01")
        assert first.outcome is Outcome.RUN and first.token is not None
        # eu's gate leads, fences (init_transactions) and finds the claim live: writes nothing.
        assert eu.reserve("flights", "2013-01-01").outcome is Outcome.WAIT
        second = us.reserve("flights", "2013-01-02")
        assert second.outcome is Outcome.RUN and second.token is not None
        assert second.token > first.token
        assert any("kept ledger writer was fenced" in r.getMessage() for r in caplog.records)
        # Kept again after the new fence: the third claim needs no fence, nor a retry.
        caplog.clear()
        third = us.reserve("flights", "2013-01-03")
        assert third.outcome is Outcome.RUN and third.token is not None
        assert third.token > second.token
        assert not any("kept ledger writer" in r.getMessage() for r in caplog.records)
    assert history(env, "2013-01-02") == [("us-east-1", RunState.CLAIMED, second.token)]
    assert history(env, "2013-01-03") == [("us-east-1", RunState.CLAIMED, third.token)]


def test_members_check_over_the_busy_checks_admin_client_and_leave_it_open(
    env: dict, monkeypatch: pytest.MonkeyPatch,  # type: ignore[type-arg]
) -> None:
    # A member's start-up checks borrow the admin client the busy check connected
    # (singleton.groups.MemberClients): a claim makes no admin client of its own, and the
    # member's close of its admin leaves the Singleton's open for the next busy check.
    from neli_orchestrate.core import confluent

    made: list[object] = []
    original = confluent._ConfluentAdmin.__init__

    def counted(self: object, *args: object, **kwargs: object) -> None:
        made.append(self)
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(confluent._ConfluentAdmin, "__init__", counted)
    with singleton(env, "us-east-1") as us:
        first = us.reserve("flights", "2013-01-01")
        assert first.outcome is Outcome.RUN
        made_by_first = len(made)
        second = us.reserve("flights", "2013-01-02")
        assert second.outcome is Outcome.RUN
        assert second.token is not None and first.token is not None
        assert second.token > first.token
        assert len(made) == made_by_first == 1, "a member made an admin client of its own"
        # the member closed its (lent) admin when it left; the busy check's still answers
        assert us.role_members("flights") == 0
