"""The lineage hooks a fenced try gets (airflow/lineage.py), as the OpenLineage provider's
extractor manager finds and calls them; no Airflow run (tests/airflow/test_lineage_regions.py
runs real regions)."""

from __future__ import annotations

from typing import Any

from airflow.providers.openlineage.extractors import OperatorLineage
from airflow.providers.openlineage.extractors.base import DefaultExtractor
from airflow.providers.openlineage.extractors.manager import ExtractorManager
from airflow.providers.standard.operators.bash import BashOperator
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import BaseOperator
from openlineage.client.event_v2 import Dataset

from neli_orchestrate.airflow.lineage import Claimed, Lineage, attach, outputs_of
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


def test_a_fenced_stock_operator_reports_the_neli_facet_read_back_and_keeps_its_own() -> None:
    task = WithOwnLineage(task_id="job")
    commit = DeltaCommit("s3://lake/daily", "app", RUN_KEY, 7, committed=True, version=3)
    attach(task, Lineage(recorded_by="eu-west-1",
                         record=Claimed("daily", RUN_KEY, 7, "eu-west-1"),
                         read_back=lambda: completed(12), outputs=outputs_of(commit)))
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


def test_a_record_that_cannot_be_read_back_still_gives_the_facet_without_offset() -> None:
    task = EmptyOperator(task_id="job")

    def unreachable() -> None:
        raise OSError("broker down")

    attach(task, Lineage(recorded_by="us-east-1",
                         record=Claimed("daily", RUN_KEY, 7, "us-east-1"), read_back=unreachable))
    lineage = DefaultExtractor(task).extract_on_failure(None)
    assert lineage is not None
    facet = lineage.run_facets["neli"]
    assert (facet.token, facet.state, facet.ledger_offset) == (7, "CLAIMED", None)


def test_a_read_back_of_another_token_is_not_reported_as_this_claim_s() -> None:
    task = EmptyOperator(task_id="job")
    attach(task, Lineage(recorded_by="us-east-1",
                         record=Claimed("daily", RUN_KEY, 5, "us-east-1"),
                         read_back=lambda: completed(12)))  # token 7: a newer claim's record
    facet = DefaultExtractor(task).extract_on_complete(None).run_facets["neli"]
    assert (facet.token, facet.deployment, facet.ledger_offset) == (5, "us-east-1", None)


def test_the_provider_picks_its_own_extractor_for_a_stock_bash_operator() -> None:
    # docs/guide/airflow.md, "Lineage": a fenced stock BashOperator emits no neli facet
    task = BashOperator(task_id="job", bash_command="true")
    attach(task, Lineage(recorded_by="us-east-1",
                         record=Claimed("daily", RUN_KEY, 5, "us-east-1")))
    assert ExtractorManager().get_extractor_class(task) is not DefaultExtractor
