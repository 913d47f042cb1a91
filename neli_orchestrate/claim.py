"""The claim handed to the work: this deployment holds (role, run key) under fencing token t.

Usage::

    claim = Claim(token=42, run_key="2013-01-05", role="daily_flights", deployment="us-east-1")
    claim.xcom()          # {"token": 42, "run_key": ..., "role": ..., "deployment": ...}
    claim.env()           # {"NELI_TOKEN": "42", "NELI_RUN_KEY": ..., ...}
    claim.spark_conf()    # {"spark.neli.token": "42", "spark.neli.run_key": ..., ...}
    Claim.from_spark_conf(spark)   # in the job: the same claim back

One type for every place the claim travels (:class:`~neli_orchestrate.singleton.run.Run` and
``Reservation`` carry it as ``.claim``, the Airflow gate's XCom and a fenced task's
environment, the Dagster run, a spark-submit job's conf), and its three wire forms written and
read here only. Nothing here imports Airflow, Dagster or pyspark.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from neli_orchestrate.errors import ConfigError

__all__ = [
    "ATTEMPT_CONF",
    "CLAIM_ENV",
    "CLAIM_KEYS",
    "DEPLOYMENT_CONF",
    "ROLE_CONF",
    "RUN_KEY_CONF",
    "TOKEN_CONF",
    "Claim",
]

#: The keys of the XCom form (the Airflow gate's return value).
CLAIM_KEYS = ("token", "run_key", "role", "deployment")

#: The environment form: variables that carry the claim to a task's processes.
CLAIM_ENV = {
    "token": "NELI_TOKEN",
    "run_key": "NELI_RUN_KEY",
    "role": "NELI_ROLE",
    "deployment": "NELI_DEPLOYMENT",
}

#: The Spark conf form (``spark-submit --conf``).
TOKEN_CONF = "spark.neli.token"
RUN_KEY_CONF = "spark.neli.run_key"
ROLE_CONF = "spark.neli.role"
DEPLOYMENT_CONF = "spark.neli.deployment"
ATTEMPT_CONF = "spark.neli.attempt"


def check_token(token: object) -> int:
    """``token`` if it is a fencing token (a non-negative int); ConfigError otherwise."""
    if isinstance(token, bool) or not isinstance(token, int) or token < 0:
        raise ConfigError(f"token must be a non-negative int, got {token!r}")
    return token


def as_claim(
    claim: Claim | str,
    token: int | None = None,
    *,
    role: str | None = None,
    deployment: str | None = None,
    attempt: int | None = None,
) -> Claim:
    """The one way a loose-argument form becomes a :class:`Claim`.

    ``claim`` is a Claim (then ``token``, ``role``, ``deployment`` and ``attempt`` must be left
    out: the claim travels whole) or a run key (then ``token`` is required). ConfigError
    otherwise.
    """
    if isinstance(claim, Claim):
        given = [name for name, value in (("token", token), ("role", role),
                 ("deployment", deployment), ("attempt", attempt)) if value is not None]
        if given:
            raise ConfigError(
                f"pass either a Claim or a run key with its token, not both: the Claim already "
                f"carries {', '.join(given)}")
        return claim
    if token is None:
        raise ConfigError(
            f"no token for run key {claim!r}: pass the run's Claim, or the run key and its "
            "fencing token")
    return Claim(token=token, run_key=claim, role=role, deployment=deployment,
                 attempt=0 if attempt is None else attempt)


@dataclass(frozen=True)
class Claim:
    """This deployment holds the claim of ``role`` / ``run_key`` under fencing ``token``.

    ``role`` and ``deployment`` are None only where a wire form left them out (a Spark job
    submitted with just the token and run key); ``attempt`` is the orchestrator's try number
    (0: not given).
    """

    token: int
    run_key: str
    role: str | None = None
    deployment: str | None = None
    attempt: int = 0

    def __post_init__(self) -> None:
        check_token(self.token)
        if not isinstance(self.run_key, str) or not self.run_key:
            raise ConfigError(f"run_key must be a non-empty string, got {self.run_key!r}")
        if isinstance(self.attempt, bool) or not isinstance(self.attempt, int) or (
                self.attempt < 0):
            raise ConfigError(f"attempt must be a non-negative int, got {self.attempt!r}")

    def with_token(self, token: int) -> Claim:
        """The same claim under another (re-claimed) token."""
        return dataclasses.replace(self, token=token)

    # -- XCom (a plain dict, JSON-safe) ----------------------------------------------------

    def xcom(self) -> dict[str, Any]:
        """The XCom form: ``{"token", "run_key", "role", "deployment"}``."""
        return {"token": self.token, "run_key": self.run_key, "role": self.role,
                "deployment": self.deployment}

    @classmethod
    def from_xcom(cls, value: object) -> Claim:
        """The claim in an XCom value; ConfigError if ``value`` is not one."""
        if isinstance(value, Claim):
            return value
        if not isinstance(value, Mapping) or any(k not in value for k in CLAIM_KEYS):
            raise ConfigError(f"not a NELI claim: {value!r}")
        try:
            return cls(token=int(value["token"]), run_key=str(value["run_key"]),
                       role=str(value["role"]), deployment=str(value["deployment"]))
        except (TypeError, ValueError):
            raise ConfigError(f"not a NELI claim: {value!r}") from None

    # -- environment variables -------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """The environment form: ``NELI_TOKEN``, ``NELI_RUN_KEY``, ``NELI_ROLE``,
        ``NELI_DEPLOYMENT`` (those that are set)."""
        values = self.xcom()
        return {CLAIM_ENV[key]: str(values[key]) for key in CLAIM_KEYS
                if values[key] is not None}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Claim:
        """The claim a process was started with (``os.environ`` by default)."""
        environ = os.environ if environ is None else environ
        token, run_key = environ.get(CLAIM_ENV["token"]), environ.get(CLAIM_ENV["run_key"])
        if not token or not run_key:
            raise ConfigError(
                f"{CLAIM_ENV['token']} and {CLAIM_ENV['run_key']} are not both set: this "
                "process was not started by a fenced task")
        try:
            number = int(token)
        except ValueError:
            raise ConfigError(f"{CLAIM_ENV['token']}={token!r} is not an integer") from None
        return cls(token=number, run_key=run_key, role=environ.get(CLAIM_ENV["role"]) or None,
                   deployment=environ.get(CLAIM_ENV["deployment"]) or None)

    # -- Spark conf ------------------------------------------------------------------------

    def spark_conf(self) -> dict[str, str]:
        """The Spark conf form (``spark.neli.*``, for ``spark-submit --conf`` or an operator's
        ``conf``); the attempt only when given."""
        conf = {TOKEN_CONF: str(self.token), RUN_KEY_CONF: self.run_key}
        if self.role is not None:
            conf[ROLE_CONF] = self.role
        if self.deployment is not None:
            conf[DEPLOYMENT_CONF] = self.deployment
        if self.attempt:
            conf[ATTEMPT_CONF] = str(self.attempt)
        return conf

    @classmethod
    def from_spark_conf(cls, source: Any) -> Claim:
        """Read the claim from Spark conf; ConfigError names what is missing.

        ``source`` is a SparkSession, SparkContext, SparkConf (``SparkConf()`` works in a
        spark-submit driver before any context exists) or a plain mapping.
        """
        get = _conf_getter(source)
        raw_token = get(TOKEN_CONF)
        raw_run_key = get(RUN_KEY_CONF)
        missing = [key for key, value in ((TOKEN_CONF, raw_token), (RUN_KEY_CONF, raw_run_key))
                   if value in (None, "")]
        if missing:
            raise ConfigError(
                f"Spark conf {', '.join(missing)} missing: this job publishes through the token "
                f"commit guard and needs the run's fencing token; submit it with "
                f"--conf {TOKEN_CONF}=<token> --conf {RUN_KEY_CONF}=<run key> "
                "(FencedSparkSubmitOperator and neli_spark_conf() do this)"
            )
        try:
            token = int(raw_token)
        except ValueError:
            raise ConfigError(f"Spark conf {TOKEN_CONF}={raw_token!r} is not an integer") from None
        if token < 0:
            raise ConfigError(f"Spark conf {TOKEN_CONF}={raw_token!r} must not be negative")
        raw_attempt = get(ATTEMPT_CONF)
        try:
            attempt = int(raw_attempt) if raw_attempt not in (None, "") else 0
        except ValueError:
            raise ConfigError(
                f"Spark conf {ATTEMPT_CONF}={raw_attempt!r} is not an integer") from None
        return cls(token=token, run_key=str(raw_run_key), role=get(ROLE_CONF) or None,
                   deployment=get(DEPLOYMENT_CONF) or None, attempt=attempt)


def _conf_getter(source: Any) -> Any:
    if isinstance(source, Mapping):
        return lambda key: source.get(key)
    if hasattr(source, "getConf"):  # SparkContext
        conf = source.getConf()
        return lambda key: conf.get(key, None)
    if hasattr(source, "conf") and not hasattr(source, "getAll"):  # SparkSession
        try:
            conf = source.sparkContext.getConf()  # classic: everything spark-submit was given
            return lambda key: conf.get(key, None)
        except Exception:  # noqa: BLE001 - Spark Connect has no SparkContext
            runtime = source.conf
            return lambda key: runtime.get(key, None)
    if hasattr(source, "get"):  # SparkConf, RuntimeConfig
        return lambda key: source.get(key, None)
    raise TypeError(
        "read_neli_conf() needs a SparkSession, SparkContext, SparkConf or mapping, "
        f"got {type(source).__name__}"
    )
