"""Request bodies the OJS binding refuses before it creates anything: JSON nested deeper
than any reply could carry back (protocols/json_depth)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobwire.protocols.json_depth import MAX_DEPTH
from tests.ojs.dsl import Runner
from tests.servers import start_jobwire


def nested(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_bodies_nested_too_deep_are_refused_and_create_nothing(tmp_path: Path) -> None:
    server = start_jobwire((), store=f"sqlite:{tmp_path / 'jobs.db'}", workdir=tmp_path, http=True)
    http = Runner(f"http://127.0.0.1:{server.http_port}")
    try:
        too_deep = [
            # The body is one level: args one deeper than the bound allows.
            ("/ojs/v1/jobs", {"type": "t", "args": nested(MAX_DEPTH)}),
            ("/ojs/v1/jobs", {"type": "t", "args": [1], "meta": {"m": nested(200)}}),
            ("/ojs/v1/jobs/batch", {"jobs": [{"type": "t", "args": nested(300)}]}),
        ]
        for path, body in too_deep:
            response = http.request("POST", path, body)
            assert response.status == 400, response.raw
            error = response.body["error"]
            assert error["code"] == "invalid_payload"
            assert f"nested deeper than {MAX_DEPTH} levels" in error["message"]
        # At the bound: accepted, and fetched back whole.
        deepest = nested(MAX_DEPTH - 1)
        created = http.request("POST", "/ojs/v1/jobs", {"type": "t", "args": deepest})
        assert created.status == 201, created.raw
        fetched = http.request("POST", "/ojs/v1/workers/fetch", {"queues": ["default"]})
        assert [job["args"] for job in fetched.body["jobs"]] == [deepest]
        again = http.request("POST", "/ojs/v1/workers/fetch", {"queues": ["default"]})
        assert again.body["jobs"] == []
    finally:
        assert server.stop() == 0
    assert "Traceback" not in server.log()
