"""`--event-log-size`: how many job events the server keeps for GET /ojs/v1/events and the
dashboard. 0 keeps none, while the counters and histograms of /metrics go on counting."""

from __future__ import annotations

import re

from tests.server.dashboard_support import Browser
from tests.servers import start_jobwire


def series(metrics: str, name: str, queue: str) -> float:
    """The value of `name` for `queue` (0 if no such series)."""
    for labels, value in re.findall(rf"^{name}\{{([^}}]*)\}} (\S+)$", metrics, re.M):
        if f'queue="{queue}"' in labels:
            return float(value)
    return 0.0


def unlabelled(metrics: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", metrics, re.M)
    assert found, f"{name} is not served"
    return float(found.group(1))


def test_no_event_log_keeps_no_events_and_still_counts() -> None:
    server = start_jobwire(["--event-log-size", "0"], http=True)
    try:
        assert server.http_port is not None
        browser = Browser(server.http_port)
        body = {"type": "t", "args": [1], "options": {"queue": "counted"}}
        job = browser.json("POST", "/ojs/v1/jobs", body)["job"]
        fetched = browser.json("POST", "/ojs/v1/workers/fetch", {"queues": ["counted"]})["jobs"]
        assert [j["id"] for j in fetched] == [job["id"]]
        acked = browser.json("POST", "/ojs/v1/workers/ack", {"job_id": job["id"]})
        assert acked["state"] == "completed"

        metrics = browser.get("/metrics").text
        assert series(metrics, "jobwire_jobs_submitted_total", "counted") == 1.0
        assert series(metrics, "jobwire_jobs_completed_total", "counted") == 1.0
        assert unlabelled(metrics, "jobwire_job_wait_seconds_count") == 1.0
        assert unlabelled(metrics, "jobwire_job_run_seconds_count") == 1.0
        assert browser.json("GET", "/ojs/v1/events")["events"] == []
    finally:
        server.stop()


def test_the_event_log_keeps_the_newest_events_it_is_sized_for() -> None:
    server = start_jobwire(["--event-log-size", "2"], http=True)
    try:
        assert server.http_port is not None
        browser = Browser(server.http_port)
        ids = [
            browser.json("POST", "/ojs/v1/jobs", {"type": "t", "args": [n]})["job"]["id"]
            for n in range(3)
        ]
        events = browser.json("GET", "/ojs/v1/events")["events"]
        assert [(e["type"], e["subject"]) for e in events] == [
            ("job.enqueued", ids[1]),
            ("job.enqueued", ids[2]),
        ]
    finally:
        server.stop()
