"""Roles on the HTTP port: OJS routes, /ojs/v1/admin/*, the Rota /work WebSocket, and the
per-principal request rate."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest

from jobwire.sdk.ws_worker import RotaJob, RotaWorker
from tests.security.conftest import TOKENS
from tests.security.http_util import call
from tests.servers import ServerProcess, start_jobwire

DEADLINE = 30.0


def base(server: ServerProcess) -> str:
    return f"http://127.0.0.1:{server.http_port}"


def push(server: ServerProcess, queue: str, token: str | None) -> tuple[int, object]:
    status, _, body = call(
        base(server) + "/ojs/v1/jobs",
        "POST",
        {"type": "sec.job", "args": [1], "options": {"queue": queue}},
        token=token,
    )
    return status, body


async def completed(server: ServerProcess, job_id: str) -> dict[str, Any]:
    """The job's OJS body once it is completed (read with the client token)."""
    deadline = asyncio.get_running_loop().time() + DEADLINE
    while True:
        _, _, job = await asyncio.to_thread(
            call, base(server) + f"/ojs/v1/jobs/{job_id}", token=TOKENS["submitter"]
        )
        if job["job"]["state"] == "completed":
            return cast(dict[str, Any], job)
        assert asyncio.get_running_loop().time() < deadline, job
        await asyncio.sleep(0.05)


def test_public_routes_need_no_token(authed: ServerProcess) -> None:
    for path in ("/ojs/v1/health", "/ojs/manifest", "/health"):
        status, _, _ = call(base(authed) + path)
        assert status == 200, path


def test_no_token_is_401_with_an_ojs_error_body(authed: ServerProcess) -> None:
    status, headers, body = call(base(authed) + "/ojs/v1/queues")
    assert status == 401
    assert body["error"]["code"] == "unauthenticated"
    assert headers.get("WWW-Authenticate", "").startswith("Bearer")


def test_a_wrong_token_is_401(authed: ServerProcess) -> None:
    status, body = push(authed, "q-wrong", "no-such-token")
    assert status == 401 and body["error"]["code"] == "unauthenticated"  # type: ignore[index]
    assert "no-such-token" not in authed.log()


def test_client_role_pushes_reads_and_cancels_but_may_not_fetch_or_administer(
    authed: ServerProcess,
) -> None:
    token = TOKENS["submitter"]
    status, body = push(authed, "q-client", token)
    assert status == 201, body
    job_id = body["job"]["id"]  # type: ignore[index]
    assert call(base(authed) + f"/ojs/v1/jobs/{job_id}", token=token)[0] == 200
    status, _, body = call(
        base(authed) + "/ojs/v1/workers/fetch", "POST", {"queues": ["q-client"]}, token=token
    )
    assert status == 403 and body["error"]["code"] == "forbidden"
    assert body["error"]["details"]["required_role"] == "worker"
    for method, path in (
        ("GET", "/ojs/v1/admin/stats"),
        ("POST", "/ojs/v1/queues/q-client/pause"),
        ("GET", "/metrics"),
        ("POST", "/ojs/v1/cron"),
    ):
        status, _, body = call(base(authed) + path, method, {} if method == "POST" else None,
                               token=token)  # fmt: skip
        assert status == 403, (method, path, status, body)
    assert call(base(authed) + f"/ojs/v1/jobs/{job_id}", "DELETE", token=token)[0] == 200


def test_worker_role_fetches_and_acks_but_may_not_push(authed: ServerProcess) -> None:
    status, _ = push(authed, "q-worker", TOKENS["submitter"])
    assert status == 201
    token = TOKENS["runner"]
    assert push(authed, "q-worker", token)[0] == 403
    status, _, body = call(
        base(authed) + "/ojs/v1/workers/fetch", "POST", {"queues": ["q-worker"]}, token=token
    )
    assert status == 200, body
    job = body["job"] if "job" in body else body["jobs"][0]
    status, _, body = call(
        base(authed) + "/ojs/v1/workers/ack", "POST", {"job_id": job["id"]}, token=token
    )
    assert status == 200, body
    assert call(base(authed) + "/ojs/v1/admin/queues", token=token)[0] == 403
    # Reads outside the admin routes are any principal's.
    assert call(base(authed) + f"/ojs/v1/jobs/{job['id']}", token=token)[0] == 200


def test_admin_role_reaches_admin_routes(authed: ServerProcess) -> None:
    token = TOKENS["operator"]
    assert call(base(authed) + "/ojs/v1/admin/stats", token=token)[0] == 200
    assert call(base(authed) + "/ojs/v1/queues/q-admin/pause", "POST", {}, token=token)[0] == 200
    assert call(base(authed) + "/metrics", token=token)[0] == 200
    assert push(authed, "q-admin-push", token)[0] == 201


async def _ws_status(server: ServerProcess, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session:
        try:
            async with session.ws_connect(f"{base(server)}/work", headers=headers) as ws:
                await ws.close()
                return 101
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status


def test_work_websocket_needs_the_worker_role(authed: ServerProcess) -> None:
    assert asyncio.run(_ws_status(authed, None)) == 401
    assert asyncio.run(_ws_status(authed, "bad")) == 401
    assert asyncio.run(_ws_status(authed, TOKENS["submitter"])) == 403
    assert asyncio.run(_ws_status(authed, TOKENS["runner"])) == 101


def test_rota_worker_runs_a_job_with_its_token(authed: ServerProcess) -> None:
    worker = RotaWorker(base(authed), token=TOKENS["runner"], grace_period=5)

    spec = {"name": "sec.rota"}

    @worker.task("sec.rota", spec=spec)
    async def task(job: RotaJob) -> str:
        return f"ran {job.args[0]}"

    async def scenario() -> None:
        status, _, body = await asyncio.to_thread(
            call, base(authed) + "/rota/v1/specs", "POST", spec, token=TOKENS["submitter"]
        )
        assert status == 403, body  # registering a spec is the admin's
        status, _, body = await asyncio.to_thread(
            call, base(authed) + "/rota/v1/specs", "POST", spec, token=TOKENS["operator"]
        )
        assert status in (200, 201), body
        serving = asyncio.create_task(worker.serve())
        try:
            status, _, body = await asyncio.to_thread(
                call,
                base(authed) + "/ojs/v1/jobs",
                "POST",
                {"type": "sec.rota", "args": [7]},
                token=TOKENS["submitter"],
            )
            assert status == 201, body
            job = await completed(authed, body["job"]["id"])
            assert job["job"]["result"] == "ran 7"
        finally:
            worker.stop()
            await serving

    asyncio.run(scenario())


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[ServerProcess]:
    # 0.01 requests a second: one request, then none for 100 s, whatever the machine's speed.
    server = start_jobwire(["--rate-limit", "0.01"], http=True, workdir=tmp_path)
    yield server
    assert server.stop() == 0


def test_rate_limit_answers_429_with_retry_after(limited: ServerProcess) -> None:
    assert call(base(limited) + "/ojs/v1/queues")[0] == 200
    status, headers, body = call(base(limited) + "/ojs/v1/queues")
    assert status == 429 and body["error"]["code"] == "rate_limited"
    assert 1 <= int(headers["Retry-After"]) <= 100


def test_rate_limit_is_per_principal(auth_file: Path, tmp_path: Path) -> None:
    server = start_jobwire(
        ["--auth", str(auth_file), "--rate-limit", "0.01"], http=True, workdir=tmp_path
    )
    try:
        url = base(server) + "/ojs/v1/queues"
        assert call(url, token=TOKENS["submitter"])[0] == 200
        assert call(url, token=TOKENS["submitter"])[0] == 429
        assert call(url, token=TOKENS["operator"])[0] == 200  # another principal's own budget
    finally:
        assert server.stop() == 0


def test_ojs_worker_runs_a_job_with_its_token(authed: ServerProcess) -> None:
    from jobwire.sdk.ojs_worker import OjsJob, OjsWorker

    worker = OjsWorker(
        base(authed), queues=["q-ojs-worker"], token=TOKENS["runner"], poll_interval=0.05
    )

    @worker.task("sec.ojs")
    def task(job: OjsJob) -> str:
        return f"ojs {job.args[0]}"

    async def scenario() -> None:
        serving = asyncio.create_task(worker.serve())
        try:
            status, _, body = await asyncio.to_thread(
                call,
                base(authed) + "/ojs/v1/jobs",
                "POST",
                {"type": "sec.ojs", "args": [3], "options": {"queue": "q-ojs-worker"}},
                token=TOKENS["submitter"],
            )
            assert status == 201, body
            job = await completed(authed, body["job"]["id"])
            assert job["job"]["result"] == "ojs 3"
        finally:
            worker.stop()
            await serving

    asyncio.run(scenario())


def test_the_idle_timeout_spares_only_authenticated_http_connections(auth_file: Path) -> None:
    """With --auth, a keep-alive connection that only read a public route is closed after the
    idle timeout (408); one that authenticated stays."""
    server = start_jobwire(
        ["--auth", str(auth_file), "--idle-timeout", "1", "--http-header-timeout", "0"],
        http=True,
    )

    def get(sock: socket.socket, path: str, token: str | None = None) -> bytes:
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, "closed before a reply"
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        while len(body) < length:
            body += sock.recv(65536)
        return head.split(b"\r\n")[0]

    address = ("127.0.0.1", server.http_port)
    try:
        with (
            socket.create_connection(address, timeout=30) as member,
            socket.create_connection(address, timeout=30) as visitor,
        ):
            assert b" 200 " in get(member, "/ojs/v1/queues", TOKENS["submitter"])
            assert b" 200 " in get(visitor, "/ojs/v1/health")
            rest = b""
            while chunk := visitor.recv(65536):  # the server closes it, after a 408
                rest += chunk
            assert b" 408 " in rest
            assert b" 200 " in get(member, "/ojs/v1/queues", TOKENS["submitter"])
    finally:
        assert server.stop() == 0, server.log()
