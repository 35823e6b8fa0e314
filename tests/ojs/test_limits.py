"""Out-of-range numbers, durations and times in OJS requests (issue 33, "Accepted, then
poisoned"): each is answered 400 (422 inside a retry policy, as the conformance suite wants)
with the field named, nothing is stored, and every endpoint still answers afterwards; on
both stores. A value at the documented limit is accepted and reads back everywhere."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobwire.protocols.ojs import limits
from tests.ojs.dsl import Response, Runner
from tests.servers import ServerProcess, start_jobwire


@pytest.fixture(scope="module", params=["memory", "sqlite"])
def http(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Runner]:
    workdir: Path = tmp_path_factory.mktemp("limits")
    store = "memory" if request.param == "memory" else f"sqlite:{workdir / 'jobs.db'}"
    server: ServerProcess = start_jobwire(
        ["--allow-reset"], http=True, store=store, workdir=workdir
    )
    runner = Runner(f"http://127.0.0.1:{server.http_port}")
    yield runner
    code = server.stop()
    assert code == 0, server.log()
    assert "Traceback" not in server.log(), server.log()


def push(http: Runner, **options: Any) -> Response:
    return http.request("POST", "/ojs/v1/jobs", {"type": "t", "args": [1], "options": options})


def assert_refused(response: Response, field: str, status: int = 400) -> None:
    assert response.status == status, response.raw
    error = response.body["error"]
    assert error["code"] == "invalid_request", error
    assert error["details"]["field"] == field, error
    assert field in error["message"], error


def assert_nothing_stored(http: Runner) -> None:
    stats = http.request("GET", "/ojs/v1/queues/default/stats")
    assert stats.status == 200, stats.raw
    counts = {k: v for k, v in stats.body["queue"].items() if isinstance(v, int)}
    assert not any(counts.values()), counts
    crons = http.request("GET", "/ojs/v1/cron")
    assert crons.status == 200, crons.raw
    assert crons.body["crons"] == []
    fetched = http.request("POST", "/ojs/v1/workers/fetch", {"queues": ["default"], "count": 10})
    assert fetched.status == 200, fetched.raw
    assert fetched.body["jobs"] == []


BIG = 10**29
JOB_CASES = [
    ({"timeout_ms": BIG}, "$.options.timeout_ms"),
    ({"timeout_ms": -1}, "$.options.timeout_ms"),
    ({"timeout_ms": 1e308}, "$.options.timeout_ms"),
    ({"visibility_timeout_ms": BIG}, "$.options.visibility_timeout_ms"),
    ({"delay_until": "+PT999999999999999S"}, "$.options.delay_until"),
    ({"scheduled_at": "+PT999999999999S"}, "$.options.scheduled_at"),
    ({"scheduled_at": "10000-01-01T00:00:00Z"}, "$.options.scheduled_at"),
    ({"expires_at": "+P99999999999D"}, "$.options.expires_at"),
    ({"expires_at": "1969-12-31T23:59:59Z"}, "$.options.expires_at"),
    ({"priority": BIG}, "$.options.priority"),
    ({"unique": {"period": "PT99999999999999H"}}, "$.options.unique.period"),
    ({"rate_limit": {"max_per_second": BIG}}, "$.options.rate_limit.max_per_second"),
]
RETRY_CASES = [
    ({"max_attempts": 2**70}, "$.options.retry.max_attempts"),
    ({"initial_interval": "PT99999999999999S"}, "$.options.retry.initial_interval"),
    ({"max_interval_ms": BIG}, "$.options.retry.max_interval_ms"),
    ({"backoff_coefficient": 1e308}, "$.options.retry.backoff_coefficient"),
]


@pytest.mark.parametrize(("options", "field"), JOB_CASES, ids=[f for _, f in JOB_CASES])
def test_out_of_range_options_are_refused_and_store_nothing(
    http: Runner, options: dict[str, Any], field: str
) -> None:
    http.reset()
    assert_refused(push(http, **options), field)
    assert_nothing_stored(http)


@pytest.mark.parametrize(("retry", "field"), RETRY_CASES, ids=[f for _, f in RETRY_CASES])
def test_out_of_range_retry_policies_are_refused(
    http: Runner, retry: dict[str, Any], field: str
) -> None:
    http.reset()
    assert_refused(push(http, retry=retry), field, status=422)
    assert_nothing_stored(http)


def test_the_batch_names_the_job_and_field(http: Runner) -> None:
    http.reset()
    jobs = [{"type": "t", "args": []}, {"type": "t", "args": [], "options": {"timeout_ms": BIG}}]
    response = http.request("POST", "/ojs/v1/jobs/batch", {"jobs": jobs})
    assert_refused(response, "$.jobs[1].options.timeout_ms")
    assert_nothing_stored(http)


CRON_CASES = [
    ("@every 999999999999h", "$.expression"),
    ("0 0 31 2 *", "$.expression"),
    ("0 0 30 2 *", "$.expression"),
    ("@every 0s", "$.expression"),
]


@pytest.mark.parametrize(("expression", "field"), CRON_CASES, ids=[e for e, _ in CRON_CASES])
def test_cron_expressions_out_of_range_or_never_firing_are_refused(
    http: Runner, expression: str, field: str
) -> None:
    http.reset()
    body = {"name": "c", "expression": expression, "job_template": {"type": "t", "args": []}}
    assert_refused(http.request("POST", "/ojs/v1/cron", body), field)
    assert_nothing_stored(http)


def test_a_cron_template_out_of_range_is_refused(http: Runner) -> None:
    http.reset()
    template = {"type": "t", "args": [], "options": {"timeout_ms": BIG}}
    body = {"name": "c", "expression": "@daily", "job_template": template}
    assert_refused(http.request("POST", "/ojs/v1/cron", body), "$.job_template.options.timeout_ms")
    assert_nothing_stored(http)


def test_a_workflow_step_out_of_range_is_refused(http: Runner) -> None:
    http.reset()
    steps = [{"type": "t", "args": []}, {"type": "t", "args": [], "options": {"priority": BIG}}]
    response = http.request("POST", "/ojs/v1/workflows", {"type": "chain", "steps": steps})
    assert_refused(response, "$.steps[1].options.priority")
    assert_nothing_stored(http)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"type": "t", "args": [2**64]}, "$.args[0]"),
        ({"type": "t", "args": [{"n": -(2**63) - 1}]}, "$.args[0].n"),
        ({"type": "t", "args": [], "meta": {"big": 10**40}}, "$.meta.big"),
    ],
)
def test_integers_outside_64_bits_are_refused_never_floats(
    http: Runner, body: dict[str, Any], field: str
) -> None:
    http.reset()
    assert_refused(http.request("POST", "/ojs/v1/jobs", body), field)
    assert_nothing_stored(http)


def test_integers_at_the_64_bit_edges_round_trip_exactly(http: Runner) -> None:
    http.reset()
    args = [2**64 - 1, -(2**63), 2**63, 12345678901234567890]
    created = http.request("POST", "/ojs/v1/jobs", {"type": "t", "args": args})
    assert created.status == 201, created.raw
    job_id = created.body["job"]["id"]
    assert http.request("GET", f"/ojs/v1/jobs/{job_id}").body["job"]["args"] == args
    fetched = http.request("POST", "/ojs/v1/workers/fetch", {"queues": ["default"]})
    assert fetched.body["jobs"][0]["args"] == args
    result = {"n": 2**64}
    acked = http.request("POST", "/ojs/v1/workers/ack", {"job_id": job_id, "result": result})
    assert_refused(acked, "$.result.n")
    acked = http.request("POST", "/ojs/v1/workers/ack", {"job_id": job_id, "result": args})
    assert acked.status == 200, acked.raw
    assert http.request("GET", f"/ojs/v1/jobs/{job_id}").body["job"]["result"] == args


def test_values_at_the_limits_are_accepted_and_read_back(http: Runner) -> None:
    http.reset()
    options = {
        "timeout_ms": limits.MAX_DURATION_MS,
        "visibility_timeout_ms": limits.MAX_DURATION_MS,
        "scheduled_at": "9999-12-31T23:59:59Z",
        "expires_at": "9999-12-31T23:59:59.999Z",
        "priority": limits.PRIORITY_MAX,
        "retry": {
            "max_attempts": limits.MAX_ATTEMPTS,
            "initial_interval_ms": limits.MAX_DURATION_MS,
            "max_interval": "PT876000H",
            "backoff_coefficient": limits.MAX_BACKOFF_COEFFICIENT,
            "backoff_strategy": "polynomial",
        },
        "unique": {"period": "P36500D"},
    }
    created = push(http, **options)
    assert created.status == 201, created.raw
    job_id = created.body["job"]["id"]
    got = http.request("GET", f"/ojs/v1/jobs/{job_id}")
    assert got.status == 200, got.raw
    assert got.body["job"]["scheduled_at"] == "9999-12-31T23:59:59.000Z"
    assert got.body["job"]["timeout_ms"] == limits.MAX_DURATION_MS
    stats = http.request("GET", "/ojs/v1/queues/default/stats")
    assert stats.status == 200 and stats.body["queue"]["scheduled"] == 1, stats.raw
    cron = {
        "name": "far",
        "expression": f"@every {limits.MAX_DURATION_S // 3600}h",
        "job_template": {"type": "t", "args": []},
    }
    registered = http.request("POST", "/ojs/v1/cron", cron)
    assert registered.status == 201, registered.raw
    listed = http.request("GET", "/ojs/v1/cron")
    assert listed.status == 200 and listed.body["count"] == 1, listed.raw


def test_a_retry_policy_at_its_limits_fails_a_job_without_overflow(http: Runner) -> None:
    """The backoff of a huge coefficient and attempt count is capped, not an OverflowError."""
    http.reset()
    retry = {
        "max_attempts": limits.MAX_ATTEMPTS,
        "backoff_coefficient": limits.MAX_BACKOFF_COEFFICIENT,
        "backoff_strategy": "exponential",
        "initial_interval_ms": limits.MAX_DURATION_MS,
        "max_interval_ms": limits.MAX_DURATION_MS,
    }
    for strategy in ("exponential", "polynomial", "linear"):
        retry["backoff_strategy"] = strategy
        created = push(http, retry=retry)
        assert created.status == 201, created.raw
        job_id = created.body["job"]["id"]
        fetched = http.request("POST", "/ojs/v1/workers/fetch", {"queues": ["default"]})
        assert fetched.body["jobs"][0]["id"] == job_id
        error = {"code": "boom", "message": "boom"}
        failed = http.request("POST", "/ojs/v1/workers/nack", {"job_id": job_id, "error": error})
        assert failed.status == 200, failed.raw
        assert failed.body["state"] == "retryable"
        again = http.request("GET", f"/ojs/v1/jobs/{job_id}")
        assert again.status == 200, again.raw
