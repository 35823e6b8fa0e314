"""Raw Gearman packets and admin commands shared by the interop tests.

The interop tests drive third-party clients (the `gearman`/`gearadmin` CLIs, pygearman)
against a real server. This module is the independent referee: it sets up server state and
observes it over plain sockets, so a test never has to trust one client to check another.

Every wait here polls the server up to a generous deadline. The deadline is only a safety net
against a hung server; no outcome is ever decided by how long something took.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Self, TypeVar

from tests.servers import ServerProcess

DEADLINE = 30.0
"""Seconds any single wait (socket read, poll loop, subprocess) may take before it fails."""

REQ = b"\0REQ"
RES = b"\0RES"
HEADER = struct.Struct("!4sII")

T = TypeVar("T")


class Cmd(IntEnum):
    """Binary packet types (gearmand's libgearman-1.0/protocol.h)."""

    CAN_DO = 1
    CANT_DO = 2
    RESET_ABILITIES = 3
    PRE_SLEEP = 4
    NOOP = 6
    SUBMIT_JOB = 7
    JOB_CREATED = 8
    GRAB_JOB = 9
    NO_JOB = 10
    JOB_ASSIGN = 11
    WORK_STATUS = 12
    WORK_COMPLETE = 13
    WORK_FAIL = 14
    GET_STATUS = 15
    ECHO_REQ = 16
    ECHO_RES = 17
    SUBMIT_JOB_BG = 18
    ERROR = 19
    STATUS_RES = 20
    SUBMIT_JOB_HIGH = 21
    SET_CLIENT_ID = 22
    CAN_DO_TIMEOUT = 23
    ALL_YOURS = 24
    WORK_EXCEPTION = 25
    OPTION_REQ = 26
    OPTION_RES = 27
    WORK_DATA = 28
    WORK_WARNING = 29
    GRAB_JOB_UNIQ = 30
    JOB_ASSIGN_UNIQ = 31
    SUBMIT_JOB_HIGH_BG = 32
    SUBMIT_JOB_LOW = 33
    SUBMIT_JOB_LOW_BG = 34
    SUBMIT_JOB_SCHED = 35
    SUBMIT_JOB_EPOCH = 36
    SUBMIT_REDUCE_JOB = 37
    SUBMIT_REDUCE_JOB_BACKGROUND = 38
    GRAB_JOB_ALL = 39
    JOB_ASSIGN_ALL = 40
    GET_STATUS_UNIQUE = 41
    STATUS_RES_UNIQUE = 42


# How many NUL-separated fields each server->client packet carries (the last one runs to the
# end of the body and may itself contain NULs).
RESPONSE_FIELDS: dict[Cmd, int] = {
    Cmd.NOOP: 0,
    Cmd.NO_JOB: 0,
    Cmd.JOB_CREATED: 1,
    Cmd.JOB_ASSIGN: 3,
    Cmd.JOB_ASSIGN_UNIQ: 4,
    Cmd.JOB_ASSIGN_ALL: 5,
    Cmd.WORK_STATUS: 3,
    Cmd.WORK_COMPLETE: 2,
    Cmd.WORK_FAIL: 1,
    Cmd.WORK_EXCEPTION: 2,
    Cmd.WORK_DATA: 2,
    Cmd.WORK_WARNING: 2,
    Cmd.ECHO_RES: 1,
    Cmd.ERROR: 2,
    Cmd.STATUS_RES: 5,
    Cmd.STATUS_RES_UNIQUE: 6,
    Cmd.OPTION_RES: 1,
}

SUBMIT_BG: dict[str, Cmd] = {
    "high": Cmd.SUBMIT_JOB_HIGH_BG,
    "normal": Cmd.SUBMIT_JOB_BG,
    "low": Cmd.SUBMIT_JOB_LOW_BG,
}
SUBMIT_FG: dict[str, Cmd] = {
    "high": Cmd.SUBMIT_JOB_HIGH,
    "normal": Cmd.SUBMIT_JOB,
    "low": Cmd.SUBMIT_JOB_LOW,
}

# Admin commands whose reply is a list terminated by a line holding a single ".".
LIST_COMMANDS = ("status", "prioritystatus", "workers", "show jobs", "show unique jobs")


@dataclass(frozen=True)
class Packet:
    type: Cmd
    args: tuple[bytes, ...]


def pack(cmd: Cmd, *args: bytes | str, magic: bytes = REQ) -> bytes:
    """One binary packet; str arguments are UTF-8 encoded."""
    body = b"\0".join(a.encode() if isinstance(a, str) else a for a in args)
    return HEADER.pack(magic, int(cmd), len(body)) + body


class GearmanSocket:
    """A blocking connection that speaks binary packets and admin text commands."""

    def __init__(self, server: ServerProcess, timeout: float = DEADLINE) -> None:
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
        self.buffer = b""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"server closed the connection; unread bytes: {self.buffer!r}")
        self.buffer += chunk

    def _take(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self._fill()
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def send(self, cmd: Cmd, *args: bytes | str) -> None:
        self.sock.sendall(pack(cmd, *args))

    def recv(self) -> Packet:
        magic, type_, size = HEADER.unpack(self._take(HEADER.size))
        assert magic == RES, f"bad magic {magic!r}"
        cmd = Cmd(type_)
        body = self._take(size)
        fields = RESPONSE_FIELDS[cmd]
        args = tuple(body.split(b"\0", fields - 1)) if fields else ()
        assert len(args) == fields, f"{cmd.name}: expected {fields} fields in {body!r}"
        return Packet(cmd, args)

    def expect(self, cmd: Cmd) -> Packet:
        packet = self.recv()
        assert packet.type == cmd, f"expected {cmd.name}, got {packet}"
        return packet

    def request(self, cmd: Cmd, *args: bytes | str, reply: Cmd) -> Packet:
        self.send(cmd, *args)
        return self.expect(reply)

    def admin(self, command: str) -> str:
        """Send one admin text command and return its complete reply."""
        self.sock.sendall(command.encode() + b"\n")
        is_list = command.lower() in LIST_COMMANDS
        while True:
            text = self.buffer.decode()
            complete = not is_list or text.startswith("ERR ") or text == ".\n"
            if text.endswith("\n") and (complete or text.endswith("\n.\n")):
                break
            self._fill()
        self.buffer = b""
        return text

    # -- client helpers ---------------------------------------------------------------------

    def submit_bg(
        self, function: str, data: bytes | str, unique: str = "", priority: str = "normal"
    ) -> str:
        """Queue a background job; returns its handle."""
        created = self.request(SUBMIT_BG[priority], function, unique, data, reply=Cmd.JOB_CREATED)
        return created.args[0].decode()

    def submit_fg(
        self, function: str, data: bytes | str, unique: str = "", priority: str = "normal"
    ) -> str:
        """Submit a foreground job and return its handle; results arrive on this socket later."""
        created = self.request(SUBMIT_FG[priority], function, unique, data, reply=Cmd.JOB_CREATED)
        return created.args[0].decode()

    def status_unique(self, unique: str) -> tuple[bool, bool, int]:
        """GET_STATUS_UNIQUE: (known, running, number of waiting foreground clients)."""
        res = self.request(Cmd.GET_STATUS_UNIQUE, unique, reply=Cmd.STATUS_RES_UNIQUE)
        assert res.args[0] == unique.encode(), res
        return res.args[1] == b"1", res.args[2] == b"1", int(res.args[5])

    def results_until_done(self) -> list[Packet]:
        """Read forwarded work packets for foreground jobs until a COMPLETE/FAIL arrives."""
        packets: list[Packet] = []
        while True:
            packet = self.recv()
            packets.append(packet)
            if packet.type in (Cmd.WORK_COMPLETE, Cmd.WORK_FAIL):
                return packets

    # -- worker helpers ---------------------------------------------------------------------

    def grab(self) -> Packet:
        """GRAB_JOB_UNIQ; returns JOB_ASSIGN_UNIQ or NO_JOB."""
        self.send(Cmd.GRAB_JOB_UNIQ)
        packet = self.recv()
        assert packet.type in (Cmd.JOB_ASSIGN_UNIQ, Cmd.NO_JOB), packet
        return packet


# -- admin helpers --------------------------------------------------------------------------

# Admin helpers accept a server (each command then uses a fresh connection) or an open
# connection. Tests that assert the `workers` listing poll over one long-lived connection, so
# no recently closed admin connection can still be listed by the server.
Target = ServerProcess | GearmanSocket


def admin(target: Target, command: str) -> str:
    """One admin command; the complete reply."""
    if isinstance(target, GearmanSocket):
        return target.admin(command)
    with GearmanSocket(target) as conn:
        return conn.admin(command)


def list_lines(reply: str) -> list[str]:
    """The body lines of a list reply (without the final ".")."""
    lines = reply.split("\n")
    assert lines[-2:] == [".", ""], f"not a complete list reply: {reply!r}"
    return lines[:-2]


def status(target: Target) -> dict[str, tuple[int, int, int]]:
    """`status` as {function: (total, running, available_workers)}."""
    result: dict[str, tuple[int, int, int]] = {}
    for line in list_lines(admin(target, "status")):
        name, total, running, workers = line.split("\t")
        result[name] = (int(total), int(running), int(workers))
    return result


def priority_status(target: Target) -> dict[str, tuple[int, int, int, int]]:
    """`prioritystatus` as {function: (high, normal, low, workers)}."""
    result: dict[str, tuple[int, int, int, int]] = {}
    for line in list_lines(admin(target, "prioritystatus")):
        name, high, normal, low, workers = line.split("\t")
        result[name] = (int(high), int(normal), int(low), int(workers))
    return result


def wait_until(probe: Callable[[], T | None], what: str, deadline: float = DEADLINE) -> T:
    """Call `probe` until it returns something other than None/False; fail after `deadline`."""
    end = time.monotonic() + deadline
    last: T | None = None
    while time.monotonic() < end:
        last = probe()
        if last is not None and last is not False:
            return last
        time.sleep(0.01)
    raise AssertionError(f"timed out after {deadline}s waiting for {what} (last: {last!r})")


def wait_for_status(
    target: Target,
    function: str,
    expected: Callable[[tuple[int, int, int]], bool],
    what: str,
) -> tuple[int, int, int]:
    """Poll `status` until `function`'s (total, running, workers) satisfies `expected`."""

    def probe() -> tuple[int, int, int] | None:
        row = status(target).get(function)
        return row if row is not None and expected(row) else None

    return wait_until(probe, f"status of {function!r}: {what}")


def wait_for_workers(target: Target, function: str, count: int = 1) -> None:
    """Poll `status` until exactly `count` workers can do `function`."""
    wait_for_status(target, function, lambda row: row[2] == count, f"{count} worker(s)")


def register_worker(
    server: ServerProcess,
    functions: list[str],
    client_id: str | None = None,
    watch: GearmanSocket | None = None,
) -> GearmanSocket:
    """A raw worker: SET_CLIENT_ID (optional) + CAN_DO per function.

    Registration is awaited by polling `status` (over `watch` if given) until every function
    has one more available worker than before.
    """
    target: Target = watch if watch is not None else server
    before = status(target)
    conn = GearmanSocket(server)
    if client_id is not None:
        conn.send(Cmd.SET_CLIENT_ID, client_id)
    for function in functions:
        conn.send(Cmd.CAN_DO, function)
    for function in functions:
        count = before.get(function, (0, 0, 0))[2] + 1
        wait_for_workers(target, function, count)
    return conn
