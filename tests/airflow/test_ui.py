"""The NELI page of the Airflow UI, in headless Chromium, against a real api-server and broker.

One secured Airflow deployment (simple auth manager, a real login; api-server and scheduler of
integration/regions/regions.py) and the session's Kafka broker. A plain-Python deployment
("eu-west-1") completes runs and holds the leadership of a role while the browser reads the
page; the Airflow deployment ("us-east-1") runs a gate and the stock task it fences, whose
"NELI run" extra links must lead to that run's ledger entry.

Set ``NELI_UPDATE_SCREENSHOT=1`` to refresh docs/guide/images/airflow-neli-page.png.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from integration.regions.regions import AirflowRegion, AirflowRegions, RegionConfig, neli_connection

pytestmark = [pytest.mark.airflow, pytest.mark.kafka]

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PLUGIN = "neli_orchestrate.airflow.plugins.leadership:NeliPlugin"
SCREENSHOT = REPO / "docs" / "guide" / "images" / "airflow-neli-page.png"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
HELD_ROLE, DAG_ROLE = "ui_hourly", "ui_daily"
DAG_ID = "neli_ui_test"
EAST, WEST = "us-east-1", "eu-west-1"
WEST_UI = "http://airflow.eu-west-1.invalid:8080"


def checkout_settings(root: Path) -> dict[str, str]:
    """Register the provider's policy and plugin as its entry points do in an installed wheel.

    The tests run from a checkout on PYTHONPATH whose installed metadata may predate the
    entry points; then the policy comes from airflow_local_settings.py and the plugin from the
    plugins folder (only then: registered twice, Airflow would report a plugin import error).
    """
    settings = root / "local_settings"
    settings.mkdir(exist_ok=True)
    (settings / "airflow_local_settings.py").write_text(
        "from neli_orchestrate.airflow.policy import dag_policy  # noqa: F401\n")
    plugins = root / "plugins"
    plugins.mkdir(exist_ok=True)
    if not any(ep.value == PLUGIN for ep in entry_points(group="airflow.plugins")):
        (plugins / "neli_checkout.py").write_text(
            "from neli_orchestrate.airflow.plugins.leadership import NeliPlugin  # noqa: F401\n")
    path = os.pathsep.join(p for p in (str(settings), str(REPO), os.environ.get("PYTHONPATH"))
                           if p)
    return {"PYTHONPATH": path, "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins)}


class UI:
    """The deployment, its namespace, and requests to it."""

    def __init__(self, region: AirflowRegion, bootstrap: str, namespace: str) -> None:
        self.region = region
        self.bootstrap = bootstrap
        self.namespace = namespace
        #: the DAG run of the extra-link test, triggered at start: it runs while the browser
        #: tests do
        self.run_id = region.trigger(DAG_ID, "2013-01-07")

    def get(self, path: str, *, token: str | None = None, accept: str = "application/json",
            ) -> tuple[int, dict[str, str], bytes]:
        """GET without following redirects: (status, headers, body)."""
        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: Any, **kwargs: Any) -> None:
                return None

        headers = {"Accept": accept}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        opener = urllib.request.build_opener(NoRedirect)
        request = urllib.request.Request(self.region.api_url + path, headers=headers)
        try:
            with opener.open(request, timeout=60) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def singleton(self, deployment: str) -> Any:
        from neli_orchestrate import NeliConfig, Singleton, SingletonConfig

        return Singleton(SingletonConfig(
            # the default (WAN) timings: a loaded 2-core machine fenced a 1 s lease
            neli=NeliConfig(bootstrap_servers=self.bootstrap),
            namespace=self.namespace, deployment=deployment, acquire_timeout=60))


def start_browser() -> Any:
    """Headless Debian chromium through /usr/bin/chromedriver (fails, never skips, without)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for path in (CHROMIUM, CHROMEDRIVER):
        assert shutil.which(path), f"{path} missing: apt-get install chromium chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--window-size=1200,760", "--disable-gpu"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(120)
    return driver


@pytest.fixture(scope="module")
def started(warm_broker: str, tmp_path_factory: pytest.TempPathFactory,
            ) -> Iterator[tuple[UI, Any]]:
    """The deployment and the browser, started side by side (both take seconds)."""
    root = tmp_path_factory.mktemp("ui")
    namespace = f"ui{uuid.uuid4().hex[:8]}"
    connection = neli_connection(warm_broker, "us-east-1", namespace=namespace,
                                 session_timeout=12, heartbeat_timeout=4, acquire_timeout=30,
                                 handoff_timeout=120,
                                 # eu-west-1's UI; the harness adds us-east-1's own
                                 region_urls={WEST: WEST_UI})
    config = RegionConfig("us-east-1", connections={"neli_default": connection},
                          connection_source="environment", triggerer=False, secured=True,
                          env=checkout_settings(root))
    browsers: list[Any] = []
    failures: list[BaseException] = []

    def launch() -> None:
        try:
            browsers.append(start_browser())
        except BaseException as exc:  # noqa: BLE001 - raised in the fixture below
            failures.append(exc)

    thread = threading.Thread(target=launch)
    thread.start()
    try:
        with AirflowRegions.start(root, [HERE / "dags" / "neli_ui_test.py"],
                                  [config], region_urls=True) as regions:
            thread.join()
            if failures:
                raise failures[0]
            yield UI(regions["us-east-1"], warm_broker, namespace), browsers[0]
            # nothing to shut down gracefully in a throwaway deployment: 5 s, then SIGKILL
            regions["us-east-1"].stop(timeout=5)
    finally:
        thread.join()
        for driver in browsers:
            driver.quit()


@pytest.fixture
def ui(started: tuple[UI, Any]) -> UI:
    return started[0]


@pytest.fixture
def browser(started: tuple[UI, Any]) -> Any:
    return started[1]


def login(browser: Any, ui: UI) -> None:
    """Sign the browser in as Airflow's UI does: the api-server's JWT in the ``_token`` cookie."""
    browser.get(ui.region.api_url + "/api/v2/monitor/health")
    browser.add_cookie({"name": "_token", "value": ui.region.token(), "path": "/"})


def group_leader(ui: UI, role: str) -> str:
    """The member name (client.id ``neli-<name>``) that holds the role group's leader-topic
    partition, read from the broker with a plain AdminClient."""
    from confluent_kafka.admin import AdminClient

    from neli_orchestrate.core.namespace import derive

    names = derive(ui.namespace)
    admin = AdminClient({"bootstrap.servers": ui.bootstrap})
    group = names.group_id(role)
    description = admin.describe_consumer_groups([group])[group].result(timeout=30)
    holders = [m.client_id for m in description.members
               if any(tp.topic == names.leader_topic for tp in
                      (m.assignment.topic_partitions if m.assignment else []))]
    assert len(holders) == 1 and holders[0].startswith("neli-"), description
    return str(holders[0][len("neli-"):])


def page(browser: Any, ui: UI, query: str = "") -> Any:
    from selenium.webdriver.common.by import By

    browser.get(f"{ui.region.api_url}/neli/{query}")
    return browser.find_element(By.TAG_NAME, "body")


def test_anonymous_users_see_nothing_and_browsers_are_sent_to_login(ui: UI, browser: Any) -> None:
    for path in ("/neli/", "/neli/api/overview"):
        status, _, body = ui.get(path)
        assert status == 401, (path, status, body[:300])
        assert ui.namespace.encode() not in body
        status, _, body = ui.get(path, token="not-a-jwt")
        assert status in (401, 403), (path, status)
    status, headers, _ = ui.get("/neli/", accept="text/html")
    assert status == 303 and "/auth/login" in headers["location"], (status, headers)
    browser.delete_all_cookies()
    body = page(browser, ui)
    assert "/neli/" not in browser.current_url.split("?")[0], browser.current_url
    assert ui.namespace not in body.text and "Recent runs" not in body.text
    # the same request with the admin's token is served
    status, _, body = ui.get("/neli/api/overview", token=ui.region.token())
    assert status == 200 and json.loads(body)["namespace"] == ui.namespace


def test_the_menu_lists_the_page(ui: UI) -> None:
    plugins = ui.region.api("GET", "/api/v2/plugins")["plugins"]
    ours = [p for p in plugins if p["name"] == "neli_orchestrate"]
    assert ours, [p["name"] for p in plugins]
    assert ours[0]["fastapi_apps"][0]["url_prefix"] == "/neli"
    assert [v["href"] for v in ours[0]["external_views"]] == ["/neli/"]
    assert ours[0]["global_operator_extra_links"]


def test_page_shows_the_leader_the_ledger_and_the_timeline(ui: UI, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    from neli_orchestrate.cli._context import Target
    from neli_orchestrate.ledger.history import read_history

    holding, release = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}
    errors: list[BaseException] = []

    def lead() -> None:
        try:
            # two deployments led the role before: the timeline shows both
            with ui.singleton(EAST) as east, east.claim(HELD_ROLE, "2013-01-01T03") as run:
                assert run.should_run
            with ui.singleton(WEST) as west:
                with west.claim(HELD_ROLE, "2013-01-01T04") as run:
                    assert run.should_run
                with west.claim(HELD_ROLE, "2013-01-01T05") as run:
                    assert run.should_run
                    seen["member"] = west.status(HELD_ROLE, "2013-01-01T05").member
                    holding.set()
                    release.wait(120)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
            holding.set()

    thread = threading.Thread(target=lead)
    thread.start()
    try:
        assert holding.wait(120) and not errors, errors
        target = Target(bootstrap_servers=ui.bootstrap, namespace=ui.namespace)
        # who leads, from the group itself: its one member holds the leader partition, and is
        # the member that wrote the RUNNING record (it holds the claim until released)
        assert group_leader(ui, HELD_ROLE) == seen["member"].rsplit("#", 1)[0]
        login(browser, ui)
        body = page(browser, ui, f"?role={HELD_ROLE}")
        section = browser.find_element(By.ID, f"role-{HELD_ROLE}")
        assert section.get_attribute("data-leader-member") == seen["member"], body.text
        assert section.get_attribute("data-leader-deployment") == WEST
        assert section.find_element(By.CLASS_NAME, "leader-deployment").text == WEST
        assert section.find_element(By.CLASS_NAME, "leader-since").text.startswith("20")
        # ledger rows: the latest record of every run key, as the ledger holds them
        history = read_history(target.ledger_config(), roles=[HELD_ROLE])
        expected = {key: e.record for (role, key), e in history.latest().items()
                    if role == HELD_ROLE and e.record is not None}
        rows = section.find_elements(By.CSS_SELECTOR, "tr.run-row")
        shown = {r.get_attribute("data-run-key"): r for r in rows}
        assert set(shown) == set(expected) == {"2013-01-01T03", "2013-01-01T04",
                                               "2013-01-01T05"}
        for key, record in expected.items():
            cells = [c.text for c in shown[key].find_elements(By.TAG_NAME, "td")]
            assert cells[:5] == [key, record.state.value, str(record.token), record.deployment,
                                 str(record.attempt)], (key, cells)
        assert shown["2013-01-01T05"].get_attribute("data-state") == "RUNNING"  # inside claim()
        assert shown["2013-01-01T03"].get_attribute("data-state") == "COMPLETED"
        # the timeline: the leader's spell is the newest, attributed to its deployment
        spells = section.find_elements(By.CSS_SELECTOR, "tr.spell-row")
        assert spells, body.text
        assert spells[-1].get_attribute("data-member") == seen["member"]
        assert spells[-1].get_attribute("data-deployment") == WEST
        assert {s.get_attribute("data-deployment") for s in spells} == {EAST, WEST}
        assert group_leader(ui, HELD_ROLE) == seen["member"].rsplit("#", 1)[0]
        browser.save_screenshot(str(Path(os.environ.get("TMPDIR", "/tmp")) / "neli-ui.png"))
        if os.environ.get("NELI_UPDATE_SCREENSHOT"):
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            browser.save_screenshot(str(SCREENSHOT))
    finally:
        release.set()
        thread.join(60)
    assert not errors, errors


def test_extra_links_of_the_gate_and_the_fenced_task_open_the_runs_ledger_entry(
        ui: UI, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    from neli_orchestrate.cli._context import Target
    from neli_orchestrate.ledger.history import read_history

    region, run_id = ui.region, ui.run_id
    states = region.wait_for_runs(DAG_ID, [run_id], timeout=180)
    assert states == {run_id: "success"}, region.task_instances(DAG_ID, run_id)
    run_key = "neli_ui_test/2013-01-07T00:00:00+00:00"
    urls = {}
    for task_id in ("gate", "job"):
        links = region.api("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/"
                                  f"{task_id}/links")
        urls[task_id] = links["extra_links"].get("NELI run")
    assert urls["gate"] and urls["gate"] == urls["job"], urls
    target = Target(bootstrap_servers=ui.bootstrap, namespace=ui.namespace)
    history = read_history(target.ledger_config(), roles=[DAG_ROLE])
    records = [e.record for e in history.entries if e.run_key == run_key and e.record]
    assert records and records[-1].state.value == "COMPLETED", records
    login(browser, ui)
    browser.get(region.api_url + urls["gate"])
    section = browser.find_element(By.ID, "run")
    assert section.get_attribute("data-run-key") == run_key
    rows = section.find_elements(By.CSS_SELECTOR, "tr.history-row")
    shown = [[c.text for c in r.find_elements(By.TAG_NAME, "td")][:4] for r in rows]
    assert shown == [[r.run_key, r.state.value, str(r.token), r.deployment] for r in records]
    assert all(r.deployment == "us-east-1" for r in records)
    selected = browser.find_elements(By.CSS_SELECTOR, "tr.run-row.selected")
    assert [s.get_attribute("data-run-key") for s in selected] == [run_key]


def test_a_skipped_run_says_where_it_ran_with_the_token_and_a_link_to_that_region(
        ui: UI, browser: Any, claim_now: Any) -> None:
    """eu-west-1 completed the date: us-east-1's gate skips it; the "Ran in region" link of the
    gate and the skipped task leads to eu-west-1's run, and the NELI page names region, token
    and that link. A region's ``/neli/ran`` opens its own DAG run of the run key and token."""
    from urllib.parse import quote, urlencode

    from selenium.webdriver.common.by import By

    region = ui.region
    # us-east-1's own run of 2013-01-07 (test_extra_links_… triggered it): finished first, so
    # the role is free for eu-west-1
    assert region.wait_for_runs(DAG_ID, [ui.run_id], timeout=180) == {ui.run_id: "success"}
    own_key = "neli_ui_test/2013-01-07T00:00:00+00:00"
    run_key = "neli_ui_test/2013-01-08T00:00:00+00:00"
    with ui.singleton(WEST) as west:
        reservation = claim_now(west, DAG_ROLE, run_key)
        west.execute(DAG_ROLE, run_key, reservation.token, lambda run: None)
        done = west.status(DAG_ROLE, run_key)
        own = west.status(DAG_ROLE, own_key)
    assert (done.deployment, done.state.value, own.deployment) == (WEST, "COMPLETED", EAST)

    run_id = region.trigger(DAG_ID, "2013-01-08")
    assert region.wait_for_runs(DAG_ID, [run_id], timeout=180) == {run_id: "success"}
    tis = region.task_instances(DAG_ID, run_id)
    assert (tis["gate"]["state"], tis["job"]["state"]) == ("success", "skipped")
    expected = f"{WEST_UI}/neli/ran?" + urlencode({
        "role": DAG_ROLE, "run_key": run_key, "token": done.token, "dag_id": DAG_ID,
        "task_id": "job"})
    for task_id in ("gate", "job"):
        links = region.api("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/"
                                  f"{task_id}/links")["extra_links"]
        assert links.get("Ran in region") == expected, (task_id, links)
    # the run this region ran itself has no such link
    links = region.api("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{ui.run_id}/taskInstances/"
                              "job/links")["extra_links"]
    assert not links.get("Ran in region"), links
    log = region.task_log(DAG_ID, run_id, "gate")
    assert f"Ran in deployment '{WEST}' with token {done.token}: {expected}" in log, log[-3000:]

    # the NELI page, opened from the skipped task's "NELI run" link
    login(browser, ui)
    job_links = region.api("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/"
                                  "job/links")["extra_links"]
    browser.get(region.api_url + job_links["NELI run"])
    ran_in = browser.find_element(By.ID, "ran-in")
    assert (ran_in.get_attribute("data-deployment"), ran_in.get_attribute("data-token")) == (
        WEST, str(done.token))
    assert f"Ran in deployment {WEST}" in ran_in.text and str(done.token) in ran_in.text
    href = browser.find_element(By.ID, "ran-in-link").get_attribute("href")
    assert href == f"{WEST_UI}/neli/ran?" + urlencode({
        "role": DAG_ROLE, "run_key": run_key, "token": done.token, "dag_id": DAG_ID})

    # what eu-west-1's /neli/ran does, here for us-east-1's own run: its DAG run's task page
    token = region.token()
    query = urlencode({"role": DAG_ROLE, "run_key": own_key, "token": own.token,
                       "dag_id": DAG_ID, "task_id": "job"})
    status, headers, _ = ui.get(f"/neli/ran?{query}", token=token)
    assert status == 303, status
    headers = {k.lower(): v for k, v in headers.items()}
    assert headers["location"] == (
        f"/dags/{DAG_ID}/runs/{quote(ui.run_id, safe='')}/tasks/job"), headers
    # a newer token of that run key than its gate's (a retry of the task re-claimed it): the
    # same run
    query = urlencode({"role": DAG_ROLE, "run_key": own_key, "token": own.token + 100,
                       "dag_id": DAG_ID})
    status, headers, _ = ui.get(f"/neli/ran?{query}", token=token)
    headers = {k.lower(): v for k, v in headers.items()}
    assert (status, headers["location"]) == (
        303, f"/dags/{DAG_ID}/runs/{quote(ui.run_id, safe='')}"), headers
    # a run key no gate of this region claimed: its ledger view of the run key instead
    query = urlencode({"role": DAG_ROLE, "run_key": run_key, "token": done.token})
    status, headers, _ = ui.get(f"/neli/ran?{query}", token=token)
    headers = {k.lower(): v for k, v in headers.items()}
    assert status == 303 and headers["location"].startswith("/neli/?"), (status, headers)
