"""Reserve with the ledger writer kept from this process's last claim, against a real broker.

Another deployment's gate leads the role in between and fences the kept producer without
writing (it finds the run key claimed: WAIT). The next reserve here replays, sees nothing new,
and its commit is refused at the broker; it fences anew and decides again, so the claim lands
once, under a larger token. One protocol (the default profile's): the path is the ledger's.
"""

from __future__ import annotations

import logging
import time
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

    made: list[object] = []  # admin clients (librdkafka handles) the seam created
    original = confluent.new_admin

    def counted(settings: object) -> object:
        made.append(original(settings))  # type: ignore[arg-type]
        return made[-1]

    monkeypatch.setattr(confluent, "new_admin", counted)
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


def test_a_lent_admin_client_outlives_a_renewal_of_the_lenders_client(
    kafka_broker: str,
) -> None:
    # A busy check of another thread that times out replaces GroupReads' client; the member
    # whose checks were in flight on the old one must still get their answers (a destroyed
    # client fails them, and a failed DescribeConfigs reads as "no config": the KIP-848 group
    # check would be skipped). The broker answers through a 1 s round trip, so the request is
    # still in flight when the lender renews.
    import threading

    from integration.regions.delay_proxy import DelayProxy, broker_behind_proxies
    from neli_orchestrate import NeliConfig, SingletonConfig
    from neli_orchestrate.core.confluent import _ConfluentAdmin, lent_admin
    from neli_orchestrate.singleton.groups import GroupReads
    from neli_orchestrate.testing.local_kafka import free_port

    remote = free_port()
    with DelayProxy(("127.0.0.1", remote), precise=True) as proxy:
        kafka = broker_behind_proxies({"remote": proxy.port}, {"remote": remote}).start()
        try:
            config = SingletonConfig(
                neli=NeliConfig(bootstrap_servers=f"127.0.0.1:{proxy.port}"),
                namespace=f"t{uuid.uuid4().hex[:8]}", deployment="us-east-1")
            lender = GroupReads(config)
            seam = lender._seam()
            assert isinstance(seam, _ConfluentAdmin)
            topic = f"{config.names.name}.lent"
            seam.create_topic(topic, 1, {}, 30)
            deadline = time.monotonic() + 30
            while seam.topic_config(topic, 30) is None:  # connected, as after a busy check
                assert time.monotonic() < deadline, "the topic's config never became readable"
            lent = lent_admin(seam)
            proxy.set_delay(0.5)
            proxy.reset_counts()
            answers: list[object] = []
            asking = threading.Thread(target=lambda: answers.append(lent.topic_config(topic, 30)))
            asking.start()
            while not proxy.requests.get(32):  # DescribeConfigs sent: in flight for about 1 s
                assert time.monotonic() < deadline + 30, "the lent client sent no request"
                time.sleep(0.01)
            with seam._inflight_lock:
                seam._renew_locked()
            asking.join(30)
            assert answers and answers[0] is not None, "the renewal failed the lent request"
            lent.close()
            assert seam.topic_config(topic, 30) is not None  # the lender's own still answers
        finally:
            kafka.stop()
