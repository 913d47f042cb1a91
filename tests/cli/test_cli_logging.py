"""Logging stays clean: no `--- Logging error ---` at the end of a pytest run."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

# What Airflow does on first import inside a test: bind a handler to the captured stdout. Then
# something logs at interpreter exit (an atexit hook here; a daemon thread or a librdkafka
# client destroyed at exit in the real suite).
LATE_LOGGER = textwrap.dedent('''
    import atexit
    import logging
    import sys


    def test_configures_logging_while_captured():
        root = logging.getLogger()
        root.addHandler(logging.StreamHandler(sys.stdout))
        root.setLevel(logging.INFO)
        atexit.register(lambda: logging.getLogger("late").warning("logged at exit"))
''')


def _run_pytest(tmp_path, *extra: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_late.py").write_text(LATE_LOGGER)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *extra, str(tmp_path / "test_late.py")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)


def test_a_record_logged_at_exit_reaches_the_terminal_without_a_logging_error(tmp_path):
    # the plugin is opt-in (docs/guide/api.md): a user's run loads it by name, as here
    run = _run_pytest(tmp_path, "-p", "neli_orchestrate.testing.pytest_plugin")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "--- Logging error ---" not in run.stdout + run.stderr
    assert "logged at exit" in run.stdout + run.stderr


def test_without_the_plugin_the_same_run_shows_the_logging_error(tmp_path):
    """The check above can fail: without neli_orchestrate's pytest plugin (not loaded unless
    asked for) the error is back."""
    run = _run_pytest(tmp_path)
    assert "--- Logging error ---" in run.stdout + run.stderr


MEMBER_AND_LEDGER = textwrap.dedent('''
    from neli_orchestrate import NeliConfig, Singleton, SingletonConfig
    from neli_orchestrate.errors import NeliError

    config = SingletonConfig(neli=NeliConfig(bootstrap_servers="127.0.0.1:1",
                                             request_timeout=2.0),
                             namespace="acme", deployment="us-east-1", acquire_timeout=5)
    with Singleton(config) as single:
        try:
            single.status("daily", "2013-01-01")       # the ledger's admin client
        except NeliError as exc:
            print("ledger:", type(exc).__name__)
        try:
            with single.claim("daily", "2013-01-01"):  # the member's admin, consumer, producer
                pass
        except NeliError as exc:
            print("claim:", type(exc).__name__)
''')


def test_library_clients_print_no_raw_librdkafka_lines_when_the_broker_is_down() -> None:
    """librdkafka complains about every refused connection; with logging unconfigured nothing
    of it may reach stderr raw (Python's last-resort handler shows WARNING+ records only)."""
    run = subprocess.run([sys.executable, "-c", MEMBER_AND_LEDGER], capture_output=True,
                         text=True, timeout=120)
    assert "ledger: KafkaUnavailableError" in run.stdout, run.stdout + run.stderr
    assert "claim:" in run.stdout
    assert not re.search(r"^%\d\|\d+\.\d+\|", run.stderr, re.MULTILINE), run.stderr
