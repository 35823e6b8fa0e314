"""The Gearman gate frames the stream itself: however reads split it, the scanner gets
exactly the allowed packets and lines, in order, and refusals come in their place."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from jobwire.protocols.gearman.packets import PacketType as T
from jobwire.server.auth import Authenticator, hash_token
from jobwire.server.gearman.gate import Gate


def packet(kind: int, *args: bytes) -> bytes:
    body = b"\0".join(args)
    return struct.pack(">4sII", b"\0REQ", kind, len(body)) + body


class FakeScanner:
    def __init__(self, log: list[Any]) -> None:
        self.log = log

    def feed(self, data: bytes) -> None:
        self.log.append(("scan", data))


class FakeConnection:
    """What the gate uses of a GearmanConnection."""

    def __init__(self) -> None:
        self.log: list[Any] = []
        self.scanner = FakeScanner(self.log)
        self.closing = False
        self.gate: Gate | None = None
        self.principal = "-"
        self.peer_ip = "test"
        self.settled = False

    def send(self, data: bytes) -> None:
        self.log.append(("send", data))

    def error(self, code: str, text: str) -> None:
        self.log.append(("error", code))

    def close_after_flush(self) -> None:
        self.closing = True

    def settle_idle(self) -> None:  # authenticated: the idle timeout stops
        self.settled = True


AUTH = Authenticator.from_mapping(
    {
        "principals": {
            "c": {"token_sha256": hash_token("tc"), "roles": ["client"]},
            "w": {"token_sha256": hash_token("tw"), "roles": ["worker"]},
            "a": {"token_sha256": hash_token("ta"), "roles": ["admin"]},
        }
    }
)


def run(stream: bytes, cuts: list[int]) -> tuple[bytes, list[Any], FakeConnection]:
    conn = FakeConnection()
    gate = Gate(conn, AUTH, None)  # type: ignore[arg-type]
    conn.gate = gate
    start = 0
    for cut in [*cuts, len(stream)]:
        if conn.gate is None:  # an admin: the connection feeds its scanner directly
            conn.scanner.feed(stream[start:cut])
        else:
            gate.feed(stream[start:cut])
        start = cut
    scanned = b"".join(data for what, data in conn.log if what == "scan")
    events = [(what, data) for what, data in conn.log if what != "scan"]
    return scanned, events, conn


SUBMIT = packet(T.SUBMIT_JOB_BG, b"f", b"u", b"x" * 40)
CAN_DO = packet(T.CAN_DO, b"f")
ECHO = packet(T.ECHO_REQ, b"hello")


@pytest.mark.parametrize("step", [1, 3, 7, 12, 13, 50])
def test_client_stream_split_anywhere(step: int) -> None:
    stream = packet(T.OPTION_REQ, b"auth:tc") + SUBMIT + CAN_DO + ECHO + b"status\nshutdown\n"
    scanned, events, conn = run(stream, list(range(step, len(stream), step)))
    assert scanned == SUBMIT + ECHO + b"status\n"
    assert events[0][0] == "send" and events[0][1].endswith(b"auth")  # OPTION_RES auth
    assert ("error", "PERMISSION_DENIED") in events
    assert events[-1][1].startswith(b"ERR PERMISSION_DENIED")
    assert conn.principal == "c" and not conn.closing


@pytest.mark.parametrize("step", [1, 5, 12, 100])
def test_worker_stream_split_anywhere(step: int) -> None:
    status = packet(T.GET_STATUS, b"H:x:1")
    stream = packet(T.OPTION_REQ, b"auth:tw") + CAN_DO + SUBMIT + packet(T.GRAB_JOB) + status
    scanned, events, _ = run(stream, list(range(step, len(stream), step)))
    assert scanned == CAN_DO + packet(T.GRAB_JOB) + status
    assert [e for e in events if e[0] == "error"] == [("error", "PERMISSION_DENIED")]


@pytest.mark.parametrize("step", [1, 4, 20])
def test_an_admin_detaches_the_gate(step: int) -> None:
    stream = packet(T.OPTION_REQ, b"auth:ta") + CAN_DO + SUBMIT + b"shutdown\n"
    scanned, _, conn = run(stream, list(range(step, len(stream), step)))
    assert scanned == CAN_DO + SUBMIT + b"shutdown\n"
    assert conn.gate is None and conn.principal == "a"


def test_nothing_passes_before_authentication() -> None:
    scanned, events, conn = run(SUBMIT + ECHO, [])
    assert scanned == b"" and events == [("error", "AUTH_REQUIRED")] and conn.closing


def test_a_wrong_token_closes() -> None:
    scanned, events, conn = run(packet(T.OPTION_REQ, b"auth:nope") + SUBMIT, [3])
    assert scanned == b"" and events == [("error", "AUTH_FAILED")] and conn.closing


def test_other_options_pass_to_the_scanner() -> None:
    stream = packet(T.OPTION_REQ, b"auth:tc") + packet(T.OPTION_REQ, b"exceptions")
    scanned, _, _ = run(stream, [])
    assert scanned == packet(T.OPTION_REQ, b"exceptions")
