"""Roles on the Gearman port: OPTION_REQ auth:TOKEN, and what each role may send."""

from __future__ import annotations

import asyncio
import socket
import struct
from pathlib import Path

import pytest

from jobwire.protocols.gearman.packets import PacketType as T
from jobwire.sdk import AsyncClient, Worker
from jobwire.sdk.errors import AuthenticationFailed, ServerUnavailable
from tests.security.conftest import TOKENS
from tests.servers import ServerProcess, start_jobwire

DEADLINE = 30.0


def packet(kind: int, *args: bytes) -> bytes:
    body = b"\0".join(args)
    return struct.pack(">4sII", b"\0REQ", kind, len(body)) + body


class Raw:
    """A plain socket speaking Gearman, reading replies whole."""

    def __init__(self, server: ServerProcess) -> None:
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=DEADLINE)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, n: int) -> bool:
        while len(self.buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                return False
            self.buffer += chunk
        return True

    def reply(self) -> tuple[int, list[bytes]]:
        assert self._fill(12), "the server closed the connection"
        _, kind, size = struct.unpack(">4sII", self.buffer[:12])
        assert self._fill(12 + size)
        body, self.buffer = self.buffer[12 : 12 + size], self.buffer[12 + size :]
        return kind, body.split(b"\0")

    def line(self) -> bytes:
        while b"\n" not in self.buffer:
            assert self._fill(len(self.buffer) + 1), "closed before a line"
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def lines_until_dot(self) -> list[bytes]:
        lines = []
        while (line := self.line()) != b".":
            lines.append(line)
        return lines

    def closed(self) -> bool:
        """True once the server closed the connection (after any replies already read)."""
        return not self._fill(len(self.buffer) + 1)

    def login(self, name: str) -> None:
        self.send(packet(T.OPTION_REQ, b"auth:" + TOKENS[name].encode()))
        assert self.reply() == (T.OPTION_RES, [b"auth"])

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(authed: ServerProcess):  # type: ignore[no-untyped-def]
    conns: list[Raw] = []

    def make() -> Raw:
        conn = Raw(authed)
        conns.append(conn)
        return conn

    yield make
    for conn in conns:
        conn.close()


def test_a_request_before_authenticating_is_refused_and_closes(raw) -> None:  # type: ignore[no-untyped-def]
    conn = raw()
    conn.send(packet(T.SUBMIT_JOB_BG, b"f", b"", b"x"))
    kind, args = conn.reply()
    assert kind == T.ERROR and args[0] == b"AUTH_REQUIRED"
    assert conn.closed()


def test_an_admin_line_before_authenticating_is_refused(raw) -> None:  # type: ignore[no-untyped-def]
    conn = raw()
    conn.send(b"status\n")
    assert conn.line().startswith(b"ERR AUTH_REQUIRED")
    assert conn.closed()


def test_a_wrong_token_is_refused_and_not_echoed(raw, authed: ServerProcess) -> None:  # type: ignore[no-untyped-def]
    conn = raw()
    conn.send(packet(T.OPTION_REQ, b"auth:not-a-token-xyz"))
    kind, args = conn.reply()
    assert kind == T.ERROR and args[0] == b"AUTH_FAILED"
    assert b"not-a-token-xyz" not in b"".join(args)
    assert conn.closed()
    assert "not-a-token-xyz" not in authed.log()


def test_client_role_submits_and_reads_but_may_not_work_or_administer(raw) -> None:  # type: ignore[no-untyped-def]
    conn = raw()
    conn.login("submitter")
    # One read with an allowed, a refused and an allowed packet: replies keep their order.
    conn.send(
        packet(T.SUBMIT_JOB_BG, b"gate-fn", b"u1", b"x")
        + packet(T.CAN_DO, b"gate-fn")
        + packet(T.ECHO_REQ, b"ping")
    )
    kind, args = conn.reply()
    assert kind == T.JOB_CREATED
    handle = args[0]
    kind, args = conn.reply()
    assert kind == T.ERROR and args[0] == b"PERMISSION_DENIED" and b"worker" in args[1]
    assert conn.reply() == (T.ECHO_RES, [b"ping"])
    conn.send(packet(T.GET_STATUS, handle))
    assert conn.reply()[0] == T.STATUS_RES
    conn.send(packet(T.GRAB_JOB))
    assert conn.reply()[1][0] == b"PERMISSION_DENIED"
    conn.send(b"status\n")
    assert any(line.startswith(b"gate-fn\t") for line in conn.lines_until_dot())
    conn.send(b"drop function gate-fn\nshutdown\n")
    assert conn.line().startswith(b"ERR PERMISSION_DENIED")
    assert conn.line().startswith(b"ERR PERMISSION_DENIED")
    conn.send(b"version\n")
    assert conn.line().startswith(b"OK")  # still served


def test_worker_role_works_but_may_not_submit(raw) -> None:  # type: ignore[no-untyped-def]
    client = raw()
    client.login("submitter")
    client.send(packet(T.SUBMIT_JOB_BG, b"wfn", b"", b"payload"))
    assert client.reply()[0] == T.JOB_CREATED
    worker = raw()
    worker.login("runner")
    worker.send(packet(T.SUBMIT_JOB_BG, b"wfn", b"", b"y"))
    assert worker.reply()[1][0] == b"PERMISSION_DENIED"
    worker.send(packet(T.CAN_DO, b"wfn") + packet(T.GRAB_JOB))
    kind, args = worker.reply()
    assert kind == T.JOB_ASSIGN and args[-1] == b"payload"
    worker.send(packet(T.WORK_COMPLETE, args[0], b"done"))
    worker.send(b"cancel job " + args[0] + b"\n")
    assert worker.line().startswith(b"ERR PERMISSION_DENIED")


def test_admin_role_may_change_state(raw) -> None:  # type: ignore[no-untyped-def]
    conn = raw()
    conn.login("operator")
    conn.send(packet(T.SUBMIT_JOB_BG, b"afn", b"", b"x") + b"drop function afn\n")
    assert conn.reply()[0] == T.JOB_CREATED
    # Jobs are queued: gearmand's answer for a function in use, not a refusal.
    assert not conn.line().startswith(b"ERR PERMISSION_DENIED")
    conn.send(packet(T.CAN_DO, b"afn") + packet(T.GRAB_JOB))
    assert conn.reply()[0] == T.JOB_ASSIGN


def test_sdk_client_and_worker_authenticate_with_their_tokens(authed: ServerProcess) -> None:
    async def main() -> None:
        worker = Worker([authed.address], token=TOKENS["runner"], heartbeat=60)

        @worker.task("sdk-auth")
        def task(job) -> bytes:  # type: ignore[no-untyped-def]
            return b"ok:" + job.payload

        running = asyncio.create_task(worker.serve())
        try:
            async with AsyncClient([authed.address], token=TOKENS["submitter"]) as client:
                result = await client.submit("sdk-auth", b"a", timeout=DEADLINE)
                assert result == b"ok:a"
            async with AsyncClient(
                [authed.address], token="wrong-token", retries=0, timeout=DEADLINE
            ) as bad:
                with pytest.raises(ServerUnavailable) as info:
                    await bad.submit("sdk-auth", b"a", timeout=DEADLINE)
                assert isinstance(info.value, AuthenticationFailed) or "refused" in str(info.value)
        finally:
            worker.stop()
            await running

    asyncio.run(main())


def test_the_idle_timeout_closes_only_connections_that_did_not_authenticate(
    auth_file: Path,
) -> None:
    """With --auth, bytes alone do not keep a connection: a half-sent packet is closed after
    the idle timeout (ERROR IDLE_TIMEOUT), an authenticated silent one is not."""
    server = start_jobwire(["--auth", str(auth_file), "--idle-timeout", "1"])
    try:
        silent = Raw(server)
        silent.login("runner")
        lurker = Raw(server)
        lurker.send(b"\0RE")  # a packet begun, never finished
        kind, args = lurker.reply()
        assert (kind, args[0]) == (T.ERROR, b"IDLE_TIMEOUT")
        assert lurker.closed()
        # Opened before the lurker and silent since: still served.
        silent.send(packet(T.ECHO_REQ, b"here"))
        assert silent.reply() == (T.ECHO_RES, [b"here"])
        silent.close()
        lurker.close()
    finally:
        assert server.stop() == 0, server.log()
