"""One claim handle: the same claim through every wire form (XCom, environment, Spark conf)."""

from __future__ import annotations

import pytest

from neli_orchestrate.claim import Claim
from neli_orchestrate.decision import Outcome
from neli_orchestrate.errors import ConfigError
from neli_orchestrate.singleton.run import Reservation, Run

CLAIM = Claim(token=42, run_key="2013-01-05", role="daily_flights", deployment="us-east-1")


def test_every_wire_form_gives_the_same_claim_back() -> None:
    assert Claim.from_xcom(CLAIM.xcom()) == CLAIM
    assert Claim.from_env(CLAIM.env()) == CLAIM
    assert Claim.from_spark_conf(CLAIM.spark_conf()) == CLAIM
    tried = Claim(token=7, run_key="k", role="r", deployment="d", attempt=3)
    assert Claim.from_spark_conf(tried.spark_conf()) == tried
    assert CLAIM.env() == {"NELI_TOKEN": "42", "NELI_RUN_KEY": "2013-01-05",
                           "NELI_ROLE": "daily_flights", "NELI_DEPLOYMENT": "us-east-1"}


def test_the_integrations_read_and_write_the_one_claim() -> None:
    from neli_orchestrate.spark import neli_spark_conf, read_neli_conf

    assert read_neli_conf(neli_spark_conf(**CLAIM.xcom())) == CLAIM


def test_the_claim_has_one_name() -> None:
    """The aliases ``airflow.claims.RunClaim`` and ``spark.conf.NeliSparkConf`` are gone (#32)."""
    from neli_orchestrate.airflow import claims
    from neli_orchestrate.spark import conf

    assert not hasattr(claims, "RunClaim")
    assert not hasattr(conf, "NeliSparkConf")
    assert not hasattr(Claim, "to_spark_conf")


def test_the_singletons_answers_carry_the_claim() -> None:
    run = Run(role="daily_flights", run_key="2013-01-05", deployment="us-east-1",
              outcome=Outcome.RUN, reason="no record", token=42, record=None)
    assert run.claim == CLAIM and isinstance(run, Reservation)
    waiting = Reservation(role="r", run_key="k", outcome=Outcome.WAIT, reason="held",
                          token=None, record=None, deployment="d")
    assert waiting.claim is None and not waiting.should_run


@pytest.mark.parametrize("value", [None, {"token": 1}, {"token": "x", "run_key": "k",
                                                         "role": "r", "deployment": "d"}])
def test_what_is_not_a_claim_is_refused(value: object) -> None:
    with pytest.raises(ConfigError, match="not a NELI claim"):
        Claim.from_xcom(value)


def test_a_process_not_started_by_a_fenced_task_is_told_so() -> None:
    with pytest.raises(ConfigError, match="NELI_TOKEN and NELI_RUN_KEY"):
        Claim.from_env({})
