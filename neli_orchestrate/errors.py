"""Exceptions shared by every layer of neli_orchestrate."""

from __future__ import annotations

from typing import Any


class NeliError(Exception):
    """Base class of every error raised by neli_orchestrate."""


class ConfigError(NeliError, ValueError):
    """A configuration value or combination of values is invalid; the message names the field."""


class KafkaUnavailableError(NeliError):
    """The Kafka cluster could not be reached, or refused an operation the protocol needs."""


class FencedError(NeliError):
    """This member lost the right to act for a role; stop the work now.

    Raised when leadership was lost (own heartbeat missing, partitions lost), when a
    newer leader's ``init_transactions()`` fenced our transactional producer, or when a
    newer claim superseded ours in the run ledger.
    """

    def __init__(self, message: str, *, role: str | None = None, token: int | None = None,
                 final: bool = False) -> None:
        super().__init__(message)
        self.role = role
        self.token = token
        #: True when no later try can run the run key (attempt limit reached, or the token is
        #: no claim of this ledger): only a reset helps. Otherwise a fence fails one try, and
        #: a retry decides again from the ledger (docs/guide/guarantees.md).
        self.final = final


class StaleTokenError(NeliError):
    """A writer presented a fencing token lower than one already committed."""

    def __init__(self, message: str, *, token: int, committed: int) -> None:
        super().__init__(message)
        self.token = token
        self.committed = committed


class SkippedRun(NeliError):
    """The run needs no work here: it was completed (or is owned) by another deployment.

    ``record`` is the ledger record that says so (the run key's ``COMPLETED`` record), when
    known: an orchestrator reads from it which deployment ran the run, and its token.
    """

    def __init__(self, message: str, *, record: Any = None) -> None:
        super().__init__(message)
        #: The run key's latest ledger record (``LedgerRecord``), or None.
        self.record = record


class WorkSkipped(NeliError):
    """Raise from the work to skip it: the run key ends ``COMPLETED``, "skipped by the task".

    The work itself decided there is nothing to do (Airflow's ``AirflowSkipException``, a
    ``BashOperator`` exit code in ``skip_on_exit_code``, a sensor's ``soft_fail``; in Dagster or
    plain Python, raise this inside ``singleton.claim(...)``). A skip is terminal: no region
    runs the run key again (``FAILED`` would be retried or taken over, and skip again, for
    ever). ``original`` is the exception the orchestrator expects to see again, if any.
    """

    def __init__(self, message: str, *, original: BaseException | None = None) -> None:
        super().__init__(message)
        self.original = original


class WorkNotStopped(NeliError):
    """The work failed and something it started elsewhere could not be confirmed stopped.

    Raise it (or a subclass) from the work when a remote application (a Spark driver in
    cluster deploy mode) may outlive the try: the singleton records ``FAILED`` with
    ``application`` in the record's ``unstopped`` field, which the CLI and the read model show
    as "may still be running".
    """

    def __init__(self, message: str, *, application: str) -> None:
        super().__init__(message)
        #: What may still run, e.g. ``standalone application driver-… on spark://…``.
        self.application = application


class AcquireTimeoutError(NeliError):
    """Leadership of a role could not be acquired in time: another member holds it, or
    another deployment holds a live claim on the run (``WAIT``).

    ``wait_until``: wall-clock time (epoch seconds) after which asking again may give another
    answer (the claim's or retry window's end), when the ledger says; None otherwise.
    """

    def __init__(self, message: str, *, wait_until: float | None = None) -> None:
        super().__init__(message)
        self.wait_until = wait_until


class PermanentKafkaError(NeliError):
    """Kafka answered, and the answer will not change by waiting: fix the setup, then retry.

    Raised at once (never after a wait): a topic with the wrong partition count, a missing
    topic that may not be created, a session timeout outside the broker's limits, a record
    this library cannot read, a denied ACL. The message names what to change.
    """


class TopicMismatchError(PermanentKafkaError, ConfigError):
    """A topic and the configuration disagree: the topic is missing and may not be created, or
    its partition count (or another setting the protocol needs) differs."""


class SessionTimeoutRejectedError(PermanentKafkaError, ConfigError):
    """The broker refuses the consumer group's session timeout (outside its min/max limits)."""


class AuthorizationError(PermanentKafkaError):
    """The broker denied an operation (group, topic or transactional-id ACL)."""


class UnreadableRecordError(PermanentKafkaError):
    """The newest ledger record of a run key cannot be decoded: nobody may decide from an older
    one. The message names the record's offset and how to fix it."""

    def __init__(self, message: str, *, role: str, run_key: str, offset: int) -> None:
        super().__init__(message)
        self.role = role
        self.run_key = run_key
        self.offset = offset
