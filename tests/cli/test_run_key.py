"""`neli-orchestrate run --run-key` templates: regions' cron lines agree without shared state."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from cli_helpers import cli

from neli_orchestrate.cli.run import render_run_key
from neli_orchestrate.errors import ConfigError, FencedError

# 23:30 on 24 Nov in New York is 04:30 on 25 Nov in UTC
NOW = datetime(2026, 11, 25, 4, 30, 12, tzinfo=UTC)


def test_date_fields_come_from_utc_by_default_or_the_zone_asked_for() -> None:
    assert render_run_key("daily/{date}", now=NOW) == "daily/2026-11-25"
    assert render_run_key("daily/{date}", now=NOW, timezone="America/New_York") == \
        "daily/2026-11-24"
    assert render_run_key("h/{hour}", now=NOW) == "h/2026-11-25T04"
    assert render_run_key("t/{datetime}", now=NOW) == "t/2026-11-25T04:30"
    assert render_run_key("{now:%Y%m%d}-{date:%d}", now=NOW) == "20261125-25"
    assert render_run_key("billing-export", now=NOW) == "billing-export"
    assert render_run_key("{{literal}}/{date}", now=NOW) == "{literal}/2026-11-25"


def test_regions_in_other_zones_with_skewed_clocks_agree_on_a_cron_tick() -> None:
    pytest.importorskip("croniter")  # the `cron` extra; installed with the airflow extra
    east = NOW.replace(hour=2, minute=0, second=0) + timedelta(seconds=1)  # fired on time
    west = east.astimezone(timezone(timedelta(hours=-8))) + timedelta(seconds=40)  # late
    keys = {render_run_key("daily/{datetime}", now=now, schedule="0 2 * * *")
            for now in (east, west)}
    assert keys == {"daily/2026-11-25T02:00"}
    # a tick at exactly now counts; before it, the previous day's tick
    assert render_run_key("{datetime}", now=NOW.replace(hour=2, minute=0, second=0),
                          schedule="0 2 * * *") == "2026-11-25T02:00"
    assert render_run_key("{datetime}", now=NOW.replace(hour=1, minute=59),
                          schedule="0 2 * * *") == "2026-11-24T02:00"
    assert render_run_key("{datetime}", now=NOW, schedule="*/15 * * * *") == "2026-11-25T04:30"


@pytest.mark.parametrize(("template", "kwargs", "message"), [
    ("daily/{day}", {}, "unknown field {day}"),
    ("daily/{date", {}, "literal braces"),
    ("x", {"timezone": "Mars/Olympus"}, "unknown time zone"),
    ("x", {"schedule": "every day"}, "not a cron expression"),
])
def test_bad_templates_are_refused_with_the_fix(template: str, kwargs: dict, message: str) -> None:
    if "schedule" in kwargs:
        pytest.importorskip("croniter")
    with pytest.raises(ConfigError, match=message):
        render_run_key(template, now=NOW, **kwargs)


def test_the_command_refuses_bad_input_before_touching_kafka() -> None:
    # an unreachable broker: these must fail on the input, at once
    base = ["run", "-b", "127.0.0.1:1", "-n", "acme", "--role", "r"]
    out = cli(*base, "--run-key", "d/{day}", "--", "true", timeout=30)
    assert out.code == 2 and "unknown field {day}" in out.stderr
    out = cli(*base, "--", "true", timeout=30)
    assert out.code == 2 and "--run-key" in out.stderr
    out = cli(*base, "--run-key", "k", "--grace", "30", "--", "true", timeout=30)
    assert out.code == 2 and "--grace 30 s is too long" in out.stderr
    out = cli(*base, "--hold", "--run-key", "k", "--", "true", timeout=30)
    assert out.code == 2 and "--hold takes no --run-key" in out.stderr


def test_a_fence_stops_the_whole_process_group_before_the_claim_hears_of_it(tmp_path) -> None:
    """The fence callback (the watchdog's thread) returns only once everything COMMAND
    started, a grandchild that ignores SIGTERM included, is gone: the claim records and
    releases after."""
    import os
    import sys
    import threading
    import time

    from neli_orchestrate.cli.run import _Signals, _supervise
    from neli_orchestrate.decision import Outcome
    from neli_orchestrate.singleton.run import Run

    pids = tmp_path / "pids"
    script = ("import os, signal, subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
              "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
              f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
              "time.sleep(600)\n")
    run = Run(role="r", run_key="k", deployment="d", outcome=Outcome.RUN, reason="",
              token=7, record=None)
    object.__setattr__(run, "_lease", lambda: time.monotonic() + 30)  # what the singleton sets
    errors: list[BaseException] = []

    def supervise() -> None:
        try:
            _supervise(run, [sys.executable, "-c", script], dict(os.environ), grace=0.5,
                       ping_interval=0.1, signals=_Signals())
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    thread = threading.Thread(target=supervise)
    thread.start()
    deadline = time.monotonic() + 30
    while not (pids.exists() and len(pids.read_text().split()) == 2):
        assert time.monotonic() < deadline, "command did not start"
        time.sleep(0.02)
    leader, grandchild = (int(p) for p in pids.read_text().split())
    run._fence("test: leadership lost")  # what the watchdog does; returns after the stop
    for pid in (leader, grandchild):
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            state = "gone"
        assert state in ("gone", "Z"), (pid, state)
    thread.join(timeout=30)
    assert len(errors) == 1 and isinstance(errors[0], FencedError), errors


@pytest.mark.parametrize("mode", [["--run-key", "k"], ["--hold"]])
def test_sigterm_ends_run_within_seconds_while_kafka_is_unreachable(mode: list[str]) -> None:
    """No Kafka retry swallows the signal, and nothing waits on the cluster on the way out."""
    import signal
    import subprocess
    import sys
    import time

    # a blackholed address: connects hang rather than fail
    proc = subprocess.Popen([sys.executable, "-m", "neli_orchestrate.cli", "run", "-b",
                             "10.255.255.1:9092", "-n", "acme", "--role", "r", *mode, "--",
                             "sleep", "100"], stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3.0)  # well inside the first connection attempts
        assert proc.poll() is None, proc.communicate()[1]
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.communicate()[1]
    assert code == 128 + signal.SIGTERM, err
    assert took < 5.0, (took, err)
