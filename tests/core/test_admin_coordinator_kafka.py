"""The admin client's requests to a group's coordinator, against a real broker.

librdkafka (2.16) aborts the whole process when an admin request to a coordinator times out
before it was sent and the client later finds the coordinator (``Assertion 'eonce->refcnt >
0'``, confluentinc/librdkafka#4605): the region-loss chaos scenario lost every waiting
deployment to it. The seam never lets librdkafka time such a request out
(``core.confluent.COORDINATOR_REQUEST_TIMEOUT``). Each test runs a child process, because the
defect kills its process: the child describes a group while no broker is reachable (the
describe times out), then a proxy to the broker starts on the bootstrap address and the
child describes again, through a client the seam made (replaced after the unanswered call) and
through a caller's client (the unanswered request is waited on). The broken variant is the seam
as it was, librdkafka's own one-second deadline and no replacement, and must die.

The stale coordinator (a cached coordinator that answers ``NOT_COORDINATOR`` for as long as a
member polls) needs a coordinator that moves: the unit test below fakes the client; the
region-loss scenario (docs/internals/chaos.md) runs it on three brokers.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from neli_orchestrate.core import confluent
from neli_orchestrate.core.client_settings import client_settings

REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import socket, sys, time
from integration.regions.delay_proxy import DelayProxy
from neli_orchestrate.core import confluent
from neli_orchestrate.core.client_settings import client_settings

broker, variant = sys.argv[1], sys.argv[2]
if variant == "broken":               # the seam as it was: librdkafka times the request out
    confluent.COORDINATOR_REQUEST_TIMEOUT = 1.0
    confluent._ConfluentAdmin._renew_locked = lambda self: None
host, port = broker.rsplit(":", 1)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    free = s.getsockname()[1]
settings = client_settings(f"127.0.0.1:{free}", logger="child",
                           defaults={"reconnect.backoff.max.ms": 500})
if variant == "wrapped":              # a caller's client: never replaced, the request waited on
    admin = confluent.ConfluentKafka().wrap_admin(confluent.new_admin(settings))
else:
    admin = confluent.ConfluentKafka().admin(settings)
try:
    admin.describe_group("g", 1.0)
    print("answered with no broker", flush=True)
except Exception as exc:
    print("unanswered:", exc, flush=True)
time.sleep(1.5)                       # past librdkafka's deadline in the broken variant
proxy = DelayProxy((host, int(port)), port=free).start()
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    try:
        print("described:", admin.describe_group("g", 2.0), flush=True)
        break
    except Exception as exc:
        print("not yet:", exc, flush=True)
        time.sleep(0.2)
time.sleep(2)                         # a late abort would land here
print("alive", flush=True)
"""


def child(kafka_broker: str, variant: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO),
                                                         os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", CHILD, kafka_broker, variant], env=env,
                          capture_output=True, text=True, timeout=90)


@pytest.mark.kafka
@pytest.mark.parametrize(("variant", "then"), [
    ("owned", "the next call asks through a new client"),
    ("wrapped", "the request stays in flight and the next call waits for it")])
def test_a_describe_unanswered_while_no_broker_is_up_is_answered_once_one_is(
        kafka_broker: str, variant: str, then: str) -> None:
    done = child(kafka_broker, variant)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "unanswered:" in done.stdout and then in done.stdout, done.stdout
    assert "described: GroupDescription(group_id='g'" in done.stdout, done.stdout
    assert done.stdout.rstrip().endswith("alive")


@pytest.mark.kafka
def test_broken_variant_librdkafkas_own_timeout_aborts_the_process(kafka_broker: str) -> None:
    done = child(kafka_broker, "broken")
    assert done.returncode == -signal.SIGABRT, done.stdout + done.stderr
    assert "eonce->refcnt > 0" in done.stderr


class _Future:
    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> Any:
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


class _Described:
    state = "STABLE"
    members: list[Any] = []


class _Unanswered(_Future):
    def __init__(self) -> None:
        super().__init__(None)

    def done(self) -> bool:
        return False

    def result(self, timeout: float | None = None) -> Any:
        raise concurrent.futures.TimeoutError


class _Client:
    """An AdminClient whose describes all end as ``future`` does."""

    def __init__(self, future: _Future) -> None:
        self.future = future
        self.asked = 0

    def describe_consumer_groups(self, groups: list[str], **_: Any) -> dict[str, _Future]:
        self.asked += 1
        return {groups[0]: self.future}


STALE = _Future(KafkaException(KafkaError(KafkaError.NOT_COORDINATOR)))


@pytest.mark.parametrize(("first", "error"), [
    (STALE, "NOT_COORDINATOR"),                  # its cached coordinator is no longer one
    (_Unanswered(), "through a new client"),     # a black hole would hold it for 60 s
], ids=["stale-coordinator", "unanswered"])
def test_the_seams_client_is_replaced_after_a_stale_or_a_missing_answer(
        monkeypatch: pytest.MonkeyPatch, first: _Future, error: str) -> None:
    old, fresh = _Client(first), _Client(_Future(_Described()))
    made = iter([old, fresh])
    monkeypatch.setattr(confluent, "new_admin", lambda settings: next(made))
    admin = confluent.ConfluentKafka().admin(client_settings("x:1", logger="t"))
    with pytest.raises(Exception, match=error):
        admin.describe_group("g", 0.01)
    described = admin.describe_group("g", 0.01)
    assert described is not None and described.state == "STABLE"
    assert (old.asked, fresh.asked) == (1, 1)


def test_a_stale_coordinator_of_a_callers_client_is_reported_not_replaced() -> None:
    stale = _Client(STALE)
    admin = confluent.ConfluentKafka().wrap_admin(stale)
    for _ in range(2):
        with pytest.raises(Exception, match="NOT_COORDINATOR"):
            admin.describe_group("g", 1.0)
    assert stale.asked == 2
