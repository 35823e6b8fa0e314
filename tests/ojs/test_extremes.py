"""Property test: OJS requests with extreme numbers, durations and times (issue 33).

Hypothesis generates job envelopes, cron registrations and workflow bodies whose numbers,
durations and times are extreme (huge and negative integers, 1e308, far-future and
far-past timestamps, ISO-8601 durations of every size, numbers sent as strings). The
invariant: the server answers 400/422 with an OJS error body naming the field, or it
created something that every endpoint can read back (GET job, fetch, queue stats, cron list,
the workflow); on the memory store and on the SQLite store, and again after the SQLite
server restarts. One server per store serves every example; the example counts are small.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.ojs.dsl import Response, Runner
from tests.servers import ServerProcess, start_jobwire

EXAMPLES = 40
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)

# ---------------------------------------------------------------------- strategies

EDGE_INTS = [0, 1, -1, 2**31 - 1, 2**31, 2**53, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**29]
ints = st.one_of(
    st.sampled_from(EDGE_INTS + [-n for n in EDGE_INTS]),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
)
floats = st.one_of(
    st.sampled_from([1e308, -1e308, 5e-324, 0.5, 1e15, 1e16, 1e20]),
    st.floats(allow_nan=False, allow_infinity=False),
)
number_like_strings = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-0", "0x10", ""])
numbers = st.one_of(ints, floats, number_like_strings, st.booleans(), st.none())

timestamps = st.one_of(
    st.sampled_from(
        [
            "1970-01-01T00:00:00Z",
            "1969-12-31T23:59:59Z",
            "0001-01-01T00:00:00Z",
            "0001-01-01T00:00:00+14:00",
            "9999-12-31T23:59:59Z",
            "9999-12-31T23:59:59.999999Z",
            "9999-12-31T23:59:59-12:00",
            "10000-01-01T00:00:00Z",
            "2026-01-01T00:00:00",
            "2026-02-30T00:00:00Z",
            "not a time",
        ]
    ),
    st.datetimes().map(lambda d: d.isoformat() + "Z"),
)
magnitudes = st.one_of(
    st.sampled_from([0, 1, 59, 86400, 36500 * 86400, 36500 * 86400 + 1, 10**15, 10**300]),
    st.integers(min_value=0, max_value=10**20),
)
durations = st.one_of(
    magnitudes.map(lambda n: f"PT{n}S"),
    magnitudes.map(lambda n: f"P{n}D"),
    magnitudes.map(lambda n: f"PT{n}H"),
    magnitudes.map(lambda n: f"PT{n}.5M"),
    st.sampled_from(["P", "PT", "-PT5S", "PT1.S", "P1Y", "PT0S"]),
)
times = st.one_of(timestamps, durations.map(lambda d: "+" + d))


def maybe(name: str, values: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(st.just({}), values.map(lambda v: {name: v}))


def merged(*parts: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    def join(dicts: tuple[dict[str, Any], ...]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for d in dicts:
            out.update(d)
        return out

    return st.tuples(*parts).map(join)


retry = merged(
    maybe("max_attempts", numbers),
    maybe("initial_interval", durations),
    maybe("initial_interval_ms", numbers),
    maybe("max_interval", durations),
    maybe("max_interval_ms", numbers),
    maybe("backoff_coefficient", numbers),
    maybe("backoff_strategy", st.sampled_from(["exponential", "polynomial", "linear"])),
)
options = merged(
    maybe("timeout_ms", numbers),
    maybe("visibility_timeout_ms", numbers),
    maybe("priority", numbers),
    maybe("delay_until", times),
    maybe("scheduled_at", times),
    maybe("expires_at", times),
    maybe("retry", retry),
    maybe("unique", merged(maybe("period", durations))),
    maybe("rate_limit", merged(maybe("max_per_second", numbers))),
)
payload_values = st.one_of(ints, floats, st.text(max_size=5))
envelopes = st.fixed_dictionaries(
    {
        "type": st.just("x.extreme"),
        "args": st.lists(payload_values, max_size=3),
        "options": options.map(lambda o: {"queue": "extreme", **o}),
    },
    optional={"meta": st.dictionaries(st.sampled_from(["a", "b"]), payload_values, max_size=2)},
)
every = magnitudes.map(lambda n: f"@every {n}s") | magnitudes.map(lambda n: f"@every {n}h")
expressions = st.one_of(
    every,
    st.sampled_from(
        [
            "0 0 31 2 *",
            "0 0 30 2 *",
            "0 0 29 2 *",
            "0 0 31 4 *",
            "* * * * *",
            "@yearly",
            "61 * * * *",
        ]
    ),
)


# ---------------------------------------------------------------------- the invariant

NAMES = itertools.count()


def refused(response: Response) -> bool:
    """A 400/422 with an OJS error body; any other refusal or a 5xx fails the test."""
    assert response.status < 500, response.raw
    if response.status in (400, 422):
        error = response.body["error"]
        assert isinstance(error["message"], str) and isinstance(error["retryable"], bool)
        return True
    return False


class Checker:
    """Sends generated requests and reads back everything that was created."""

    def __init__(self, http: Runner) -> None:
        self.http = http
        self.jobs: list[str] = []
        self.crons: list[str] = []
        self.workflows: list[str] = []

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        response = (
            self.http.request(method, path, body)
            if body is not None
            else (self.http.request(method, path))
        )
        assert response.status == 200, f"{method} {path}: {response.raw!r}"
        return response.body

    def push(self, envelope: dict[str, Any]) -> None:
        response = self.http.request("POST", "/ojs/v1/jobs", envelope)
        if refused(response):
            return
        assert response.status in (200, 201), response.raw
        self.jobs.append(response.body["job"]["id"])
        self.read_back()

    def cron(self, expression: str, template: dict[str, Any]) -> None:
        name = f"c{next(NAMES)}"
        body = {"name": name, "expression": expression, "job_template": template}
        response = self.http.request("POST", "/ojs/v1/cron", body)
        if refused(response):
            return
        assert response.status == 201, response.raw
        self.crons.append(name)
        self.read_back()

    def workflow(self, kind: str, steps: list[dict[str, Any]]) -> None:
        response = self.http.request("POST", "/ojs/v1/workflows", {"type": kind, "steps": steps})
        if refused(response):
            return
        assert response.status == 201, response.raw
        flow = response.body["workflow"]
        self.workflows.append(flow["id"])
        self.jobs.extend(job_id for job_id in flow["job_ids"] if job_id)
        self.read_back()

    def read_back(self) -> None:
        for job_id in self.jobs[-3:]:
            self.ok("GET", f"/ojs/v1/jobs/{job_id}")
        self.ok("GET", "/ojs/v1/queues/extreme/stats")
        self.ok("GET", "/ojs/v1/queues")
        self.ok("POST", "/ojs/v1/workers/fetch", {"queues": ["extreme"], "count": 5})
        listed = self.ok("GET", "/ojs/v1/cron")
        assert {c["name"] for c in listed["crons"]} >= set(self.crons)
        for workflow_id in self.workflows[-2:]:
            self.ok("GET", f"/ojs/v1/workflows/{workflow_id}")

    def read_everything(self) -> None:
        for job_id in self.jobs:
            self.ok("GET", f"/ojs/v1/jobs/{job_id}")
        for name in self.crons:
            self.ok("GET", f"/ojs/v1/cron/{name}")
        self.read_back()


def exercise(checker: Checker) -> None:
    @given(envelope=envelopes)
    @SETTINGS
    def push(envelope: dict[str, Any]) -> None:
        checker.push(envelope)

    @given(expression=expressions, template=envelopes)
    @SETTINGS
    def cron(expression: str, template: dict[str, Any]) -> None:
        checker.cron(expression, template)

    @given(
        kind=st.sampled_from(["chain", "group"]), steps=st.lists(envelopes, min_size=1, max_size=3)
    )
    @SETTINGS
    def workflow(kind: str, steps: list[dict[str, Any]]) -> None:
        checker.workflow(kind, steps)

    push()
    cron()
    workflow()
    assert checker.jobs, "no generated job was accepted: the strategies are too extreme"
    checker.read_everything()


def start(workdir: Path, store: str) -> tuple[ServerProcess, Runner]:
    server = start_jobwire([], http=True, store=store, workdir=workdir)
    return server, Runner(f"http://127.0.0.1:{server.http_port}")


def stop(server: ServerProcess) -> None:
    code = server.stop()
    assert code == 0, server.log()
    assert "Traceback" not in server.log(), server.log()


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


@pytest.mark.timeout(600)
def test_extreme_values_on_the_memory_store(workdir: Path) -> None:
    server, http = start(workdir, "memory")
    try:
        exercise(Checker(http))
    finally:
        stop(server)


@pytest.mark.timeout(600)
def test_extreme_values_on_the_sqlite_store_and_after_a_restart(workdir: Path) -> None:
    store = f"sqlite:{workdir / 'jobs.db'}"
    server, http = start(workdir, store)
    try:
        checker = Checker(http)
        exercise(checker)
    finally:
        stop(server)
    server, http = start(workdir, store)
    try:
        checker.http = http
        checker.read_everything()
    finally:
        stop(server)
