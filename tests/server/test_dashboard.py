"""The dashboard against a real server: pages escape what jobs and queues bring, actions need
the form token and do what they say (checked through the OJS API or the wire protocol), and
`--no-dashboard` turns it off."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from markupsafe import escape

from tests.interop.gearman_raw import Cmd, GearmanSocket
from tests.server.dashboard_support import Browser, wait_until
from tests.servers import ServerProcess, free_port, start_jobwire, wait_for_port

EVIL_QUEUE = '<script>alert("q")</script>'
EVIL_PAYLOAD = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("dashboard")
    server = start_jobwire(http=True, store=f"sqlite:{workdir / 'jobs.db'}", workdir=workdir)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def browser(server: ServerProcess) -> Browser:
    assert server.http_port is not None
    return Browser(server.http_port)


def dead_job(browser: Browser, queue: str, args: list[object]) -> str:
    """An OJS job that ran once and failed into the dead letter queue; its id."""
    retry = {"max_attempts": 1, "on_exhaustion": "dead_letter"}
    body = {"type": "t", "args": args, "options": {"queue": queue, "retry": retry}}
    job = browser.json("POST", "/ojs/v1/jobs", body)["job"]
    fetched = browser.json("POST", "/ojs/v1/workers/fetch", {"queues": [queue]})["jobs"]
    assert [j["id"] for j in fetched] == [job["id"]]
    error = {"code": "boom", "message": EVIL_PAYLOAD}
    nacked = browser.json("POST", "/ojs/v1/workers/nack", {"job_id": job["id"], "error": error})
    assert nacked["state"] == "discarded"
    return str(job["id"])


def assert_escaped(text: str) -> None:
    for raw in (EVIL_QUEUE, EVIL_PAYLOAD):
        assert raw not in text
    assert "<script>" not in text.replace('<script src="/ui/static/dashboard.js" defer>', "")


def test_every_page_escapes_queue_names_and_payloads(
    server: ServerProcess, browser: Browser
) -> None:
    """Promise: a queue (Gearman function) name and payloads holding HTML and script are
    shown as text on every page, never as markup; every page sends a script-src 'self'
    Content-Security-Policy."""
    with GearmanSocket(server) as gearman:
        handle = gearman.submit_bg(EVIL_QUEUE, EVIL_PAYLOAD, unique="evil-unique")
    dead = dead_job(browser, "escapes", [EVIL_PAYLOAD])
    pages = [
        "/",
        "/ui/queues",
        f"/ui/queues/{quote(EVIL_QUEUE, safe='')}",
        "/ui/workers",
        "/ui/jobs?list=dead",
        "/ui/jobs?list=scheduled",
        "/ui/jobs?list=retrying",
        f"/ui/jobs/{quote(handle, safe='')}",
        f"/ui/jobs/{dead}",
        "/ui/cron",
        "/ui/workflows",
        f"/ui/jobs?q={quote(EVIL_QUEUE)}",  # not found: the search term is echoed
    ]
    for path in pages:
        page = browser.get(path)
        assert page.status == 200, (path, page.status, page.text[:500])
        assert page.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert_escaped(page.text)
    queue_page = browser.get(f"/ui/queues/{quote(EVIL_QUEUE, safe='')}").text
    assert str(escape(EVIL_QUEUE)) in queue_page
    job_page = browser.get(f"/ui/jobs/{quote(handle, safe='')}").text
    assert str(escape(EVIL_PAYLOAD)) in job_page
    assert "gearman" in job_page
    assert "Errors, by attempt" in browser.get(f"/ui/jobs/{dead}").text
    dead_page = browser.get("/ui/jobs?list=dead").text
    assert dead in dead_page
    assert str(escape(f"boom: {EVIL_PAYLOAD}")) in dead_page


def test_a_job_is_found_by_handle_and_by_unique_key(
    server: ServerProcess, browser: Browser
) -> None:
    """Promise: the jobs search takes a Gearman handle or a unique key to the job's page."""
    with GearmanSocket(server) as gearman:
        handle = gearman.submit_bg("lookup", b"x", unique="find-me-by-this")
    for needle in (handle, "find-me-by-this"):
        page = browser.get(f"/ui/jobs?q={quote(needle)}")
        assert page.status == 303
        assert page.headers["location"] == f"/ui/jobs/{quote(handle, safe='')}"
    missing = browser.get("/ui/jobs?q=no-such-job")
    assert missing.status == 200 and "No job matches" in missing.text


def queue_paused(browser: Browser, name: str) -> bool:
    items = browser.json("GET", "/ojs/v1/admin/queues?per_page=1000")["items"]
    return bool(next(q for q in items if q["name"] == name)["paused"])


def test_actions_need_the_form_token_from_this_site(
    server: ServerProcess, browser: Browser
) -> None:
    """Promise: a POST without the cookie's token, with another token, or from another
    origin is refused (403) and changes nothing; with the token it pauses and resumes."""
    with GearmanSocket(server) as gearman:
        gearman.submit_bg("pausable", b"x")
    path = "/ui/queues/pausable/pause"
    stranger = Browser(browser.port)
    assert stranger.post_form(path, {"next": "/ui/queues"}).status == 403
    token = browser.get("/ui/queues").csrf()
    assert browser.post_form(path, {"csrf": "x" * len(token)}).status == 403
    foreign = browser.post_form(path, {"csrf": token}, Origin="http://evil.example")
    assert foreign.status == 403
    assert not queue_paused(browser, "pausable")

    done = browser.post_form(path, {"csrf": token, "next": "//evil.example/"})
    assert done.status == 303
    assert done.headers["location"] == "/ui/queues"  # never another site
    assert queue_paused(browser, "pausable")
    assert "paused" in browser.get("/ui/queues/pausable").text
    resumed = browser.post_form("/ui/queues/pausable/resume", {"csrf": token, "next": "/"})
    assert (resumed.status, resumed.headers["location"]) == (303, "/")
    assert not queue_paused(browser, "pausable")


def test_retry_of_a_dead_job_runs_it_again(browser: Browser) -> None:
    """Promise: Retry on a dead job's page puts it back in its queue: a worker fetches it."""
    job_id = dead_job(browser, "revive", ["again"])
    token = browser.get(f"/ui/jobs/{job_id}").csrf()
    page = browser.post_form(f"/ui/jobs/{job_id}/retry", {"csrf": token})
    assert page.status == 303
    fetched = browser.json("POST", "/ojs/v1/workers/fetch", {"queues": ["revive"]})["jobs"]
    assert [(j["id"], j["args"]) for j in fetched] == [(job_id, ["again"])]


def test_bulk_delete_and_retry_of_dead_jobs(browser: Browser) -> None:
    """Promise: the dead list's bulk buttons act on every job ticked, and only on those."""
    first, second, third = (dead_job(browser, "bulk", [n]) for n in (1, 2, 3))
    token = browser.get("/ui/jobs?list=dead").csrf()
    fields = [("csrf", token), ("action", "delete"), ("job", first), ("job", second)]
    assert browser.post_form("/ui/bulk", fields).status == 303
    listed = browser.json("GET", "/ojs/v1/admin/dead-letter?queue=bulk")["items"]
    assert [j["id"] for j in listed] == [third]
    fields = [("csrf", token), ("action", "retry"), ("job", third)]
    assert browser.post_form("/ui/bulk", fields).status == 303
    fetched = browser.json("POST", "/ojs/v1/workers/fetch", {"queues": ["bulk"]})["jobs"]
    assert [j["id"] for j in fetched] == [third]


def test_quiet_reaches_an_ojs_worker_in_its_heartbeat(browser: Browser) -> None:
    """Promise: Quiet on the workers page is what the OJS worker's next heartbeat hears."""
    body = {"worker_id": "dash-w1", "queues": ["q1"], "concurrency": 1}
    browser.json("POST", "/ojs/v1/workers/register", body)
    page = browser.get("/ui/workers")
    assert "dash-w1" in page.text
    done = browser.post_form("/ui/workers/dash-w1/state", {"csrf": page.csrf(), "state": "quiet"})
    assert done.status == 303
    beat = browser.json("POST", "/ojs/v1/workers/heartbeat", {"worker_id": "dash-w1"})
    assert beat["state"] == "quiet"
    bad = browser.post_form("/ui/workers/dash-w1/state", {"csrf": page.csrf(), "state": "x"})
    assert bad.status == 400 and "state must be one of" in bad.text


def test_quiet_a_gearman_worker(server: ServerProcess, browser: Browser) -> None:
    """Promise: Quiet on the workers page reaches a Gearman worker: it is handed no job."""
    with GearmanSocket(server) as worker, GearmanSocket(server) as client:
        worker.send(Cmd.CAN_DO, "gm-quiet")

        def listed() -> str | None:
            workers = browser.json("GET", "/ojs/v1/workers?protocol=gearman")["workers"]
            ids = [w["worker_id"] for w in workers if "gm-quiet" in w["abilities"]]
            return ids[0] if ids else None

        worker_id = wait_until(listed, "the Gearman worker in the listing")
        page = browser.get("/ui/workers?protocol=gearman")
        assert f'data-worker="{worker_id}"' in page.text
        done = browser.post_form(
            f"/ui/workers/{quote(worker_id, safe='')}/state",
            {"csrf": page.csrf(), "state": "quiet"},
        )
        assert done.status == 303
        client.submit_bg("gm-quiet", b"x")
        assert worker.grab().type is Cmd.NO_JOB
        states = browser.json("GET", "/ojs/v1/workers?protocol=gearman")["workers"]
        assert {w["worker_id"]: w["state"] for w in states}[worker_id] == "quiet"


def test_cron_entries_are_listed_and_toggled(browser: Browser) -> None:
    """Promise: the cron page lists an entry with its next run; Disable and Enable stick."""
    entry = {"name": "nightly", "expression": "0 3 * * *", "job_template": {"type": "t"}}
    browser.json("POST", "/ojs/v1/cron", entry)
    page = browser.get("/ui/cron")
    assert "nightly" in page.text and "0 3 * * *" in page.text
    token = page.csrf()
    assert browser.post_form("/ui/cron/nightly/disable", {"csrf": token}).status == 303
    assert browser.json("GET", "/ojs/v1/cron/nightly")["cron"]["enabled"] is False
    assert browser.post_form("/ui/cron/nightly/enable", {"csrf": token}).status == 303
    assert browser.json("GET", "/ojs/v1/cron/nightly")["cron"]["enabled"] is True


def test_unknown_things_get_an_html_error_page(browser: Browser) -> None:
    """Promise: a missing job or queue, and an action on one, answer an HTML error page."""
    assert browser.get("/ui/jobs/nope").status == 404
    assert browser.get("/ui/queues/nope").status == 404
    token = browser.get("/ui/queues").csrf()
    page = browser.post_form("/ui/jobs/nope/cancel", {"csrf": token})
    assert page.status == 404 and "text/html" in page.headers["content-type"]
    assert browser.post_form("/ui/jobs/nope/frobnicate", {"csrf": token}).status == 404


def test_the_dashboard_can_be_turned_off(tmp_path: Path) -> None:
    """Promise: with --no-dashboard, / and /ui are not served; the APIs and /metrics are."""
    metrics_port = free_port()
    server = start_jobwire(
        ["--no-dashboard", "--metrics-port", str(metrics_port)], http=True, workdir=tmp_path
    )
    try:
        assert server.http_port is not None
        wait_for_port(metrics_port, server.proc)
        browser = Browser(server.http_port)
        assert browser.get("/").status == 404
        assert browser.get("/ui/queues").status == 404
        assert browser.get("/metrics").status == 200
        assert Browser(metrics_port).get("/metrics").status == 200
    finally:
        server.stop()


def test_metrics_and_the_grafana_dashboard_agree(server: ServerProcess, browser: Browser) -> None:
    """Promise: /metrics has job counters by queue and function, queue depth by priority,
    workers by protocol, wait and run histograms, the store's figures and connections by
    listener; every series the shipped Grafana dashboard queries is among them."""
    import json
    import re

    with GearmanSocket(server) as gearman:
        gearman.submit_bg("metrics-fn", b"x", priority="high")
        text = browser.get("/metrics").text
    submitted = 'function="metrics-fn",protocol="gearman",queue="metrics-fn"'
    assert f"jobwire_jobs_submitted_total{{{submitted}}} 1.0" in text
    assert 'jobwire_queue_depth{priority="high",queue="metrics-fn"} 1.0' in text
    assert 'jobwire_connections{listener="gearman"} 1.0' in text
    for name in (
        "jobwire_job_wait_seconds_bucket",
        "jobwire_job_run_seconds_count",
        "jobwire_store_commit_seconds_bucket",
        "jobwire_store_batches_total",
        "jobwire_store_fsyncs_total",
        "jobwire_store_redo_log_bytes",
        "jobwire_store_checkpoint_seconds_count",
        'jobwire_connections{listener="http"}',
    ):
        assert name in text, name
    # Families without samples yet (no error so far) are still declared by a TYPE line.
    served = set(re.findall(r"^(jobwire_\w+)", text, re.MULTILINE))
    served |= set(re.findall(r"^# TYPE (jobwire_\w+)", text, re.MULTILINE))
    grafana = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"
    exprs = [t["expr"] for p in json.loads(grafana.read_text())["panels"] for t in p["targets"]]
    wanted = {name for expr in exprs for name in re.findall(r"jobwire_\w+", expr)}
    missing = {
        name
        for name in wanted
        if name not in served and re.sub(r"_(bucket|sum|count|total)$", "", name) not in served
    }
    assert wanted and not missing, missing


def test_metrics_without_the_http_listener(tmp_path: Path) -> None:
    """Promise: `--http-port 0 --metrics-port N` serves /metrics alone, and it counts jobs."""
    metrics_port = free_port()
    server = start_jobwire(["--metrics-port", str(metrics_port)], workdir=tmp_path)
    try:
        wait_for_port(metrics_port, server.proc)
        with GearmanSocket(server) as gearman:
            gearman.submit_bg("alone", b"x")
        text = Browser(metrics_port).get("/metrics").text
        submitted = 'function="alone",protocol="gearman",queue="alone"'
        assert f"jobwire_jobs_submitted_total{{{submitted}}} 1.0" in text
        assert Browser(metrics_port).get("/").status == 404
    finally:
        server.stop()


def test_a_node_alone_shows_no_cluster_figures(browser: Browser) -> None:
    """Promise: without a cluster the pages have no node or other-nodes columns, and the
    overview shows the SQLite store."""
    overview = browser.get("/").text
    assert "<dd>sqlite (" in overview and "other nodes" not in overview
    assert "other nodes" not in browser.get("/ui/queues").text
    assert "<th>node</th>" not in browser.get("/ui/workers").text
