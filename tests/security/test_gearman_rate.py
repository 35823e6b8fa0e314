"""--rate-limit on the Gearman port: submissions per principal (per peer address without
--auth) over the budget are answered ERROR RATE_LIMITED; the HTTP port counts against the
same budget. 0.01 a second: one request, then none for 100 s, whatever the machine's speed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwire.protocols.gearman.packets import PacketType as T
from tests.security.conftest import TOKENS
from tests.security.http_util import call
from tests.security.test_gearman_auth import Raw, packet
from tests.servers import ServerProcess, start_jobwire


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[ServerProcess]:
    server = start_jobwire(["--rate-limit", "0.01"], http=True, workdir=tmp_path)
    yield server
    assert server.stop() == 0, server.log()


def submit_bg(conn: Raw, unique: bytes) -> tuple[int, list[bytes]]:
    conn.send(packet(T.SUBMIT_JOB_BG, b"rated", unique, b"data"))
    return conn.reply()


def test_a_submission_over_the_rate_is_answered_rate_limited(limited: ServerProcess) -> None:
    conn = Raw(limited)
    try:
        kind, _ = submit_bg(conn, b"u1")
        assert kind == T.JOB_CREATED
        kind, args = submit_bg(conn, b"u2")
        assert kind == T.ERROR and args[0] == b"RATE_LIMITED", args
        # The other submit path (options: an epoch) is limited the same way.
        conn.send(packet(T.SUBMIT_JOB_EPOCH, b"rated", b"u3", b"4000000000", b"data"))
        kind, args = conn.reply()
        assert kind == T.ERROR and args[0] == b"RATE_LIMITED", args
        # Not a submission: still served, and the connection stays open.
        conn.send(packet(T.ECHO_REQ, b"still here"))
        assert conn.reply() == (T.ECHO_RES, [b"still here"])
        conn.send(b"status\n")
        rows = {line.split(b"\t")[0]: line for line in conn.lines_until_dot()}
        assert rows[b"rated"].split(b"\t")[1] == b"1"  # only the first was queued
    finally:
        conn.close()
    # One budget per peer address for both ports: HTTP is refused now too.
    assert call(f"http://127.0.0.1:{limited.http_port}/ojs/v1/queues")[0] == 429


def test_the_gearman_rate_is_per_principal(auth_file: Path, tmp_path: Path) -> None:
    server = start_jobwire(
        ["--auth", str(auth_file), "--rate-limit", "0.01"], http=True, workdir=tmp_path
    )
    try:
        submitter = Raw(server)
        submitter.login("submitter")
        assert submit_bg(submitter, b"s1")[0] == T.JOB_CREATED
        kind, args = submit_bg(submitter, b"s2")
        assert kind == T.ERROR and args[0] == b"RATE_LIMITED", args
        # Another principal from the same address has its own budget.
        operator = Raw(server)
        operator.login("operator")
        assert submit_bg(operator, b"o1")[0] == T.JOB_CREATED
        # The submitter's HTTP requests count against the budget its Gearman submit used.
        url = f"http://127.0.0.1:{server.http_port}/ojs/v1/queues"
        assert call(url, token=TOKENS["submitter"])[0] == 429
        submitter.close()
        operator.close()
    finally:
        assert server.stop() == 0, server.log()


def test_without_rate_limit_submissions_are_not_limited(authed: ServerProcess) -> None:
    conn = Raw(authed)
    try:
        conn.login("submitter")
        for number in range(50):
            assert submit_bg(conn, b"free%d" % number)[0] == T.JOB_CREATED
    finally:
        conn.close()
