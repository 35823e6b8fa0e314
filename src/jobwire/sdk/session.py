"""A client's connection to one server, and the values the client hands back.

Gearman servers answer a connection's requests in order, so a `Session` matches direct replies
(JOB_CREATED, STATUS_RES, ...) to requests first in, first out, and routes WORK_* packets to
the foreground jobs waiting on them by handle.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from jobwire.protocols.gearman import Packet, PacketType, encode_request
from jobwire.sdk.connection import Connection, parse_address
from jobwire.sdk.errors import JobException, JobFailed, ServerError, ServerUnavailable

log = logging.getLogger("jobwire.sdk")

P = PacketType
Priority = Literal["normal", "high", "low"]

_SUBMIT = {
    ("normal", False): P.SUBMIT_JOB,
    ("high", False): P.SUBMIT_JOB_HIGH,
    ("low", False): P.SUBMIT_JOB_LOW,
    ("normal", True): P.SUBMIT_JOB_BG,
    ("high", True): P.SUBMIT_JOB_HIGH_BG,
    ("low", True): P.SUBMIT_JOB_LOW_BG,
}
_REPLIES = {P.JOB_CREATED, P.STATUS_RES, P.STATUS_RES_UNIQUE, P.OPTION_RES, P.ERROR}
_WORK = {P.WORK_DATA, P.WORK_WARNING, P.WORK_STATUS, P.WORK_COMPLETE, P.WORK_FAIL, P.WORK_EXCEPTION}
MAX_UNIQUE = 64  # gearmand refuses longer unique keys

DataCallback = Callable[[bytes], None]
StatusCallback = Callable[[int, int], None]


class Handle(str):
    """A background job's handle; `server` is the address of the server that holds the job."""

    server: str

    def __new__(cls, value: str, server: str) -> Handle:
        handle = super().__new__(cls, value)
        handle.server = server
        return handle


@dataclass(frozen=True, slots=True)
class JobStatus:
    """GET_STATUS / GET_STATUS_UNIQUE answer. `clients` (foreground clients waiting) is only
    known for `status_unique`."""

    known: bool
    running: bool
    numerator: int = 0
    denominator: int = 0
    clients: int | None = None


@dataclass(frozen=True, slots=True)
class Update:
    """One event of a foreground job, as yielded by `stream()`.

    kind "data" / "warning": `data` is what the worker sent; "status": `numerator` and
    `denominator`; "complete" (always last): `data` is the result.
    """

    kind: Literal["data", "warning", "status", "complete"]
    data: bytes = b""
    numerator: int = 0
    denominator: int = 0


def parse_int(raw: bytes) -> int:
    try:
        return int(raw)
    except ValueError:
        return 0


class Listener:
    """A foreground job's WORK_* packets: callbacks for updates, a future for the outcome."""

    def __init__(
        self,
        on_data: DataCallback | None,
        on_warning: DataCallback | None,
        on_status: StatusCallback | None,
    ) -> None:
        self.on_data = on_data
        self.on_warning = on_warning
        self.on_status = on_status
        self.outcome: asyncio.Future[bytes] | None = None

    def arm(self) -> asyncio.Future[bytes]:
        """A fresh outcome for the next attempt (a retry is a new job on the server)."""
        self.outcome = asyncio.get_running_loop().create_future()
        return self.outcome

    def packet(self, packet: Packet, handle: str) -> None:
        kind, args = packet.type, packet.args
        try:
            if kind == P.WORK_DATA and self.on_data:
                self.on_data(args[1])
            elif kind == P.WORK_WARNING and self.on_warning:
                self.on_warning(args[1])
            elif kind == P.WORK_STATUS and self.on_status:
                self.on_status(parse_int(args[1]), parse_int(args[2]))
        except Exception:  # the user's callback must not break the connection
            log.exception("update callback for job %s raised", handle)
        outcome = self.outcome
        if outcome is None or outcome.done():
            return
        if kind == P.WORK_COMPLETE:
            outcome.set_result(args[1])
        elif kind == P.WORK_FAIL:
            outcome.set_exception(JobFailed(handle))
        elif kind == P.WORK_EXCEPTION:
            outcome.set_exception(JobException(handle, args[1]))

    def lost(self, error: BaseException) -> None:
        if self.outcome is not None and not self.outcome.done():
            self.outcome.set_exception(error)


@dataclass(slots=True)
class Request:
    function: bytes
    unique: bytes
    payload: bytes
    priority: Priority
    background: bool
    listener: Listener | None = None

    def encode(self) -> bytes:
        ptype = _SUBMIT[self.priority, self.background]
        return encode_request(ptype, self.function, self.unique, self.payload)


# A pending reply: the packet type expected, its future, and for submits the listener to attach.
Pending = tuple[PacketType, "asyncio.Future[Packet]", Listener | None]


class Session:
    """A client's connection to one server.

    A foreground job's listener is attached when its JOB_CREATED is read, before any WORK_*
    packet for that handle can be.
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.name = conn.name
        self.pending: deque[Pending] = deque()
        self.listeners: dict[str, list[Listener]] = {}
        conn.closed.add_done_callback(self._lost)

    @classmethod
    async def open(cls, address: str, timeout: float, heartbeat: float | None) -> Session:
        session: Session | None = None

        def on_packet(packet: Packet) -> None:
            assert session is not None
            session.packet(packet)

        conn = await Connection.open(
            parse_address(address), on_packet, timeout=timeout, heartbeat=heartbeat
        )
        session = cls(conn)
        # Ask for WORK_EXCEPTION (gearmand sends plain WORK_FAIL otherwise). Replies come in
        # order, so nothing needs to wait for OPTION_RES; a server without the option answers
        # ERROR, which is fine: exceptions then arrive as failures.
        session.expect(encode_request(P.OPTION_REQ, b"exceptions"), P.OPTION_RES)
        return session

    @property
    def alive(self) -> bool:
        return self.conn.is_open

    def expect(self, data: bytes, reply: PacketType) -> asyncio.Future[Packet]:
        """Send one request; the future gets its reply."""
        self.conn.send(data)
        return self._pend(reply, None)

    def _pend(self, reply: PacketType, listener: Listener | None) -> asyncio.Future[Packet]:
        future: asyncio.Future[Packet] = asyncio.get_running_loop().create_future()
        self.pending.append((reply, future, listener))
        return future

    def packet(self, packet: Packet) -> None:
        kind = packet.type
        if kind in _WORK:
            # gearmand ends a WORK_FAIL it converted from an exception with a NUL.
            handle = packet.args[0].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            for waiting in self.listeners.get(handle, ()):
                waiting.packet(packet, handle)
            if kind in (P.WORK_COMPLETE, P.WORK_FAIL, P.WORK_EXCEPTION):
                self.listeners.pop(handle, None)
            return
        if kind not in _REPLIES:
            log.debug("ignoring unexpected %r from %s", packet, self.name)
            return
        if not self.pending:
            raise ServerUnavailable(f"{self.name} sent {packet!r} unasked")
        expected, future, listener = self.pending.popleft()
        if kind == P.ERROR:
            code, text = (arg.decode("utf-8", "replace") for arg in packet.args)
            if expected != P.OPTION_RES and not future.done():
                future.set_exception(ServerError(code, text))
            return
        if kind != expected:
            raise ServerUnavailable(f"{self.name} sent {packet!r} instead of {expected.name}")
        if listener is not None:
            handle = packet.args[0].decode("utf-8", "surrogateescape")
            self.listeners.setdefault(handle, []).append(listener)
        if not future.done():
            future.set_result(packet)

    def forget(self, handle: str, listener: Listener) -> None:
        """The caller stopped waiting (timeout, cancel): updates for the job are dropped."""
        listeners = self.listeners.get(handle)
        if listeners and listener in listeners:
            listeners.remove(listener)
            if not listeners:
                del self.listeners[handle]

    def _lost(self, _: object) -> None:
        error = ServerUnavailable(f"lost connection to {self.name}: {self.conn.error}")
        while self.pending:
            future = self.pending.popleft()[1]
            if not future.done():
                future.set_exception(error)
        for listeners in self.listeners.values():
            for listener in listeners:
                listener.lost(error)
        self.listeners.clear()

    async def reply(self, future: asyncio.Future[Packet], timeout: float) -> Packet:
        """Wait for a direct reply; no reply within `timeout` means the server is presumed dead."""
        await asyncio.wait([future], timeout=timeout)
        if not future.done():
            error = ServerUnavailable(f"{self.name} did not answer within {timeout}s")
            self.conn.abort(error)
            future.cancel()
            raise error
        return future.result()

    async def run(self, requests: list[Request], timeout: float) -> list[object]:
        """Submit `requests` in one write; each outcome is the result (foreground), a Handle
        (background), or the exception that ended it (ServerUnavailable means: retry it)."""
        for request in requests:
            if request.listener is not None:
                request.listener.arm()
        # One write for the whole batch: pipelining is the point of submit_many.
        self.conn.send(b"".join(request.encode() for request in requests))
        created = [self._pend(P.JOB_CREATED, request.listener) for request in requests]
        await asyncio.wait(created, timeout=timeout)
        if not all(future.done() for future in created):
            self.conn.abort(ServerUnavailable(f"{self.name} did not answer within {timeout}s"))
            for future in created:
                future.cancel()  # these will never be answered

        async def finish(request: Request, future: asyncio.Future[Packet]) -> object:
            if future.cancelled():
                raise ServerUnavailable(f"{self.name} did not answer within {timeout}s")
            handle = future.result().args[0].decode("utf-8", "surrogateescape")
            listener = request.listener
            if listener is None:
                return Handle(handle, self.name)
            assert listener.outcome is not None
            try:
                return await listener.outcome
            finally:
                self.forget(handle, listener)

        return await asyncio.gather(
            *(finish(request, future) for request, future in zip(requests, created, strict=True)),
            return_exceptions=True,
        )
