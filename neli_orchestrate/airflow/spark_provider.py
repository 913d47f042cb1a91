"""The Apache Spark provider, as a fenced SparkSubmitOperator needs it: the one adapter.

Every read or write of the provider's private members (``SparkSubmitOperator._hook``,
``_get_hook``, ``_deploy_mode``…; ``SparkSubmitHook._connection``, ``_driver_id``,
``_submit_sp``…) is in this module, so a provider upgrade that renames one breaks here and in
``tests/airflow/test_spark_provider.py``, which CI also runs against the oldest and the newest
provider release of the range ``pyproject.toml`` states (``tests/airflow/test_provider_range.py``).
Nothing here imports the provider: it reads the operator's and the hook's attributes.

Usage::

    problem = import_problem(task)                 # at DAG import: None, or what to set
    problem = submission_problem(task_hook(task))  # at run time, from the provider's parsing
    app = remote_application(built_hook(task))     # after a fence: the driver on the cluster
    status = confirm_stopped(task, app, context, deadline=30.0)  # or ApplicationNotStopped
    earlier = parse_application(run.unstopped)      # what an earlier token left running
    if elsewhere(task, earlier) is None:            # on this task's own cluster manager
        status = stop_application(task, earlier, context, deadline=30.0)  # kill, confirm

When the work is done: a fenced task records ``COMPLETED`` when the operator's ``execute``
returns, so ``execute`` must return only once the Spark application reached its final state.
With the Apache Spark provider that holds in every deploy mode it supports, except where a
setting makes spark-submit return right after the submission:

- ``spark.yarn.submit.waitAppCompletion=false`` in YARN cluster mode, unless the provider polls
  the ResourceManager itself (``yarn_track_via_rm_api=True``);
- ``spark.kubernetes.submission.waitAppCompletion=false`` in Kubernetes cluster mode, unless the
  provider polls the driver pod (``track_driver_via_k8s_api=True``);
- ``spark.submit.deployMode=cluster`` in ``conf`` while the operator and the connection say no
  deploy mode: spark-submit submits in cluster mode and exits, but the provider, which reads the
  deploy mode only from ``deploy_mode=`` and the connection's ``deploy-mode`` extra, neither
  tracks nor kills the driver.

These are refused, at DAG import where the values are literal and again at run time from the
provider's own parsing of the connection (nothing is claimed then).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "ApplicationNotStopped",
    "RemoteApplication",
    "built_hook",
    "cluster_deploy_mode",
    "is_spark_submit",
    "rebuild_hook",
    "submit_process",
    "task_hook",
    "confirm_stopped",
    "elsewhere",
    "import_problem",
    "parse_application",
    "remote_application",
    "stop_application",
    "submission_problem",
]

YARN_WAIT = "spark.yarn.submit.waitAppCompletion"
K8S_WAIT = "spark.kubernetes.submission.waitAppCompletion"
DEPLOY_MODE = "spark.submit.deployMode"


def is_spark_submit(task: Any) -> bool:
    """Whether ``task`` is the provider's ``SparkSubmitOperator`` (or a subclass of it)."""
    return any(
        cls.__name__ == "SparkSubmitOperator" and cls.__module__.startswith("airflow.providers.")
        for cls in type(task).__mro__
    )


def task_hook(task: Any) -> Any:
    """The operator's ``SparkSubmitHook``, built now if it was not (the provider parses the
    connection when it builds it)."""
    return task._get_hook()


def built_hook(task: Any) -> Any:
    """The hook the operator's ``execute`` built and submits with; None before that."""
    return getattr(task, "_hook", None)


def rebuild_hook(task: Any) -> None:
    """Drop the operator's hook, so that the next one is built from its conf as it is now (the
    hook copies ``conf`` when it is built: the claim's conf must be in it)."""
    task._hook = None


def cluster_deploy_mode(hook: Any) -> bool:
    """Whether ``hook`` submits its driver to the cluster (cluster deploy mode): then it is not
    the task's own child, and only the cluster manager can stop it."""
    return bool(hook._connection.get("deploy_mode") == "cluster")


def submit_process(task: Any) -> Any:
    """The spark-submit process (``subprocess.Popen``) of the operator's hook; None before the
    submission."""
    hook = built_hook(task)
    return getattr(hook, "_submit_sp", None) if hook is not None else None


def _is_false(value: object) -> bool:
    return isinstance(value, str | bool) and str(value).strip().lower() == "false"


def _literal(conf: Mapping[Any, Any], key: str) -> object:
    value = conf.get(key)
    # A Jinja template is decided at run time (submission_problem), not at import.
    return None if isinstance(value, str) and ("{{" in value or "{%" in value) else value


def _problems(conf: Mapping[Any, Any], *, deploy_mode: str | None, yarn_rm_api: bool,
              k8s_api: bool, yarn_cluster: bool | None, k8s_cluster: bool | None) -> str | None:
    """The shared rules; ``yarn_cluster``/``k8s_cluster`` None means "not known yet" (import)."""
    if _is_false(_literal(conf, YARN_WAIT)) and not yarn_rm_api and yarn_cluster is not False:
        return (f"{YARN_WAIT}=false makes spark-submit return right after YARN accepted the "
                "application, so the run would be recorded COMPLETED while it still runs (and "
                f"lost if it then fails). Remove {YARN_WAIT} from conf, or pass "
                "yarn_track_via_rm_api=True so the provider polls the ResourceManager until the "
                "application's final state")
    if _is_false(_literal(conf, K8S_WAIT)) and not k8s_api and k8s_cluster is not False:
        return (f"{K8S_WAIT}=false makes spark-submit return once the driver pod exists, so the "
                "run would be recorded COMPLETED while it still runs (and lost if it then "
                f"fails). Remove {K8S_WAIT} from conf, or pass track_driver_via_k8s_api=True so "
                "the provider polls the driver pod until it succeeded or failed")
    mode = _literal(conf, DEPLOY_MODE)
    if not deploy_mode and isinstance(mode, str) and mode.strip().lower() == "cluster":
        return (f"{DEPLOY_MODE}=cluster in conf submits the driver to the cluster, but the "
                "provider takes the deploy mode only from deploy_mode= (or the Spark "
                "connection's 'deploy-mode' extra): it would neither wait for nor kill the "
                "driver, and the run would be recorded COMPLETED at the submission. Pass "
                f"deploy_mode='cluster' to the operator instead of {DEPLOY_MODE}")
    return None


def import_problem(task: Any) -> str | None:
    """Why a SparkSubmitOperator behind a gate could record COMPLETED too early (DAG import).

    Reads only the operator's own arguments (the connection may not be readable where DAGs are
    parsed); templated values are left to :func:`submission_problem` at run time.
    """
    conf = task.conf if isinstance(getattr(task, "conf", None), Mapping) else {}
    return _problems(
        conf,
        deploy_mode=getattr(task, "_deploy_mode", None),
        yarn_rm_api=bool(getattr(task, "_yarn_track_via_rm_api", False)),
        k8s_api=bool(getattr(task, "_track_driver_via_k8s_api", False)),
        yarn_cluster=None,
        k8s_cluster=None,
    )


def submission_problem(hook: Any) -> str | None:
    """The same rules on a ``SparkSubmitHook``: master and deploy mode as the provider parsed
    them from the connection and the operator."""
    connection = hook._connection
    deploy_mode = connection.get("deploy_mode")
    return _problems(
        hook._conf or {},
        deploy_mode=deploy_mode,
        yarn_rm_api=bool(hook._should_track_yarn_application_via_rm_api()),
        k8s_api=bool(hook._should_track_driver_via_k8s_api()),
        yarn_cluster=bool(hook._is_yarn_cluster_mode),
        k8s_cluster=bool(hook._is_kubernetes and deploy_mode == "cluster"),
    )


@dataclass(frozen=True)
class RemoteApplication:
    """A driver that runs on the cluster, not in the task's process tree."""

    #: ``standalone``, ``yarn`` or ``kubernetes``.
    manager: str
    #: What the provider tracks it by: driver id, YARN application id, ``namespace:pod``.
    external_id: str
    #: The cluster manager it runs on (master URL).
    master: str

    def __str__(self) -> str:
        return f"{self.manager} application {self.external_id} on {self.master}"


_TEXT = re.compile(r"(standalone|yarn|kubernetes) application (\S+) on (\S.*)")


def parse_application(text: str) -> RemoteApplication | None:
    """The :class:`RemoteApplication` whose ``str()`` is ``text`` (as the ledger stores it);
    None for anything else (an application another integration named its own way)."""
    match = _TEXT.fullmatch(text.strip())
    return RemoteApplication(*match.groups()) if match else None


def _cluster(hook: Any) -> str:
    """The cluster manager ``hook`` submits to, as a :class:`RemoteApplication` names it: the
    master URL; for YARN, whose master is ``yarn`` everywhere, the ResourceManager's web
    address where the connection gives one (``yarn_resourcemanager_webapp_address``)."""
    master = str(hook._connection.get("master"))
    if hook._is_yarn:
        try:
            return str(hook._get_yarn_rm_base_url())
        except (ValueError, RuntimeError, AttributeError):
            return master
    return master


def remote_application(hook: Any) -> RemoteApplication | None:
    """The driver the provider submitted to the cluster (cluster deploy mode), if it knows one.

    Uses what the provider parsed from spark-submit's output: the standalone driver id, the
    YARN application id, the Kubernetes driver pod. None in client and local mode (the driver
    is spark-submit's own JVM, a child of the task process).
    """
    manager = None if hook is None else _manager(hook)
    if manager == "standalone":
        external_id = hook._driver_id
    elif manager == "yarn":
        external_id = hook._yarn_application_id
    elif manager == "kubernetes" and hook._kubernetes_driver_pod:
        namespace = hook._connection.get("namespace") or "default"
        external_id = f"{namespace}:{hook._kubernetes_driver_pod}"
    else:
        return None
    return RemoteApplication(manager, external_id, _cluster(hook)) if external_id else None


class ApplicationNotStopped(RuntimeError):  # noqa: N818 - reads as what happened
    """A fenced or failed try could not confirm that its remote Spark application stopped."""

    def __init__(self, application: RemoteApplication, detail: str) -> None:
        self.application = application
        super().__init__(
            f"could not confirm that {application} stopped ({detail}): it may still be "
            f"running. Check it on the cluster manager and kill it if so; a successor's "
            f"output is protected only by the token-checked sink (docs/guide/spark.md)"
        )


def confirm_stopped(
    task: Any,
    application: RemoteApplication,
    context: Any,
    *,
    deadline: float,
    poll: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Ask the cluster manager for ``application``'s state until it is no longer active.

    Uses the provider's own status query and state sets (``get_job_status``,
    ``is_job_active``) of the stock SparkSubmitOperator. Returns the final state; raises
    :class:`ApplicationNotStopped` if the manager still shows it active, or cannot be asked,
    within ``deadline`` seconds.
    """
    end = clock() + deadline
    last = "no answer yet"
    while True:
        try:
            status = str(task.get_job_status(application.external_id, context))
        except Exception as exc:  # noqa: BLE001 - unreachable manager: keep asking until the end
            last = f"the cluster manager did not answer: {type(exc).__name__}: {exc}"
        else:
            if not task.is_job_active(status):
                logger.info("%s is stopped: %s", application, status)
                return status
            last = f"still {status}"
        if clock() >= end:
            raise ApplicationNotStopped(application, f"{last} after {deadline:g} s")
        sleep(poll)


def _manager(hook: Any) -> str | None:
    """Which cluster manager ``hook`` submits drivers to in cluster mode (None: client mode)."""
    if not cluster_deploy_mode(hook):
        return None
    if hook._should_track_driver_status:
        return "standalone"
    if hook._is_yarn:
        return "yarn"
    if hook._is_kubernetes:
        return "kubernetes"
    return None


def elsewhere(task: Any, application: RemoteApplication) -> str | None:
    """Why ``task`` cannot ask about and kill ``application``; None if its own cluster
    manager can, through the provider.

    Another kind of cluster manager, client mode, another cluster (driver ids are unique only
    within one cluster manager: another cluster's ``driver-…`` id may name another driver
    here), another Kubernetes namespace, or a provider setting without which the provider can
    neither ask for an application's state nor kill it by id.
    """
    hook = task_hook(task)
    manager = _manager(hook)
    if manager != application.manager:
        return (f"this task's Spark connection submits to "
                f"{manager or 'no cluster manager (client or local mode)'}")
    cluster = _cluster(hook)
    if cluster != application.master:
        return f"this task's Spark connection submits to {cluster}"
    if manager == "yarn" and not hook._yarn_track_via_rm_api:
        return ("the provider asks YARN for an application's state and kills it by id only "
                "with yarn_track_via_rm_api=True")
    if manager == "kubernetes":
        if not hook._should_track_driver_via_k8s_api():
            return ("the provider asks for a driver pod's phase and deletes it by name only "
                    "with track_driver_via_k8s_api=True")
        namespace = hook._connection.get("namespace") or "default"
        if application.external_id.split(":", 1)[0] != namespace:
            return f"this task's Spark connection submits to namespace {namespace}"
    return None


def _not_found(exc: Exception) -> bool:
    """The cluster manager answered that it does not know the application (it ended and was
    forgotten): an ALIVE standalone master's ``"success": false`` without an exception (a
    standby or recovering master answers with one), the ResourceManager's 404, as the
    provider reports them."""
    text = str(exc)
    if not isinstance(exc, RuntimeError):
        return False
    if "Spark REST API returned failure" in text:
        return text.endswith((": unknown error", ": None"))
    return "YARN RM REST API returned HTTP 404" in text


def stop_application(
    task: Any,
    application: RemoteApplication,
    context: Any,
    *,
    deadline: float,
    poll: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Stop ``application`` (an earlier try's driver) through ``task``'s own cluster manager.

    Call it only where :func:`elsewhere` says the task's cluster manager can. Asks for the
    application's state with the provider's status query; if it is still active, kills it
    with the provider's own kill (a new ``SparkSubmitHook`` of the task, given the driver id,
    the YARN application id or the driver pod) and asks again until it is no longer active
    (:func:`confirm_stopped`). Returns the final state (``NOT_FOUND`` where the manager no
    longer knows it). Raises :class:`ApplicationNotStopped` if the manager does not confirm
    the stop within ``deadline`` seconds.
    """
    try:
        status = str(task.get_job_status(application.external_id, context))
    except Exception as exc:  # noqa: BLE001 - kill and ask again below
        if _not_found(exc):
            logger.info("%s, started under an earlier token, is unknown to its cluster manager "
                        "(%s)", application, exc)
            return "NOT_FOUND"
        logger.info("could not ask for %s before killing it: %s: %s", application,
                    type(exc).__name__, exc)
    else:
        if not task.is_job_active(status):
            logger.info("%s, started under an earlier token, is not running: %s", application,
                        status)
            return status
    logger.warning("killing %s, started under an earlier token, before submitting", application)
    hook = task_hook(task)
    if application.manager == "standalone":
        hook._driver_id = application.external_id
    elif application.manager == "yarn":
        hook._yarn_application_id = application.external_id
    else:
        hook._kubernetes_driver_pod = application.external_id.split(":", 1)[-1]
    hook._post_submit_commands_done = True  # the task's own, after its own job: not here
    try:
        hook.on_kill()
    except Exception:  # noqa: BLE001 - the confirmation below says whether it worked
        logger.exception("the provider's kill of %s failed", application)
    return confirm_stopped(task, application, context, deadline=deadline, poll=poll,
                           clock=clock, sleep=sleep)
