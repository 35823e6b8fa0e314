"""HTTP edges of the OJS binding (issue 33): non-JSON bodies are 415, CORS is off unless
`--cors-origin` names origins, and malformed HTTP that aiohttp's parser refuses still gets
an OJS error body (raw sockets)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ojs.dsl import Runner
from tests.servers import ServerProcess, start_jobwire

ORIGIN = "https://app.example"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir: Path = tmp_path_factory.mktemp("edges")
    proc = start_jobwire(["--allow-reset"], http=True, workdir=workdir)
    yield proc
    assert proc.stop() == 0, proc.log()
    assert "Traceback" not in proc.log(), proc.log()


@pytest.fixture(scope="module")
def cors_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir: Path = tmp_path_factory.mktemp("cors")
    args = ["--cors-origin", ORIGIN, "--cors-origin", "http://localhost:3000"]
    proc = start_jobwire(args, http=True, workdir=workdir)
    yield proc
    assert proc.stop() == 0, proc.log()


def runner(server: ServerProcess) -> Runner:
    return Runner(f"http://127.0.0.1:{server.http_port}")


def job_count(http: Runner) -> int:
    stats = http.request("GET", "/ojs/v1/queues/default/stats").body["queue"]
    return sum(v for v in stats.values() if isinstance(v, int))


def total_jobs(http: Runner) -> int:
    total: int = http.request("GET", "/ojs/v1/queues/default/stats").body["queue"]["total"]
    return total


# ---------------------------------------------------------------------- 415


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=xyz",
        "application/xml",
    ],
)
def test_a_non_json_content_type_is_415_and_creates_nothing(
    server: ServerProcess, content_type: str
) -> None:
    http = runner(server)
    http.reset()
    body = {"type": "t", "args": [1]}
    for path in ("/ojs/v1/jobs", "/ojs/v1/queues/default/pause"):
        response = http.request("POST", path, body, headers={"Content-Type": content_type})
        assert response.status == 415, response.raw
        assert response.headers["content-type"].startswith("application/openjobspec+json")
        error = response.body["error"]
        assert error["code"] == "unsupported_media_type" and error["retryable"] is False
    assert job_count(http) == 0
    paused = http.request("GET", "/ojs/v1/queues/default/stats").body["queue"]
    assert paused.get("paused") in (False, None), paused


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "application/openjobspec+json", "application/json; charset=utf-8"],
)
def test_json_content_types_are_accepted(server: ServerProcess, content_type: str) -> None:
    http = runner(server)
    body = {"type": "t", "args": [1]}
    response = http.request("POST", "/ojs/v1/jobs", body, headers={"Content-Type": content_type})
    assert response.status == 201, response.raw


def test_a_request_without_content_type_is_accepted(server: ServerProcess) -> None:
    """HTTP clients that send no Content-Type (a bare http.client, scripts) keep working."""
    raw = _raw(server, _request("POST", "/ojs/v1/jobs", b'{"type":"t","args":[]}', None))
    assert raw.startswith(b"HTTP/1.1 201"), raw[:200]


# ------------------------------------------------------- repeated requests (direct.py)


def test_requests_to_a_path_get_the_same_edges_every_time(server: ServerProcess) -> None:
    """After the first request to a (method, path), later ones skip aiohttp's router
    (server/ojs/direct.py): each still gets the OJS headers, the 415 check, the error
    bodies and its own request id; other methods, other paths and `Expect` go as before."""
    http = runner(server)
    http.reset()
    for n in range(4):
        pushed = http.request("POST", "/ojs/v1/jobs", {"type": "t", "args": [n]})
        assert pushed.status == 201, pushed.raw
        assert pushed.headers["location"] == f"/ojs/v1/jobs/{pushed.body['job']['id']}"
        assert pushed.headers["ojs-version"] == "1.0"
        assert pushed.headers["x-request-id"].startswith("req_")
    mine = http.request("POST", "/ojs/v1/jobs", {"type": "t", "args": []}, {"X-Request-Id": "r-1"})
    assert (mine.status, mine.headers["x-request-id"]) == (201, "r-1"), mine.raw
    for _ in range(2):
        refused = http.request(
            "POST", "/ojs/v1/jobs", {"type": "t"}, {"Content-Type": "text/plain"}
        )
        assert refused.status == 415, refused.raw
        assert refused.body["error"]["code"] == "unsupported_media_type"
        invalid = http.request("POST", "/ojs/v1/jobs", {"args": [1]})
        assert invalid.status == 400, invalid.raw
        assert invalid.headers["ojs-version"] == "1.0" and invalid.body["error"]["code"]
        wrong_method = http.request("PUT", "/ojs/v1/jobs", {"type": "t"})
        assert wrong_method.status == 405, wrong_method.raw
        assert "POST" in wrong_method.headers["allow"]
        assert wrong_method.body["error"]["code"] == "method_not_allowed"
        slash = http.request("POST", "/ojs/v1/jobs/", {"type": "t"})
        assert slash.status in (404, 405) and slash.body["error"]["code"], slash.raw
    assert total_jobs(http) == 5
    body = b'{"type":"t","args":["expect"]}'
    head = _request("POST", "/ojs/v1/jobs", body, "application/json")
    head = head.replace(b"Connection: close", b"Expect: 100-continue\r\nConnection: close")
    reply = _raw(server, head)
    assert reply.startswith(b"HTTP/1.1 100 Continue"), reply[:200]
    assert b"HTTP/1.1 201" in reply, reply[:400]
    assert total_jobs(http) == 6


# ---------------------------------------------------------------------- CORS


def test_cors_is_off_by_default(server: ServerProcess) -> None:
    http = runner(server)
    preflight = http.request(
        "OPTIONS",
        "/ojs/v1/jobs",
        headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in preflight.headers
    assert preflight.status >= 400
    got = http.request("GET", "/ojs/v1/health", headers={"Origin": ORIGIN})
    assert got.status == 200
    assert not any(name.startswith("access-control-") for name in got.headers)


def test_cors_answers_the_configured_origins_only(cors_server: ServerProcess) -> None:
    http = runner(cors_server)
    preflight = http.request(
        "OPTIONS",
        "/ojs/v1/jobs",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
    )
    assert preflight.status == 204, preflight.raw
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert preflight.headers["access-control-allow-headers"] == "content-type"
    assert preflight.headers["vary"] == "Origin"
    pushed = http.request("POST", "/ojs/v1/jobs", {"type": "t", "args": []}, {"Origin": ORIGIN})
    assert pushed.status == 201
    assert pushed.headers["access-control-allow-origin"] == ORIGIN
    assert "X-Request-Id" in pushed.headers["access-control-expose-headers"]
    refused = http.request("GET", "/ojs/v1/jobs/nope", headers={"Origin": ORIGIN})
    assert refused.status == 404 and refused.headers["access-control-allow-origin"] == ORIGIN
    other = "https://evil.example"
    preflight = http.request(
        "OPTIONS",
        "/ojs/v1/jobs",
        headers={"Origin": other, "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in preflight.headers
    got = http.request("GET", "/ojs/v1/health", headers={"Origin": other})
    assert "access-control-allow-origin" not in got.headers


# ---------------------------------------------------------------------- malformed HTTP


def _request(method: str, path: str, body: bytes, content_type: str | None) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
    if content_type:
        head += f"Content-Type: {content_type}\r\n"
    return head.encode() + b"Connection: close\r\n\r\n" + body


def _raw(server: ServerProcess, data: bytes) -> bytes:
    """Send `data`, read until the server closes (it must: the connection is broken)."""
    with socket.create_connection(("127.0.0.1", server.http_port or 0), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def _ojs_error(raw: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    headers = head.decode("latin-1").lower()
    assert "content-type: application/openjobspec+json" in headers, raw[:300]
    assert "ojs-version: 1.0" in headers, raw[:300]
    error = json.loads(body)["error"]
    assert isinstance(error["code"], str) and isinstance(error["message"], str)
    assert isinstance(error["retryable"], bool)
    return status, error


MALFORMED = {
    "bad content-length": (
        b"POST /ojs/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}"
    ),
    "two content-lengths": (
        b"POST /ojs/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"
    ),
    "oversize url": b"GET /ojs/v1/jobs/" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "oversize header": b"GET /ojs/v1/health HTTP/1.1\r\nHost: x\r\nX-Big: "
    + b"b" * 20000
    + b"\r\n\r\n",
    "bare LF": b"GET /ojs/v1/health HTTP/1.1\nHost: x\n\n",
    "bad method": b"G(T /ojs/v1/health HTTP/1.1\r\nHost: x\r\n\r\n",
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_http_gets_an_ojs_error_body(server: ServerProcess, name: str) -> None:
    status, error = _ojs_error(_raw(server, MALFORMED[name]))
    assert 400 <= status < 500, (status, error)
    assert error["code"] == "invalid_request", error
    # The server is still fine.
    assert runner(server).request("GET", "/ojs/v1/health").status == 200
