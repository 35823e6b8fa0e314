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


def test_plain_pushes_are_refused_and_shown_as_any_other(tmp_path: Path) -> None:
    """The usual body (no options) is decoded and checked a shorter way; bad ones are refused
    with the same words as by the full way, and good ones are shown the same."""
    server = start_jobwire((), store="memory", workdir=tmp_path, http=True)
    http = Runner(f"http://127.0.0.1:{server.http_port}")
    try:
        lone = "\ud800"  # a lone surrogate: JSON text can carry it, UTF-8 cannot
        refused = [
            ({"type": "t", "args": [lone]}, "invalid_payload", "malformed JSON: "),
            ({"type": "t", "args": [1], "meta": {"m": lone}}, "invalid_payload", "malformed"),
            ({"type": "t", "args": [1], "tags": [lone]}, "invalid_payload", "malformed JSON: "),
            ({"type": "T", "args": [1]}, "invalid_request", "Expected `str` matching regex"),
            # Python's `$` matches before a final newline; the patterns do not let it through.
            ({"type": "t\n", "args": [1]}, "invalid_request", "Expected `str` matching regex"),
            ({"type": "t", "args": 1}, "invalid_request", "Expected `array`, got `int`"),
            ({"type": "t", "args": [2**64]}, "invalid_request", "integers must lie in"),
        ]
        for body, code, words in refused:
            for extra in ({}, {"options": {}}):  # the short way, then the full way
                response = http.request("POST", "/ojs/v1/jobs", body | extra)
                assert response.status == 400, response.raw
                error = response.body["error"]
                assert error["code"] == code, error
                assert error["message"].startswith(words), error
        queue = http.request(
            "POST", "/ojs/v1/jobs", {"type": "t", "args": [], "options": {"queue": "q\n"}}
        )
        assert queue.status == 400 and queue.body["error"]["code"] == "invalid_request", queue.raw
        listed = http.request("POST", "/ojs/v1/workers/fetch", {"queues": ["default", "q"]})
        assert listed.body["jobs"] == []
        # Beside them, plain and full bodies alike are accepted and shown the same way.
        plain = {"type": "t", "args": [1, "a", {"b": None}], "meta": {"k": 1}, "tags": ["x"]}
        full = {**plain, "options": {"queue": "default"}, "x-extra": 2}
        shown = []
        for body in (plain, full):
            response = http.request("POST", "/ojs/v1/jobs", body)
            assert response.status == 201, response.raw
            job = response.body["job"]
            shown.append({k: v for k, v in job.items() if k not in ("id", "x-extra")})
            assert response.headers["location"] == f"/ojs/v1/jobs/{job['id']}"
        assert shown[0] == {k: v for k, v in shown[1].items() if "_at" not in k} | {
            k: v for k, v in shown[0].items() if "_at" in k
        }
    finally:
        assert server.stop() == 0
    assert "Traceback" not in server.log()
