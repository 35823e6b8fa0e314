"""The connection and request bounds (server/limits.py) through real sockets against a real
jobwire process: refused connections in total and per address across the Gearman and HTTP
ports (a WebSocket counts as HTTP), the idle timeout, HTTP header and body read timeouts,
header size and count, the WebSocket message rate, and the output cap of a Gearman client
that does not read, while the other clients are served.

Every wait polls up to a generous deadline; nothing depends on how fast the server is."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import aiohttp
import pytest

from tests.interop.gearman_raw import RES, Cmd, GearmanSocket, admin, pack
from tests.rota.support import Http, spec_ref
from tests.servers import ServerProcess, start_jobwire

DEADLINE = 30.0
BIG = {"name": "big", "version": 1}


@contextmanager
def serving(*args: str) -> Iterator[ServerProcess]:
    server = start_jobwire(list(args), http=True)
    try:
        yield server
    finally:
        code = server.stop()
        assert code == 0, f"jobwire exited with {code}:\n{server.log()}"


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.settimeout(DEADLINE)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def echo(sock: socket.socket, text: bytes = b"hi") -> None:
    """An ECHO round trip on a Gearman socket: the server served this connection."""
    sock.sendall(pack(Cmd.ECHO_REQ, text))
    reply = b""
    while len(reply) < 12 + len(text):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {reply!r}")
        reply += chunk
    assert reply == pack(Cmd.ECHO_RES, text, magic=RES), reply


def served(port: int, count: int, source: str = "127.0.0.1") -> list[socket.socket]:
    """`count` Gearman connections the server serves. start_jobwire's readiness probes (and a
    test's earlier connections) count until the server has seen them close, which it does
    soon but not at once: until then, new ones are refused, so try again."""
    end = time.monotonic() + DEADLINE
    while True:
        socks = [connect(port, source) for _ in range(count)]
        try:
            for sock in socks:
                echo(sock)
            return socks
        except (AssertionError, ConnectionError):
            for sock in socks:
                sock.close()
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


def http_get(port: int, path: str = "/ojs/v1/health", source: str = "127.0.0.1") -> bytes:
    sock = connect(port, source)
    try:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        return read_all(sock)
    finally:
        sock.close()


def status_line(reply: bytes) -> bytes:
    return reply.split(b"\r\n", 1)[0]


def error_body(reply: bytes) -> dict[str, str]:
    body = json.loads(reply.split(b"\r\n\r\n", 1)[1])
    error: dict[str, str] = body["error"]
    return error


def poll(check: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + DEADLINE
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"not within {DEADLINE}s: {what}")
        time.sleep(0.05)


# -- connections --------------------------------------------------------------------------


def test_connections_per_address_are_bounded_across_gearman_and_http() -> None:
    with serving("--max-connections-per-ip", "2") as server:
        assert server.http_port is not None
        first, second = served(server.port, 2)
        # The third from 127.0.0.1, on either port, is refused with a reason, then closed.
        third = connect(server.port)
        refused = read_all(third)
        assert b"SERVER_BUSY" in refused and b"per address" in refused, refused
        reply = http_get(server.http_port)
        assert status_line(reply) == b"HTTP/1.1 503 Service Unavailable", reply
        assert error_body(reply)["code"] == "unavailable"
        assert b"Retry-After: 1" in reply
        # Another address is still served, and the first two are untouched.
        assert status_line(http_get(server.http_port, source="127.0.0.2")).endswith(b"200 OK")
        echo(first)
        # A closed connection frees its place.
        second.close()
        poll(lambda: status_line(http_get(server.http_port)).endswith(b"200 OK"), "a place")
        first.close()


def test_connections_in_total_are_bounded_and_a_websocket_counts() -> None:
    with serving("--max-connections", "2") as server:
        assert server.http_port is not None
        (gearman,) = served(server.port, 1, "127.0.0.3")

        async def websocket(session: aiohttp.ClientSession) -> aiohttp.ClientWebSocketResponse:
            url = f"http://127.0.0.1:{server.http_port}/work"
            end = time.monotonic() + DEADLINE
            while True:  # refused (503) while the readiness probes still count
                try:
                    return await session.ws_connect(url, autoclose=False)
                except aiohttp.WSServerHandshakeError as exc:
                    assert exc.status == 503, exc
                    assert time.monotonic() < end, "the WebSocket was never admitted"
                    await asyncio.sleep(0.05)

        async def scenario() -> None:
            async with aiohttp.ClientSession() as session, await websocket(session):
                # Two open: a Gearman socket and a WebSocket; the next is refused.
                loop = asyncio.get_running_loop()
                refused = await loop.run_in_executor(
                    None, read_all, connect(server.port, "127.0.0.4")
                )
                assert b"SERVER_BUSY" in refused and b"too many connections" in refused
                reply = await loop.run_in_executor(None, http_get, server.http_port)
                assert status_line(reply).endswith(b"503 Service Unavailable"), reply

        asyncio.run(scenario())
        poll(lambda: status_line(http_get(server.http_port)).endswith(b"200 OK"), "a place")
        gearman.close()


# -- idle connections ---------------------------------------------------------------------


def test_a_connection_that_sends_nothing_is_closed_after_the_idle_timeout() -> None:
    with serving("--idle-timeout", "1") as server:
        assert server.http_port is not None
        talker = connect(server.port)
        echo(talker)
        silent = connect(server.port)
        told = read_all(silent)  # returns once the server closed it
        assert b"IDLE_TIMEOUT" in told, told
        silent_http = connect(server.http_port)
        reply = read_all(silent_http)
        assert status_line(reply) == b"HTTP/1.1 408 Request Timeout", reply
        assert error_body(reply)["code"] == "request_timeout"
        # The connection that spoke stays open and served, though it was quiet as long.
        echo(talker)
        talker.close()


def test_idle_timeout_zero_keeps_silent_connections() -> None:
    with serving("--idle-timeout", "0", "--http-header-timeout", "1") as server:
        silent = connect(server.port)
        # A slow HTTP header on another connection is cut after 1 s: by then the silent
        # Gearman connection has outlived it, and it is still served.
        assert server.http_port is not None
        slow = connect(server.http_port)
        slow.sendall(b"GET /ojs/v1/health HTTP/1.1\r\n")
        assert status_line(read_all(slow)).endswith(b"408 Request Timeout")
        echo(silent)
        silent.close()


# -- HTTP requests ------------------------------------------------------------------------


def test_a_slow_header_gets_408_and_others_are_served_meanwhile() -> None:
    with serving("--http-header-timeout", "1") as server:
        port = server.http_port
        assert port is not None
        slow = connect(port)
        slow.sendall(b"GET /ojs/v1/health HTTP/1.1\r\nHost: x\r\n")  # and never the end
        assert status_line(http_get(port)).endswith(b"200 OK")
        reply = read_all(slow)
        assert status_line(reply) == b"HTTP/1.1 408 Request Timeout", reply
        assert "header" in error_body(reply)["message"]
        # A keep-alive connection that is idle between requests is not cut by it.
        kept = connect(port)
        request = b"GET /ojs/v1/health HTTP/1.1\r\nHost: x\r\n\r\n"
        kept.sendall(request)
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        # Another slow header is cut after the timeout: by then `kept` has been idle as long.
        other = connect(port)
        other.sendall(b"GET /ojs/v1/health HTTP/1.1\r\n")
        assert status_line(read_all(other)).endswith(b"408 Request Timeout")
        kept.sendall(request)  # idle longer than the header timeout: still served
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        kept.close()


def test_a_slow_body_gets_408() -> None:
    with serving("--http-body-timeout", "1") as server:
        assert server.http_port is not None
        slow = connect(server.http_port)
        slow.sendall(
            b"POST /ojs/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"type": '
        )
        reply = read_all(slow)
        assert status_line(reply) == b"HTTP/1.1 408 Request Timeout", reply
        assert error_body(reply)["code"] == "request_timeout"
        assert "body" in error_body(reply)["message"]


def test_header_size_and_count_are_bounded() -> None:
    with serving("--http-max-header-size", "1024", "--http-max-headers", "8") as server:
        port = server.http_port
        assert port is not None

        def get(headers: list[str]) -> bytes:
            sock = connect(port)
            lines = "".join(f"{h}\r\n" for h in headers)
            head = f"GET /ojs/v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{lines}\r\n"
            sock.sendall(head.encode())
            try:
                return read_all(sock)
            finally:
                sock.close()

        assert status_line(get(["X-A: " + "a" * 900])).endswith(b"200 OK")
        reply = get(["X-A: " + "a" * 2000])
        assert b" 400 " in status_line(reply), reply
        assert error_body(reply)["code"] == "invalid_request"
        assert status_line(get([f"X-{i}: {i}" for i in range(6)])).endswith(b"200 OK")
        reply = get([f"X-{i}: {i}" for i in range(20)])
        assert b" 400 " in status_line(reply), reply
        assert status_line(http_get(port)).endswith(b"200 OK")


# -- WebSocket ----------------------------------------------------------------------------


def test_a_websocket_over_its_message_rate_is_closed_with_1008() -> None:
    with serving("--ws-rate", "5") as server:

        async def scenario() -> None:
            async with aiohttp.ClientSession() as session:
                url = f"http://127.0.0.1:{server.http_port}/work"
                async with session.ws_connect(url, autoclose=False) as ws:
                    # 500 at once against 5 a second: however slowly the server handles
                    # them, it cannot have earned 500 tokens. An unknown type is answered
                    # with a non-fatal error, so each one that passes shows.
                    for seq in range(500):
                        await ws.send_str(json.dumps({"v": 1, "type": "ping", "seq": seq}))
                    errors = []
                    while True:
                        msg = await ws.receive(timeout=DEADLINE)
                        if msg.type is aiohttp.WSMsgType.TEXT:
                            errors.append(json.loads(msg.data)["code"])
                            continue
                        assert msg.type is aiohttp.WSMsgType.CLOSE, msg
                        assert msg.data == 1008, msg
                        break
                    assert errors[-1] == "rate_limited", errors
                    assert errors[:-1] == ["unknown_type"] * (len(errors) - 1), errors
                    assert len(errors) < 500, errors
                    await ws.close()

        asyncio.run(scenario())


# -- slow readers -------------------------------------------------------------------------


@pytest.mark.parametrize("cap", [1 << 20])
def test_a_gearman_client_that_does_not_read_is_closed_and_others_are_served(cap: int) -> None:
    with serving("--max-output", str(cap)) as server:
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.settimeout(DEADLINE)
        slow.connect(("127.0.0.1", server.port))
        slow.sendall(
            pack(Cmd.SET_CLIENT_ID, b"slow-reader") + pack(Cmd.SUBMIT_JOB, b"big", b"", b"x")
        )
        with GearmanSocket(server) as worker, GearmanSocket(server) as other:
            worker.send(Cmd.CAN_DO, "big")
            worker.send(Cmd.GRAB_JOB)
            handle = worker.expect(Cmd.JOB_ASSIGN).args[0]
            chunk = b"d" * (256 * 1024)
            sent = 0
            while "slow-reader" in admin(server, "workers") and sent < 64 * cap:
                worker.send(Cmd.WORK_DATA, handle, chunk)  # for the client that never reads
                sent += len(chunk)
                assert other.request(Cmd.ECHO_REQ, b"ok", reply=Cmd.ECHO_RES).args == (b"ok",)
            poll(lambda: "slow-reader" not in admin(server, "workers"), "the slow reader closed")
            assert sent < 64 * cap, "the server kept buffering for a client that does not read"
            # The worker and the other client are still served.
            worker.send(Cmd.WORK_COMPLETE, handle, b"done")
            assert other.request(Cmd.ECHO_REQ, b"still", reply=Cmd.ECHO_RES).args == (b"still",)
        slow.close()


def ws_frame(text: bytes) -> bytes:
    """A client text frame (masked with a zero key, so the payload goes as is)."""
    size = len(text)
    head = bytes([0x81, 0x80 | size]) if size < 126 else bytes([0x81, 0xFE]) + size.to_bytes(2)
    return head + b"\0\0\0\0" + text


def test_a_websocket_worker_that_does_not_read_is_closed_and_its_jobs_requeued() -> None:
    with serving("--max-output", str(1 << 20)) as server:
        port = server.http_port
        assert port is not None

        async def setup() -> list[str]:
            async with aiohttp.ClientSession() as session:
                http = Http(session, server)
                await http.register_spec(BIG)
                return [await http.push("big", ["x" * 100_000]) for _ in range(40)]

        jobs = asyncio.run(setup())
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(DEADLINE)
        sock.connect(("127.0.0.1", port))
        sock.sendall(
            b"GET /work HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1)
        assert head.startswith(b"HTTP/1.1 101"), head
        register = {"hostname": "h", "os": "Linux", "pid": 1, "specs": [spec_ref(BIG)]}
        message = {"v": 1, "type": "heartbeat", "seq": 1, "register": register, "wants": 40}
        sock.sendall(ws_frame(json.dumps(message).encode()))
        # It never reads: 4 MB of assignments cannot all be written; past 1 MiB queued the
        # server closes it and its jobs go back to the queue, for other workers.

        def states() -> list[str]:
            async def read() -> list[str]:
                async with aiohttp.ClientSession() as session:
                    http = Http(session, server)
                    return [(await http.job(job))["state"] for job in jobs]

            return asyncio.run(read())

        # Reading now, it finds its assignments, then why it was closed, and the close (1008).
        received = read_all(sock)
        sock.close()
        assert b'"type":"assignment"' in received
        assert b'"code":"slow_reader"' in received, received[-300:]
        assert received.endswith(b"\x88\x0d\x03\xf0slow_reader"), received[-200:]  # close 1008
        poll(lambda: set(states()) == {"available"}, "the slow reader's jobs requeued")
