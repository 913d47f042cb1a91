"""COMPLETED means the Spark application finished: the decision logic on the provider's parsing.

YARN and Kubernetes cannot run here. These tests build the Apache Spark provider's own
``SparkSubmitHook`` from real Airflow connections, feed its own spark-submit log parser with
output lines in the format Spark prints (YARN's ``Client``, Kubernetes'
``LoggingPodStatusWatcherImpl``, the standalone ``RestSubmissionClient``) and check what the
fenced task decides: refuse a configuration that returns before the application ended, and
which application a fence must stop and confirm. The Kubernetes hook needs the cncf provider's
client only to exist (it is not installed here): a stand-in object is set, and nothing calls it.
"""

# ruff: noqa: E501 - recorded spark-submit output lines stay verbatim
from __future__ import annotations

import json
from typing import Any

import pytest
from airflow.providers.apache.spark.hooks import spark_submit as provider_hook
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from neli_orchestrate.airflow.spark_provider import (
    ApplicationNotStopped,
    RemoteApplication,
    confirm_stopped,
    elsewhere,
    import_problem,
    parse_application,
    remote_application,
    stop_application,
    submission_problem,
)

pytestmark = pytest.mark.airflow

CONNECTIONS = {
    "spark_yarn_cluster": {"conn_type": "spark", "host": "yarn",
                           "extra": {"deploy-mode": "cluster"}},
    "spark_yarn_client": {"conn_type": "spark", "host": "yarn"},
    "spark_k8s_cluster": {"conn_type": "spark", "host": "k8s://https://k8s.example:6443",
                          "extra": {"deploy-mode": "cluster", "namespace": "etl"}},
    "spark_standalone_cluster": {"conn_type": "spark", "host": "spark://10.0.0.5:7077",
                                 "extra": {"deploy-mode": "cluster"}},
    "spark_standalone_client": {"conn_type": "spark", "host": "spark://10.0.0.5:7077"},
    "spark_local": {"conn_type": "spark", "host": "local[2]"},
}


@pytest.fixture(autouse=True)
def spark_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    for conn_id, conn in CONNECTIONS.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    # the hook refuses k8s:// masters when the cncf provider is missing; it is only looked up
    monkeypatch.setattr(provider_hook, "kube_client", object(), raising=False)


def hook(conn_id: str, conf: dict[str, str] | None = None, **kwargs: Any) -> SparkSubmitHook:
    return SparkSubmitHook(conn_id=conn_id, conf=conf or {}, **kwargs)


YARN_FALSE = {"spark.yarn.submit.waitAppCompletion": "false"}
K8S_FALSE = {"spark.kubernetes.submission.waitAppCompletion": "false"}


@pytest.mark.parametrize(
    ("conn_id", "conf", "kwargs", "refused"),
    [
        # returns right after the submission: refused, naming what to set
        ("spark_yarn_cluster", YARN_FALSE, {}, "yarn_track_via_rm_api=True"),
        ("spark_k8s_cluster", K8S_FALSE, {}, "track_driver_via_k8s_api=True"),
        ("spark_standalone_client", {"spark.submit.deployMode": "cluster"}, {},
         "deploy_mode='cluster'"),
        ("spark_yarn_client", {"spark.submit.deployMode": "cluster"}, {}, "deploy_mode='cluster'"),
        # the provider polls the final state itself: allowed
        ("spark_yarn_cluster", YARN_FALSE, {"yarn_track_via_rm_api": True}, None),
        ("spark_k8s_cluster", K8S_FALSE, {"track_driver_via_k8s_api": True}, None),
        # spark-submit waits (the default), or the provider tracks the standalone driver
        ("spark_yarn_cluster", {}, {}, None),
        ("spark_k8s_cluster", {}, {}, None),
        ("spark_standalone_cluster", {"spark.standalone.submit.waitAppCompletion": "false"}, {},
         None),
        ("spark_local", {}, {}, None),
        # the setting belongs to another cluster manager: it changes nothing here
        ("spark_standalone_cluster", YARN_FALSE, {}, None),
        ("spark_yarn_client", YARN_FALSE, {}, None),
        ("spark_yarn_client", {"spark.submit.deployMode": "cluster"}, {"deploy_mode": "cluster"},
         None),
    ],
)
def test_a_submission_that_returns_before_the_application_ended_is_refused(
    conn_id: str, conf: dict[str, str], kwargs: dict[str, Any], refused: str | None
) -> None:
    problem = submission_problem(hook(conn_id, conf, **kwargs))
    if refused is None:
        assert problem is None
    else:
        assert problem is not None and refused in problem and "COMPLETED" in problem


YARN_CLUSTER_OUTPUT = """\
25/11/25 20:01:02 INFO Client: Requesting a new application from cluster with 4 NodeManagers
25/11/25 20:01:03 INFO Client: Submitting application application_1764100000000_0042 to ResourceManager
25/11/25 20:01:03 INFO YarnClientImpl: Submitted application application_1764100000000_0042
25/11/25 20:01:04 INFO Client: Application report for application_1764100000000_0042 (state: ACCEPTED)
"""

K8S_CLUSTER_OUTPUT = """\
25/11/25 20:01:02 INFO LoggingPodStatusWatcherImpl: State changed, new state:
\t pod name: nycflights-daily-7f3a9c2d41e0b6a8-driver
\t namespace: etl
\t labels: spark-app-selector -> spark-4b1f0c9e2a7d4f11b3c5e8d6a9f0b2c4, spark-role -> driver
25/11/25 20:01:03 INFO LoggingPodStatusWatcherImpl: Deployed Spark application nycflights into Kubernetes
"""

STANDALONE_CLUSTER_OUTPUT = """\
25/11/25 20:01:02 INFO RestSubmissionClient: Submitting a request to launch an application in spark://10.0.0.5:7077.
25/11/25 20:01:03 INFO RestSubmissionClient: Submission successfully created as driver-20251125200103-0007. Polling submission state...
"""


@pytest.mark.parametrize(
    ("conn_id", "output", "expected"),
    [
        ("spark_yarn_cluster", YARN_CLUSTER_OUTPUT,
         RemoteApplication("yarn", "application_1764100000000_0042", "yarn")),
        ("spark_k8s_cluster", K8S_CLUSTER_OUTPUT,
         RemoteApplication("kubernetes", "etl:nycflights-daily-7f3a9c2d41e0b6a8-driver",
                           "k8s://https://k8s.example:6443")),
        ("spark_standalone_cluster", STANDALONE_CLUSTER_OUTPUT,
         RemoteApplication("standalone", "driver-20251125200103-0007", "spark://10.0.0.5:7077")),
        # client and local mode: the driver is spark-submit's JVM, a child of the task process
        ("spark_yarn_client", YARN_CLUSTER_OUTPUT, None),
        ("spark_standalone_client", STANDALONE_CLUSTER_OUTPUT, None),
        ("spark_local", "", None),
    ],
)
def test_the_application_a_fence_must_stop_is_the_one_the_provider_parsed(
    conn_id: str, output: str, expected: RemoteApplication | None
) -> None:
    h = hook(conn_id)
    h._process_spark_submit_log(iter(output.splitlines()))
    assert remote_application(h) == expected


def test_no_parsed_application_means_nothing_to_confirm() -> None:
    # YARN cluster mode whose output named no application id (e.g. it failed before): the
    # fence has no id to kill or ask about, and says nothing about a remote driver.
    h = hook("spark_yarn_cluster")
    h._process_spark_submit_log(iter(["25/11/25 20:01:02 INFO Client: Uploading resource"]))
    assert remote_application(h) is None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class StatusTask:
    """The provider operator's status surface: get_job_status + is_job_active (standalone)."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def get_job_status(self, external_id: str, context: Any) -> str:
        self.asked.append(external_id)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return str(answer)

    def is_job_active(self, status: str) -> bool:
        from airflow.providers.apache.spark.operators.spark_submit import (
            _StandaloneSparkSubmitBackend,
        )

        return _StandaloneSparkSubmitBackend.is_job_active(None, status)  # type: ignore[arg-type]


APP = RemoteApplication("standalone", "driver-20251125200103-0007", "spark://10.0.0.5:7077")


def test_a_kill_is_confirmed_by_the_cluster_managers_final_state() -> None:
    clock = Clock()
    task = StatusTask(["RUNNING", "RUNNING", "KILLED"])
    assert confirm_stopped(task, APP, {}, deadline=10, poll=0.5, clock=clock,
                           sleep=clock.sleep) == "KILLED"
    assert task.asked == [APP.external_id] * 3


@pytest.mark.parametrize(
    ("answers", "detail"),
    [
        (["RUNNING"], "still RUNNING"),
        # RELAUNCHING and UNKNOWN (master in recovery) are active for the provider
        (["UNKNOWN"], "still UNKNOWN"),
        ([ConnectionError("connection refused")], "did not answer: ConnectionError"),
    ],
)
def test_an_unconfirmed_kill_names_the_application_and_says_it_may_still_run(
    answers: list[Any], detail: str
) -> None:
    clock = Clock()
    with pytest.raises(ApplicationNotStopped) as failed:
        confirm_stopped(StatusTask(answers), APP, {}, deadline=5, poll=0.5, clock=clock,
                        sleep=clock.sleep)
    message = str(failed.value)
    assert "driver-20251125200103-0007" in message and "may still be running" in message
    assert detail in message
    assert clock.now == pytest.approx(5.0)  # asked until the deadline, not forever


@pytest.mark.parametrize(
    ("kwargs", "refused"),
    [
        ({"conf": YARN_FALSE}, "yarn_track_via_rm_api"),
        ({"conf": K8S_FALSE}, "track_driver_via_k8s_api"),
        ({"conf": {"spark.submit.deployMode": "cluster"}}, "deploy_mode='cluster'"),
        ({"conf": YARN_FALSE, "yarn_track_via_rm_api": True}, None),
        ({"conf": {"spark.yarn.submit.waitAppCompletion": "{{ var.value.wait }}"}}, None),
        ({"conf": {"spark.submit.deployMode": "cluster"}, "deploy_mode": "cluster"}, None),
    ],
)
def test_import_time_rules_read_only_the_operators_literal_arguments(
    kwargs: dict[str, Any], refused: str | None
) -> None:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    problem = import_problem(SparkSubmitOperator(task_id="job", application="job.py", **kwargs))
    assert (problem is None) if refused is None else (refused in (problem or ""))


@pytest.mark.parametrize("application", [
    APP,
    RemoteApplication("yarn", "application_1700000000000_0042", "yarn"),
    RemoteApplication("kubernetes", "etl:nyc-driver", "k8s://https://k8s.example:6443"),
])
def test_the_ledgers_text_of_an_application_reads_back(application: RemoteApplication) -> None:
    assert parse_application(str(application)) == application
    assert parse_application("a Dagster step's own words") is None


class KillTask(StatusTask):
    """StatusTask whose ``_get_hook`` is the provider's hook on a real connection."""

    def __init__(self, answers: list[Any], conn_id: str = "spark_standalone_cluster") -> None:
        super().__init__(answers)
        self.conn_id = conn_id

    def _get_hook(self) -> SparkSubmitHook:
        return hook(self.conn_id)


@pytest.fixture
def kills(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The commands the provider's on_kill runs (not run: recorded)."""
    commands: list[list[str]] = []

    class Popen:
        def __init__(self, cmd: list[str], **kwargs: Any) -> None:
            commands.append(list(cmd))

        def __enter__(self) -> Popen:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(provider_hook.subprocess, "Popen", Popen)
    return commands


def test_an_earlier_tokens_driver_still_running_is_killed_by_the_provider_then_confirmed(
        kills: list[list[str]]) -> None:
    clock = Clock()
    task = KillTask(["RUNNING", "RUNNING", "KILLED"])
    assert stop_application(task, APP, {}, deadline=10, clock=clock,
                            sleep=clock.sleep) == "KILLED"
    # the provider's own standalone kill, for that driver: through the master's REST server
    # (provider 6.3.3 and later) or `spark-submit --kill <driver id>` (earlier releases)
    (command,) = kills
    assert command[-1] in (f"http://10.0.0.5:6066/v1/submissions/kill/{APP.external_id}",
                           APP.external_id), command
    assert task.asked == [APP.external_id] * 3


def test_an_earlier_tokens_driver_that_ended_is_not_killed(kills: list[list[str]]) -> None:
    assert stop_application(KillTask(["FAILED"]), APP, {}, deadline=10) == "FAILED"
    assert kills == []


@pytest.mark.parametrize(("conn_id", "application", "why"), [
    ("spark_standalone_cluster", APP, None),
    ("spark_standalone_client", APP, "no cluster manager"),
    ("spark_yarn_cluster", APP, "submits to yarn"),
    # another standalone cluster: its driver ids may name another driver here
    ("spark_standalone_cluster", RemoteApplication("standalone", APP.external_id,
                                                   "spark://10.9.9.9:7077"),
     "submits to spark://10.9.9.9:7077".replace("10.9.9.9", "10.0.0.5")),
    # YARN: the master is 'yarn' on every cluster; the ResourceManager tells them apart
    ("spark_yarn_rm", RemoteApplication("yarn", "application_1_0001", "http://rm-a:8088"), None),
    ("spark_yarn_rm", RemoteApplication("yarn", "application_1_0001", "http://rm-b:8088"),
     "submits to http://rm-a:8088"),
    ("spark_yarn_cluster", RemoteApplication("yarn", "application_1_0001", "yarn"),
     "only with yarn_track_via_rm_api=True"),
    ("spark_k8s_tracked", RemoteApplication("kubernetes", "etl:nyc-driver",
                                            "k8s://https://k8s.example:6443"), None),
    ("spark_k8s_tracked", RemoteApplication("kubernetes", "other:nyc-driver",
                                            "k8s://https://k8s.example:6443"),
     "namespace etl"),
    ("spark_k8s_cluster", RemoteApplication("kubernetes", "etl:nyc-driver",
                                            "k8s://https://k8s.example:6443"),
     "only with track_driver_via_k8s_api=True"),
])
def test_only_a_driver_on_this_tasks_own_cluster_manager_is_asked_about_and_killed(
        conn_id: str, application: RemoteApplication, why: str | None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_YARN_RM", json.dumps({
        "conn_type": "spark", "host": "yarn", "extra": {
            "deploy-mode": "cluster", "yarn_resourcemanager_webapp_address": "rm-a:8088"}}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_K8S_TRACKED", json.dumps(CONNECTIONS[
        "spark_k8s_cluster"]))
    options = {"spark_yarn_rm": {"yarn_track_via_rm_api": True},
               "spark_k8s_tracked": {"track_driver_via_k8s_api": True}}.get(conn_id, {})
    task = KillTask([], conn_id)
    task._get_hook = lambda: hook(conn_id, **options)  # type: ignore[method-assign]
    found = elsewhere(task, application)
    assert found is None if why is None else why in (found or ""), found


class Response:
    def __init__(self, status: int, body: Any) -> None:
        self.status_code = status
        self.body = body
        self.text = json.dumps(body)

    def json(self) -> Any:
        return self.body

    def raise_for_status(self) -> None:
        return None


@pytest.mark.parametrize(("answer", "found"), [
    # an ALIVE master that does not know the driver: success false, no message
    ({"action": "SubmissionStatusResponse", "success": False}, "NOT_FOUND"),
    # a standby or recovering master: success false with the exception; not "not found"
    ({"action": "SubmissionStatusResponse", "success": False,
      "message": "Exception from the cluster:\njava.lang.Exception: Can only request driver "
                 "status in ALIVE state. Current state: STANDBY."}, None),
])
def test_only_an_alive_masters_not_found_counts_as_ended(
        kills: list[list[str]], monkeypatch: pytest.MonkeyPatch, answer: Any,
        found: str | None) -> None:
    from airflow.providers.apache.spark.operators import spark_submit as provider_operator

    monkeypatch.setattr(provider_operator.requests, "get",
                        lambda url, timeout: Response(200, answer))
    task = provider_operator.SparkSubmitOperator(task_id="job", application="job.jar",
                                                 conn_id="spark_standalone_cluster")
    clock = Clock()
    if found is not None:
        assert stop_application(task, APP, {}, deadline=1, clock=clock,
                                sleep=clock.sleep) == found
        assert kills == []
    else:  # killed, then not confirmed: the master cannot say
        with pytest.raises(ApplicationNotStopped):
            stop_application(task, APP, {}, deadline=1, clock=clock, sleep=clock.sleep)
        assert len(kills) == 1


def test_a_yarn_application_the_resourcemanager_no_longer_knows_counts_as_ended(
        kills: list[list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_YARN_RM", json.dumps({
        "conn_type": "spark", "host": "yarn", "extra": {
            "deploy-mode": "cluster", "yarn_resourcemanager_webapp_address": "rm-a:8088"}}))
    monkeypatch.setattr(provider_hook.requests, "get",
                        lambda url, **kwargs: Response(404, {"RemoteException": "not found"}))
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    task = SparkSubmitOperator(task_id="job", application="job.jar", conn_id="spark_yarn_rm",
                               yarn_track_via_rm_api=True)
    application = RemoteApplication("yarn", "application_1_0001", "http://rm-a:8088")
    assert elsewhere(task, application) is None
    assert stop_application(task, application, {}, deadline=1) == "NOT_FOUND"
    assert kills == []
