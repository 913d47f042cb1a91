"""The lineage hooks a fenced try gets (airflow/lineage.py), as the OpenLineage provider's
extractor manager finds and calls them; no Airflow run (tests/airflow/test_lineage_regions.py
runs real regions)."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.providers.openlineage.extractors import OperatorLineage
from airflow.providers.openlineage.extractors.base import DefaultExtractor
from airflow.providers.openlineage.extractors.manager import ExtractorManager
from airflow.providers.standard.operators.bash import BashOperator
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import BaseOperator
from openlineage.client.event_v2 import Dataset

from neli_orchestrate.airflow import lineage as lineage_module
from neli_orchestrate.airflow.lineage import (
    Claimed,
    Lineage,
    attach,
    outputs_of,
    read_back,
    settle,
)
from neli_orchestrate.ledger.record import LedgerRecord, RunState
from neli_orchestrate.sinks.delta import DeltaCommit

RUN_KEY = "daily/2013-01-05"


class WithOwnLineage(BaseOperator):
    def get_openlineage_facets_on_complete(self, task_instance: Any) -> OperatorLineage:
        return OperatorLineage(inputs=[Dataset(namespace="s3://raw", name="/flights")])


def completed(offset: int) -> LedgerRecord:
    record = LedgerRecord("daily", RUN_KEY, RunState.COMPLETED, 7, "eu-west-1", "m", 1, 1.0)
    object.__setattr__(record, "offset", offset)  # as a replay sets it
    return record


class Ledger:
    """A singleton's ``status`` as the fenced try reads its record back."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def status(self, role: str, run_key: str) -> Any:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.fixture
def lineage_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lineage_module, "wanted", lambda: True)  # a transport is configured


def test_a_fenced_stock_operator_reports_the_neli_facet_read_back_and_keeps_its_own(
    lineage_on: None,
) -> None:
    task = WithOwnLineage(task_id="job")
    commit = DeltaCommit("s3://lake/daily", "app", RUN_KEY, 7, committed=True, version=3)
    attach(task, Lineage(recorded_by="eu-west-1",
                         record=Claimed("daily", RUN_KEY, 7, "eu-west-1"),
                         outputs=outputs_of(commit)))
    attach(task, Lineage(recorded_by="eu-west-1",  # again, after the work, as a try does
                         record=Claimed("daily", RUN_KEY, 7, "eu-west-1"),
                         outputs=outputs_of(commit)))
    settle(task, Ledger(completed(12)))  # in the task, before the listener asks
    assert ExtractorManager().get_extractor_class(task) is DefaultExtractor
    lineage = DefaultExtractor(task).extract_on_complete(None)
    assert lineage is not None
    facet = lineage.run_facets["neli"]
    assert (facet.token, facet.deployment, facet.recorded_by, facet.proxy) == (
        7, "eu-west-1", "eu-west-1", False)
    assert (facet.state, facet.ledger_offset) == ("COMPLETED", 12)  # read back
    assert [d.name for d in lineage.inputs] == ["/flights"]  # the operator's own
    [table] = lineage.outputs
    assert (table.namespace, table.name, table.facets["version"].datasetVersion) == (
        "s3://lake", "/daily", "3")
    assert DefaultExtractor(task).extract().run_facets == {}  # START: nothing claimed yet


def test_a_record_that_cannot_be_read_back_still_gives_the_facet_without_offset(
    lineage_on: None,
) -> None:
    task = EmptyOperator(task_id="job")
    attach(task, Lineage(recorded_by="us-east-1",
                         record=Claimed("daily", RUN_KEY, 7, "us-east-1")))
    settle(task, Ledger(OSError("broker down")))
    lineage = DefaultExtractor(task).extract_on_failure(None)
    assert lineage is not None
    facet = lineage.run_facets["neli"]
    assert (facet.token, facet.state, facet.ledger_offset) == (7, "CLAIMED", None)


def test_a_read_back_of_another_token_is_not_reported_as_this_claim_s(lineage_on: None) -> None:
    assert read_back(Ledger(completed(12)), "daily", RUN_KEY, 5) is None  # a newer claim's
    assert read_back(Ledger(completed(12)), "daily", RUN_KEY, 7).offset == 12


def test_without_a_transport_nothing_is_read_back() -> None:
    # the provider installed but not configured (or absent): no ledger read for lineage
    assert not lineage_module.wanted()
    assert read_back(Ledger(OSError("must not be asked")), "daily", RUN_KEY, 7) is None


def test_the_provider_picks_its_own_extractor_for_a_stock_bash_operator() -> None:
    # docs/guide/airflow.md, "Lineage": a fenced stock BashOperator emits no neli facet
    task = BashOperator(task_id="job", bash_command="true")
    attach(task, Lineage(recorded_by="us-east-1",
                         record=Claimed("daily", RUN_KEY, 5, "us-east-1")))
    assert ExtractorManager().get_extractor_class(task) is not DefaultExtractor
