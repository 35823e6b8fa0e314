"""Differential test: the same raw-byte Gearman conversations against gearmand and jobwire.

Each case in ``conversations.CASES`` runs against a fresh gearmand (Debian's gearman-job-server
1.1.20) and a fresh jobwire, both started with ``--job-handle-prefix H:test``. The expected
replies were recorded from gearmand, so the gearmand runs check the recording and the jobwire runs
check that jobwire answers byte for byte the same, except for the named, deliberate differences in
``conversations.KNOWN_DIFFERENCES``, where jobwire's own expected replies are asserted instead.

Replies are read with a socket timeout: the timeout only bounds how long a missing reply is waited
for, it never decides that a case passes.
"""

from __future__ import annotations

import contextlib
import re
import socket
import struct
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.interop.conversations import (
    CASES,
    KNOWN_DIFFERENCES,
    NAMES,
    RES,
    Arg,
    Case,
    Closed,
    Line,
    Listing,
    Packet,
    Reply,
    req,
    res,
)
from tests.servers import ServerProcess, start_gearmand, start_jobwire

pytestmark = pytest.mark.interop

SERVER_ARGS = ("--job-handle-prefix", "H:test")
REPLY_TIMEOUT = 5.0  # seconds to wait for one expected reply
SETTLE_DEADLINE = 5.0
NUL = b"\0"


@pytest.fixture(params=["gearmand", "jobwire"])
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """A fresh server per case, so handles start at H:test:1 and no state leaks between cases."""
    if request.param == "gearmand":
        proc = start_gearmand(SERVER_ARGS)
        yield proc
        proc.stop()
    else:
        proc = start_jobwire(SERVER_ARGS)
        yield proc
        code = proc.stop()
        assert code == 0, f"jobwire exited with {code}:\n{proc.log()}"


# -- what came back ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GotPacket:
    magic: bytes
    code: int
    body: bytes

    def __repr__(self) -> str:
        name = NAMES.get(self.code, str(self.code))
        magic = "" if self.magic == RES else f" magic={self.magic!r}"
        fields = tuple(self.body.split(NUL))
        return f"{name}{fields!r}{magic}"


@dataclass(frozen=True)
class Nothing:
    """No (complete) reply: the connection was closed, or the timeout passed."""

    why: str
    partial: bytes = b""

    def __repr__(self) -> str:
        return f"<{self.why}; partial reply {self.partial!r}>"


CLOSED = "connection closed"
Got = GotPacket | bytes | tuple[bytes, ...] | Nothing


class Conn:
    """One client socket with a receive buffer and reads bounded by REPLY_TIMEOUT."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=REPLY_TIMEOUT)
        self.buf = bytearray()
        self.closed = False

    def send(self, data: bytes) -> None:
        # If the server hung up, the next read reports that (and what it sent before).
        with contextlib.suppress(OSError):
            self.sock.sendall(data)

    def close(self) -> None:
        self.sock.close()

    def _fill(self, deadline: float) -> str | None:
        """Receive more bytes; on failure return why (closed or timed out)."""
        if self.closed:
            return CLOSED
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return f"no reply within {REPLY_TIMEOUT}s"
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return f"no reply within {REPLY_TIMEOUT}s"
        except ConnectionResetError:
            data = b""
        if not data:
            self.closed = True
            return CLOSED
        self.buf += data
        return None

    def _take(self, n: int) -> bytes:
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def read_packet(self) -> GotPacket | bytes | Nothing:
        deadline = time.monotonic() + REPLY_TIMEOUT
        while True:
            if self.buf and self.buf[0] != 0:  # text where a packet was expected
                return self.read_line(deadline)
            if len(self.buf) >= 12:
                code, size = struct.unpack(">II", self.buf[4:12])
                if len(self.buf) >= 12 + size:
                    magic = self._take(4)
                    self._take(8)
                    return GotPacket(magic, code, self._take(size))
            if why := self._fill(deadline):
                return Nothing(why, self._take(len(self.buf)))

    def read_line(self, deadline: float | None = None) -> bytes | Nothing:
        deadline = deadline or time.monotonic() + REPLY_TIMEOUT
        while (end := self.buf.find(b"\n")) < 0:
            if why := self._fill(deadline):
                return Nothing(why, self._take(len(self.buf)))
        return self._take(end + 1)

    def read_listing(self) -> tuple[bytes, ...] | Nothing:
        """Lines up to the terminating ``.``; an ``ERR``/``OK`` line in its place is returned
        alone so that a mismatch shows at once."""
        deadline = time.monotonic() + REPLY_TIMEOUT
        lines: list[bytes] = []
        while True:
            line = self.read_line(deadline)
            if isinstance(line, Nothing):
                return Nothing(line.why, b"".join(lines) + line.partial)
            if line == b".\n":
                return tuple(lines)
            if not lines and line.endswith(b"\r\n"):
                return (line,)
            lines.append(line[:-1])

    def expect_close(self) -> bytes | Nothing:
        deadline = time.monotonic() + REPLY_TIMEOUT
        while not self.buf:
            if why := self._fill(deadline):
                return Nothing(why)
        return self._take(len(self.buf))


def read_reply(conn: Conn, expected: Reply) -> Got:
    if isinstance(expected, Packet):
        return conn.read_packet()
    if isinstance(expected, Line):
        return conn.read_line()
    if isinstance(expected, Listing):
        return conn.read_listing()
    return conn.expect_close()


def _arg_matches(expected: Arg, got: bytes) -> bool:
    if isinstance(expected, re.Pattern):
        return expected.fullmatch(got) is not None
    return expected == got


def matches(expected: Reply, got: Got) -> bool:
    if isinstance(expected, Packet):
        if (
            not isinstance(got, GotPacket)
            or got.magic != RES
            or NAMES.get(got.code) != expected.name
        ):
            return False
        if not expected.args:
            return got.body == b""
        fields = got.body.split(NUL, len(expected.args) - 1)
        return len(fields) == len(expected.args) and all(
            _arg_matches(e, g) for e, g in zip(expected.args, fields, strict=True)
        )
    if isinstance(expected, Line):
        return isinstance(got, bytes) and _arg_matches(expected.text, got)
    if isinstance(expected, Listing):
        if not isinstance(got, tuple):
            return False
        norm = expected.normalise
        return Counter(map(norm, got)) == Counter(map(norm, expected.lines))
    assert isinstance(expected, Closed)
    return isinstance(got, Nothing) and got.why == CLOSED


# -- the conversation runner ------------------------------------------------------------------


def settle(conn: Conn) -> None:
    """Wait until ``workers`` lists only ``conn``, so that the connection tests.servers opened to
    see the port listening cannot appear in a case's ``workers`` reply. Bounded; it never decides
    a pass (a server without ``workers`` is let through and fails in the cases that use it)."""
    deadline = time.monotonic() + SETTLE_DEADLINE
    while time.monotonic() < deadline:
        conn.send(b"workers\n")
        got = conn.read_listing()
        if not isinstance(got, tuple) or len(got) <= 1:
            return
        time.sleep(0.02)


def run_conversation(port: int, case: Case, overrides: dict[str, tuple[Reply, ...]]) -> None:
    conns: dict[str, Conn] = {}
    transcript: list[str] = []

    def conn_for(name: str) -> Conn:
        if name not in conns:
            conns[name] = Conn(port)
        return conns[name]

    def check(name: str, expected: Reply, got: Got) -> None:
        transcript.append(f"  {name} <- {got!r}")
        if not matches(expected, got):
            log = "\n".join(transcript)
            pytest.fail(f"{name}: expected {expected!r}\n     got {got!r}\nconversation:\n{log}")

    try:
        settle(conn_for("admin"))
        for step in case.steps:
            conn = conn_for(step.conn)
            if step.hangup:
                transcript.append(f"  {step.conn} hangs up")
                conn.close()
                conn.closed = True
                continue
            if step.send:
                transcript.append(f"  {step.conn} -> {step.send!r}")
                conn.send(step.send)
            for expected in overrides.get(step.tag, step.expect):
                check(step.conn, expected, read_reply(conn, expected))
        if case.idle_check:
            for name, conn in conns.items():
                if not conn.closed:
                    conn.send(req("ECHO_REQ", b"idle-check"))
                    check(name, res("ECHO_RES", b"idle-check"), conn.read_packet())
    finally:
        for conn in conns.values():
            conn.close()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_conversation(server: ServerProcess, case: Case) -> None:
    overrides: dict[str, tuple[Reply, ...]] = {}
    if server.name == "jobwire" and case.name in KNOWN_DIFFERENCES:
        overrides = KNOWN_DIFFERENCES[case.name].jobwire
    run_conversation(server.port, case, overrides)


def test_known_differences_name_real_steps() -> None:
    steps = {c.name: {s.tag for s in c.steps if s.tag} for c in CASES}
    assert len(steps) == len(CASES), "case names must be unique"
    for name, difference in KNOWN_DIFFERENCES.items():
        assert name in steps, f"KNOWN_DIFFERENCES names unknown case {name!r}"
        assert difference.reason
        assert set(difference.jobwire) <= steps[name], f"{name}: unknown step tag"
