"""The demo's and chaos suite's checks catch what they claim to catch (no components needed)."""

from __future__ import annotations

from dataclasses import dataclass

from integration.regions.evidence import (
    Fault,
    Observer,
    Span,
    TableState,
    application_starts,
    assess,
    check_table,
)

A, B = "us-east-1", "eu-west-1"
DATE = "2013-01-01"
KEY = f"nycflights_daily/{DATE}T00:00:00+00:00"


@dataclass
class Rec:
    run_key: str
    state: str
    token: int
    deployment: str
    at: float


def observer(executions: list[Span], faults: list[Fault] = ()) -> Observer:
    obs = Observer([], "127.0.0.1:9", {})
    obs.started_at = 0.0
    obs.executions = list(executions)
    obs.faults = list(faults)
    return obs


def takeover_history() -> list[Rec]:
    return [
        Rec(KEY, "CLAIMED", 1, A, 1.0),
        Rec(KEY, "RUNNING", 1, A, 2.0),
        Rec(KEY, "CLAIMED", 5, B, 20.0),
        Rec(KEY, "RUNNING", 5, B, 21.0),
        Rec(KEY, "COMPLETED", 5, B, 40.0),
    ]


def check(history, executions, faults=(), sink=5):
    return assess(observer(executions, faults), history, [DATE], lambda d: KEY,
                  sink_token=lambda d: sink)


def test_a_clean_takeover_has_no_duplicates_and_no_lost_runs() -> None:
    kill = Fault("kill", A, DATE, 10.0)
    report = check(
        takeover_history(),
        [Span(A, DATE, 3.0, 10.0, 1), Span(B, DATE, 22.0, 39.0, 5)],
        [kill],
    )
    assert (report.duplicates, report.lost) == (0, 0), report.problems
    (outcome,) = report.dates
    assert (outcome.ran_in, outcome.token, outcome.takeovers) == (B, 5, 1)
    assert outcome.takeover_seconds == [10.0]


def test_running_time_is_the_fault_to_the_start_of_the_application_of_a_later_claim() -> None:
    # A's own application (token 1, started before the fault) does not count; B's token 5,
    # claimed at 20, launched its JVM at 22 and its SparkContext started at 27.5
    kill = Fault("kill", A, DATE, 10.0)
    log = ("INFO 2013 INFO nycflights_daily NELI application local-1 started at 27.500 "
           "(token 5, run key 2013-01-01)\n")
    assert application_starts(log) == [(5, 27.5)]
    report = assess(observer([Span(A, DATE, 3.0, 10.0, 1), Span(B, DATE, 22.0, 39.0, 5)],
                             [kill]),
                    takeover_history(), [DATE], lambda d: KEY, sink_token=lambda d: 5,
                    app_starts=lambda d: [(A, 1, 4.0), (B, 5, 27.5)])
    (outcome,) = report.dates
    assert (outcome.takeover_seconds, outcome.launch_seconds) == ([10.0], [12.0])
    assert (outcome.running_seconds, outcome.running_in) == ([17.5], [B])
    # no application of a later token started (yet): nothing measured, nothing invented
    report = assess(observer([], [kill]), takeover_history(), [DATE], lambda d: KEY,
                    sink_token=lambda d: 5, app_starts=lambda d: [(A, 1, 4.0)])
    assert report.dates[0].running_seconds == [] == report.dates[0].launch_seconds


def test_two_completions_of_one_run_key_are_a_duplicate() -> None:
    history = [*takeover_history(), Rec(KEY, "COMPLETED", 5, B, 41.0)]
    report = check(history, [])
    assert report.duplicates == 1 and "COMPLETED 2 times" in report.problems[0]


def test_live_executions_overlapping_in_time_are_a_duplicate() -> None:
    # the mutation "gate with fencing disabled": the superseded job keeps running
    report = check(takeover_history(), [Span(A, DATE, 3.0, 30.0, 1), Span(B, DATE, 22.0, 39.0, 5)])
    assert report.duplicates == 1 and "ran at once" in report.problems[0]


def test_a_frozen_zombie_is_not_a_live_duplicate_but_its_resumed_run_is() -> None:
    executions = [Span(A, DATE, 3.0, 30.0, 1), Span(B, DATE, 22.0, 39.0, 5)]
    frozen = Fault("stop", A, DATE, 8.0, resumed_at=29.5)
    assert check(takeover_history(), executions, [frozen]).duplicates == 0
    # resumed at 24 s and not fenced: it ran on beside the new owner for 6 s
    early = Fault("stop", A, DATE, 8.0, resumed_at=24.0)
    assert check(takeover_history(), executions, [early]).duplicates == 1


def test_the_chaos_stop_fault_pauses_but_a_network_cut_does_not() -> None:
    executions = [Span(A, DATE, 3.0, 30.0, 1), Span(B, DATE, 22.0, 39.0, 5)]
    frozen = Fault("stop-past-session", A, DATE, 8.0, resumed_at=29.5)
    assert check(takeover_history(), executions, [frozen]).duplicates == 0
    # a region cut off from Kafka is not frozen: a job it runs on beside the new owner's is live
    cut = Fault("network-cut", A, DATE, 8.0, resumed_at=29.5)
    assert check(takeover_history(), executions, [cut]).duplicates == 1


def test_output_published_under_another_token_is_a_duplicate() -> None:
    assert check(takeover_history(), [], sink=1).duplicates == 1


def test_a_date_never_completed_is_lost() -> None:
    report = check(takeover_history()[:-1], [], sink=None)
    assert report.lost == 1 and report.dates[0].ran_in is None


def _table(commits, rows=14, distinct=14, written=14) -> TableState:  # type: ignore[no-untyped-def]
    return TableState(commits=commits, rows=rows, distinct_rows=distinct, written_rows=written)


def test_table_check_accepts_a_superseded_commit_then_the_winners():
    # kill-after-job: token 1 committed, then the take-over (token 5) replaced the partition
    report = assess(observer([]), takeover_history(), [DATE], lambda d: KEY,
                    table_state=lambda d: _table([(0, 1), (1, 5)]))
    assert report.duplicates == 0, report.problems
    assert report.dates[0].table_versions == [(0, 1), (1, 5)]
    assert report.dates[0].sink_token == 5


def test_table_check_counts_a_zombie_commit_after_the_winner():
    report = assess(observer([]), takeover_history(), [DATE], lambda d: KEY,
                    table_state=lambda d: _table([(0, 5), (1, 1)]))
    assert report.duplicates == 1
    assert "last commit (version 1) has token 1" in report.problems[0]


def test_table_check_rejects_unclaimed_higher_and_untokened_commits():
    assert check_table(DATE, _table([(0, 3), (1, 5)]), 5, [1, 5]) == [
        f"{DATE}: table version 0 has token 3, which the ledger never claimed"]
    assert "above the COMPLETED token" in check_table(DATE, _table([(0, 7), (1, 5)]), 5, [5])[0]
    assert "carries no token" in check_table(DATE, _table([(0, None), (1, 5)]), 5, [5])[0]
    assert "no commit of the date" in check_table(DATE, _table([]), 5, [5])[0]
    assert check_table(DATE, _table([]), None, []) == []  # lost: counted as lost, not here


def test_table_check_compares_the_rows_with_the_winning_commit():
    assert "holds 28 rows" in check_table(DATE, _table([(0, 5)], rows=28, distinct=28), 5, [5])[0]
    found = check_table(DATE, _table([(0, 5)], rows=28, distinct=14, written=28), 5, [5])
    assert found == [f"{DATE}: 14 duplicate rows"]
