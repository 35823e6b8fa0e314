"""A raw Rota worker for tests: aiohttp's WebSocket client speaking JSON frames by hand.

Tests drive the real server process through it, so every frame on the wire is one the test
wrote or read. Every wait polls or reads up to DEADLINE; the deadline is only a safety net
against a hung server, never what decides a test.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Self, TypeVar

import aiohttp
import orjson

from jobwire.protocols.rota import checksum
from tests.servers import ServerProcess

DEADLINE = 30.0
T = TypeVar("T")


def spec_ref(spec: dict[str, Any]) -> dict[str, str]:
    return {"name": spec["name"], "checksum": checksum(spec)}


class Http:
    """JSON over HTTP against the server's HTTP port."""

    def __init__(self, session: aiohttp.ClientSession, server: ServerProcess) -> None:
        self.session = session
        self.base = f"http://127.0.0.1:{server.http_port}"

    async def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else orjson.dumps(body)
        headers = {"Content-Type": "application/json"}
        async with self.session.request(
            method, self.base + path, data=data, headers=headers
        ) as resp:
            raw = await resp.read()
            return resp.status, orjson.loads(raw) if raw else None

    async def get(self, path: str) -> Any:
        status, body = await self.request("GET", path)
        assert status == 200, (path, status, body)
        return body

    async def post(self, path: str, body: Any, expect: int | None = None) -> Any:
        status, reply = await self.request("POST", path, body)
        if expect is not None:
            assert status == expect, (path, status, reply)
        return reply

    async def register_spec(self, spec: dict[str, Any]) -> dict[str, Any]:
        reply = await self.post("/rota/v1/specs", spec)
        assert "spec" in reply, reply
        result: dict[str, Any] = reply["spec"]
        return result

    async def push(self, job_type: str, args: list[Any], **fields: Any) -> str:
        reply = await self.post("/ojs/v1/jobs", {"type": job_type, "args": args, **fields}, 201)
        job_id: str = reply["job"]["id"]
        return job_id

    async def job(self, job_id: str) -> dict[str, Any]:
        body = await self.get(f"/ojs/v1/jobs/{job_id}")
        job: dict[str, Any] = body["job"]
        return job

    async def wait_job(
        self, job_id: str, check: Callable[[dict[str, Any]], bool]
    ) -> dict[str, Any]:
        """Poll the OJS view of the job until `check` holds."""
        return await poll(lambda: self.job(job_id), check)


async def poll(fetch: Callable[[], Awaitable[T]], check: Callable[[T], bool]) -> T:
    end = time.monotonic() + DEADLINE
    while True:
        value = await fetch()
        if check(value):
            return value
        if time.monotonic() > end:
            raise AssertionError(f"condition not reached within {DEADLINE}s; last: {value!r}")
        await asyncio.sleep(0.02)


class RawWorker:
    """One `/work` WebSocket. `send` fills in `v` and `type`; `recv` returns decoded JSON."""

    def __init__(self, session: aiohttp.ClientSession, server: ServerProcess) -> None:
        self.session = session
        self.url = f"http://127.0.0.1:{server.http_port}/work"
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.seq = 0
        self.acks: list[int] = []  # the seq of every `ack` received (`recv`)

    async def __aenter__(self) -> Self:
        self.ws = await self.session.ws_connect(self.url, autoclose=False, max_msg_size=0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.ws is not None and not self.ws.closed:
            await self.ws.close()

    @property
    def socket(self) -> aiohttp.ClientWebSocketResponse:
        assert self.ws is not None
        return self.ws

    async def send_raw(self, data: str | bytes) -> None:
        if isinstance(data, bytes):
            await self.socket.send_bytes(data)
        else:
            await self.socket.send_str(data)

    async def send(self, type: str = "heartbeat", **fields: Any) -> int:
        self.seq += 1
        message = {"v": 1, "type": type, "seq": self.seq, **fields}
        await self.socket.send_str(orjson.dumps(message).decode())
        return self.seq

    async def recv(self) -> dict[str, Any]:
        """The next message other than an `ack`: acks (results made durable) go out when
        their commit is done, between the other messages; they are kept in `acks`."""
        while True:
            msg = await self.socket.receive(timeout=DEADLINE)
            if msg.type is not aiohttp.WSMsgType.TEXT:
                raise AssertionError(f"expected a text frame, got {msg.type!r} {msg.data!r}")
            body: dict[str, Any] = orjson.loads(msg.data)
            if body.get("type") != "ack":
                return body
            self.acks.append(body["seq"])

    async def expect(self, kind: str) -> dict[str, Any]:
        body = await self.recv()
        assert body["type"] == kind, body
        return body

    async def register(
        self,
        specs: list[dict[str, Any]],
        *,
        wants: int = 0,
        queues: list[str] | None = None,
        hostname: str = "test-host",
    ) -> dict[str, Any]:
        """Send the first heartbeat; return the welcome."""
        register: dict[str, Any] = {
            "hostname": hostname,
            "os": "Linux",
            "pid": 1234,
            "specs": [spec_ref(spec) for spec in specs],
        }
        if queues is not None:
            register["queues"] = queues
        await self.send(register=register, wants=wants)
        return await self.expect("welcome")

    async def assignment(self) -> dict[str, Any]:
        return await self.expect("assignment")

    async def heartbeat(self, **fields: Any) -> int:
        return await self.send(**fields)

    async def closed(self) -> tuple[int | None, list[dict[str, Any]]]:
        """Read until the server closes; return the close code and the messages before it."""
        before = []
        while True:
            msg = await self.socket.receive(timeout=DEADLINE)
            if msg.type is aiohttp.WSMsgType.TEXT:
                before.append(orjson.loads(msg.data))
                continue
            if msg.type is aiohttp.WSMsgType.CLOSE:
                code = msg.data
                await self.socket.close()
                return code, before
            return self.socket.close_code, before

    async def round_trip(self) -> list[dict[str, Any]]:
        """Wait until the server has handled every frame sent so far.

        Rota has no echo, but the server handles a connection's frames in order and answers
        an unknown message type with an error carrying its `seq`: once that error arrives,
        everything sent before it has taken effect. Returns the messages received meanwhile."""
        seq = await self.send(type="ping")
        seen = []
        while True:
            body = await self.recv()
            if body.get("type") == "error" and body.get("seq") == seq:
                assert body["code"] == "unknown_type", body
                return seen
            seen.append(body)


@dataclass
class Rota:
    """What a scenario gets: the server, an HTTP helper and raw `/work` workers."""

    server: ServerProcess
    session: aiohttp.ClientSession
    http: Http

    def worker(self) -> RawWorker:
        return RawWorker(self.session, self.server)


def run(server: ServerProcess, scenario: Callable[[Rota], Awaitable[T]]) -> T:
    async def main() -> T:
        async with aiohttp.ClientSession() as session:
            return await scenario(Rota(server, session, Http(session, server)))

    return asyncio.run(main())
