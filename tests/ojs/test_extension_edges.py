"""The extensions' refusals and figures through the wire: bad input is an OJS error body and
stores nothing; /metrics counts what happened."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.ojs.dsl import Runner
from tests.servers import ServerProcess, start_jobwire


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runner]:
    workdir = tmp_path_factory.mktemp("ojs-ext-edges")
    server: ServerProcess = start_jobwire(
        ["--allow-reset"], http=True, store="memory", workdir=workdir
    )
    yield Runner(f"http://127.0.0.1:{server.http_port}")
    assert server.stop() == 0


def _push(runner: Runner, queue: str, **options: object) -> object:
    return runner.request(
        "POST", "/ojs/v1/jobs", {"type": "t.x", "args": [], "options": {"queue": queue, **options}}
    )


@pytest.mark.parametrize(
    "limit",
    [
        {"key": "k"},
        {"concurrency": 1},
        {"key": "k", "concurrency": 0},
        {"key": "k", "rate": 1, "period": "fortnight"},
        {"key": "k", "concurrency": 1, "on_limit": "discard"},
        {"max_per_second": 1, "period": "second"},
    ],
)
def test_bad_rate_limits_are_refused_and_not_stored(runner: Runner, limit: dict) -> None:
    runner.reset()
    response = _push(runner, "rl-bad", rate_limit=limit)
    assert response.status == 400, response.raw
    assert response.body["error"]["code"] == "invalid_request"
    listed = runner.request("GET", "/ojs/v1/admin/queues").body
    assert all(q["counts"]["available"] == 0 for q in listed["items"])


def test_keyed_concurrency_holds_back_the_second_job(runner: Runner) -> None:
    runner.reset()
    for _ in range(2):
        assert _push(runner, "rl-c", rate_limit={"key": "k1", "concurrency": 1}).status == 201
    fetched = runner.request("POST", "/ojs/v1/workers/fetch", {"queues": ["rl-c"], "count": 2})
    assert len(fetched.body["jobs"]) == 1
    held = runner.request("GET", "/ojs/v1/admin/queues").body["items"]
    counts = next(q["counts"] for q in held if q["name"] == "rl-c")
    assert counts == {**counts, "available": 1, "active": 1}
    again = runner.request("POST", "/ojs/v1/workers/fetch", {"queues": ["rl-c"], "count": 2})
    assert again.body["jobs"] == []
    job_id = fetched.body["jobs"][0]["id"]
    assert runner.request("POST", "/ojs/v1/workers/ack", {"job_id": job_id}).status == 200
    last = runner.request("POST", "/ojs/v1/workers/fetch", {"queues": ["rl-c"], "count": 2})
    assert len(last.body["jobs"]) == 1 and last.body["jobs"][0]["attempt"] == 1
    inspect = runner.request("GET", "/ojs/v1/rate-limits/k1").body
    assert inspect["active"] == 1 and inspect["concurrency"] == 1


@pytest.mark.parametrize(
    "body",
    [{"progress": "half"}, {"progress": 1e300}, {}, {"progress": 0.5, "message": 3}],
)
def test_bad_progress_is_refused(runner: Runner, body: dict) -> None:
    runner.reset()
    job = _push(runner, "prg").body["job"]
    runner.request("POST", "/ojs/v1/workers/fetch", {"queues": ["prg"]})
    response = runner.request("PUT", f"/ojs/v1/jobs/{job['id']}/progress", body)
    assert response.status == 400 and "error" in response.body


def test_progress_of_a_job_not_running_is_a_conflict(runner: Runner) -> None:
    runner.reset()
    job = _push(runner, "prg").body["job"]
    response = runner.request("PUT", f"/ojs/v1/jobs/{job['id']}/progress", {"progress": 0.1})
    assert response.status == 409 and response.body["error"]["code"] == "conflict"


@pytest.mark.parametrize(
    "body",
    [
        {"backpressure": {"max_depth": 0}},
        {"backpressure": {"max_depth": 5, "strategy": "drop_oldest"}},
        {"backpressure": {"max_depth": 5, "warning_threshold": 2}},
        {"backpressure": {"max_depth": 10**12}},
    ],
)
def test_bad_queue_config_is_refused(runner: Runner, body: dict) -> None:
    runner.reset()
    response = runner.request("PUT", "/ojs/v1/admin/queues/bp/config", body)
    assert response.status == 400 and "error" in response.body
    config = runner.request("GET", "/ojs/v1/admin/queues/bp/config").body
    assert config["backpressure"] is None


def test_metrics_count_jobs_by_queue(runner: Runner) -> None:
    runner.reset()
    job = _push(runner, "m-q").body["job"]
    runner.request("POST", "/ojs/v1/workers/fetch", {"queues": ["m-q"], "worker_id": "w"})
    runner.request("POST", "/ojs/v1/workers/ack", {"job_id": job["id"]})
    text = runner.request("GET", "/metrics", headers={"Accept": "text/plain"}).raw.decode()
    assert 'jobwire_jobs_submitted_total{function="t.x",protocol="ojs",queue="m-q"} 1.0' in text
    assert 'jobwire_jobs_completed_total{function="t.x",protocol="ojs",queue="m-q"} 1.0' in text
    assert 'jobwire_workers{protocol="ojs",state="running"} 1.0' in text
    assert 'jobwire_queue_depth{priority="normal",queue="m-q"} 0.0' in text
    # One wait (push to fetch) and one run (fetch to ack) more than before the reset at most.
    assert "jobwire_job_wait_seconds_count" in text
    assert 'jobwire_job_run_seconds_bucket{le="+Inf"}' in text
