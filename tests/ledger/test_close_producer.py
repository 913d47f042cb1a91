"""Closing a ledger producer never waits on the cluster (the ledger-leader-kill hang, issue 31).

confluent-kafka's ``Producer.close()`` flushes with no timeout: a producer that still holds a
message (a transaction that was not committed, its partition leaderless or its broker gone)
blocked whoever closed it for as long as the message lived. The ledger closes such producers
after a fence, after a commit of unknown outcome and in ``KafkaLedger.close()``.

Here the message can never be delivered (nothing listens on the bootstrap address) and would
live a minute; closing it the ledger's way returns at once, and the stock ``close()`` (the
broken variant) is shown still blocked.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

from neli_orchestrate.ledger.kafka import _close_quietly

#: How long an undeliverable message lives (message.timeout.ms): the stock close() waits it out.
MESSAGE_LIFETIME_MS = 60_000
#: Far below that lifetime: a close still running after this long is waiting on the message.
HANG = 10.0

#: librdkafka's connection refusals, kept off the console (the broken variant's producer
#: outlives the test by up to MESSAGE_LIFETIME_MS).
client_log = logging.getLogger("test.close_producer.librdkafka")
client_log.addHandler(logging.NullHandler())
client_log.propagate = False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def producer_holding_a_message() -> Any:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": f"127.0.0.1:{free_port()}",
                         "message.timeout.ms": MESSAGE_LIFETIME_MS,
                         "logger": client_log})
    producer.produce("ledger", b"claim", key=b"role")
    return producer


def closes_within(close: Callable[[Any], None], producer: Any, seconds: float) -> bool:
    done = threading.Event()

    def run() -> None:
        close(producer)
        done.set()

    threading.Thread(target=run, daemon=True, name="close").start()
    return done.wait(seconds)


def test_closing_a_ledger_producer_that_holds_a_message_does_not_wait_for_it() -> None:
    assert closes_within(_close_quietly, producer_holding_a_message(), HANG)


def test_the_stock_close_waits_for_the_message_broken_variant() -> None:
    # What _close_quietly did before: close() alone (flush with no timeout, then destroy).
    # Its thread is left behind; it ends when the message expires.
    assert not closes_within(lambda p: p.close(), producer_holding_a_message(), HANG)


def test_the_close_warnings_of_a_dropped_producer_stay_off_stderr_without_global_state() -> None:
    """confluent-kafka warns when close() cannot abort or flush a transaction; the ledger drops
    such producers on purpose. The module filters exactly those warnings, for its own closes
    only: a warning from elsewhere still shows, and the filter list is never swapped (it was
    swapped with the thread-unsafe warnings.catch_warnings(), and a warning reached CI)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import warnings
        from neli_orchestrate.ledger import kafka

        class Busy:
            def purge(self): pass
            def flush(self, timeout): return 0
            def close(self):  # as confluent-kafka's C code warns: attributed to the caller
                warnings.warn("Producer abort_transaction failed during close: Conflicting "
                              "init_transactions API call is already in progress",
                              RuntimeWarning, stacklevel=2)

        before = list(warnings.filters)
        kafka._close_quietly(Busy())
        assert warnings.filters == before, "the filter list changed"
        warnings.warn("Producer flush failed during close: elsewhere", RuntimeWarning)
        """)
    result = subprocess.run([sys.executable, "-W", "default", "-c", script],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "abort_transaction" not in result.stderr, result.stderr
    assert "elsewhere" in result.stderr, result.stderr  # another module's warning still shows
