"""A client's connection to one server, and the values the client hands back.

Gearman servers answer a connection's requests in order, so a `Session` matches direct replies
(JOB_CREATED, STATUS_RES, ...) to requests first in, first out, and routes WORK_* packets to
the foreground jobs waiting on them by handle.

The hot path makes no Task and no timer per request: a batch of submissions (one `submit` is a
batch of one) is one write and one future, resolved once every job in it has its outcome; the
reply timeout is one timer per session, armed for the oldest request still unanswered.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Final, Literal

from mypy_extensions import mypyc_attr

from jobwire.protocols.gearman import Packet, PacketType, encode_request
from jobwire.sdk.connection import Connection, parse_address
from jobwire.sdk.errors import JobException, JobFailed, ServerError, ServerUnavailable

log = logging.getLogger("jobwire.sdk")

P = PacketType
Priority = Literal["normal", "high", "low"]

_SUBMIT: Final = {
    ("normal", False): P.SUBMIT_JOB,
    ("high", False): P.SUBMIT_JOB_HIGH,
    ("low", False): P.SUBMIT_JOB_LOW,
    ("normal", True): P.SUBMIT_JOB_BG,
    ("high", True): P.SUBMIT_JOB_HIGH_BG,
    ("low", True): P.SUBMIT_JOB_LOW_BG,
}
_REPLIES: Final = {P.JOB_CREATED, P.STATUS_RES, P.STATUS_RES_UNIQUE, P.OPTION_RES, P.ERROR}
_WORK: Final = {
    P.WORK_DATA,
    P.WORK_WARNING,
    P.WORK_STATUS,
    P.WORK_COMPLETE,
    P.WORK_FAIL,
    P.WORK_EXCEPTION,
}
_FINAL: Final = {P.WORK_COMPLETE, P.WORK_FAIL, P.WORK_EXCEPTION}
# Plain ints for the per-packet comparisons: `P.X` goes through the enum class's
# `__getattr__` hook, and a module global is a dictionary look-up; compiled, a Final int is a
# constant, compared natively with the packet's type.
_JOB_CREATED: Final = 8
_WORK_COMPLETE: Final = 13
_WORK_FAIL: Final = 14
_ERROR: Final = 19
_WORK_EXCEPTION: Final = 25
assert (_JOB_CREATED, _WORK_COMPLETE, _WORK_FAIL, _ERROR, _WORK_EXCEPTION) == (
    P.JOB_CREATED,
    P.WORK_COMPLETE,
    P.WORK_FAIL,
    P.ERROR,
    P.WORK_EXCEPTION,
)
MAX_UNIQUE: Final = 64  # gearmand refuses longer unique keys

DataCallback = Callable[[bytes], None]
StatusCallback = Callable[[int, int], None]


@mypyc_attr(native_class=False)  # compiled, a str subclass must stay a Python class
class Handle(str):
    """A background job's handle; `server` is the address of the server that holds the job."""

    server: str

    def __new__(cls, value: str, server: str) -> Handle:
        handle = str.__new__(cls, value)  # not super(): mypyc compiles this module
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


class Batch:
    """The outcomes of one `Session.run`, and one future that resolves when all are in."""

    __slots__ = ("done", "left", "outcomes")

    def __init__(self, size: int, loop: asyncio.AbstractEventLoop) -> None:
        self.outcomes: list[object] = [_UNSET] * size
        self.left = size
        self.done: asyncio.Future[None] = loop.create_future()

    def settle(self, index: int, outcome: object) -> None:
        """Record the first outcome of request `index`; later ones are ignored."""
        if self.outcomes[index] is not _UNSET:
            return
        self.outcomes[index] = outcome
        self.left -= 1
        if not self.left and not self.done.done():
            self.done.set_result(None)


_UNSET: Final = object()


class Receipt:
    """A pipelined background submission (`Client.submit_background`,
    `AsyncClient.submit_background_nowait`): sent at once, acknowledged later.

    It resolves to the job's `Handle` when the server's JOB_CREATED arrives (on a durable
    server: once the job is on disk), or to the error that ended it after the client's retries.
    `done()` says whether it has; `result()` returns the handle or raises the error (from the
    blocking `Client` it waits; from `AsyncClient` it raises RuntimeError if not resolved yet:
    `await receipt` waits). `server` and `str()` are the handle's, waiting likewise, so code
    written for the handle `submit_background` used to return keeps working.
    """

    __slots__ = ("_futures", "_on_settle", "_waiter", "outcome", "request", "retried", "start")

    def __init__(
        self,
        request: Request,
        start: int,
        on_settle: Callable[[Receipt], None],
        waiter: Callable[[Receipt], None] | None,
    ) -> None:
        self.request = request
        self.start = start  # the server index it was sent to first
        self.retried = False  # went through the client's Lazy Pirate retries
        self.outcome: object = _UNSET
        self._on_settle = on_settle
        self._waiter = waiter
        self._futures: list[asyncio.Future[None]] | None = None  # `await receipt` callers

    def settle(self, index: int, outcome: object) -> None:
        """Called by the session (as a one-request batch) with the JOB_CREATED handle or the
        error; the client decides whether the error is final (see `AsyncClient`)."""
        if self.outcome is _UNSET:
            self.outcome = outcome
            self._on_settle(self)  # may take a retryable error back (outcome unset again)
            if self._futures and self.outcome is not _UNSET:
                for future in self._futures:
                    if not future.done():
                        future.set_result(None)
                self._futures = None

    def done(self) -> bool:
        return self.outcome is not _UNSET

    def result(self) -> Handle:
        """The handle, or the error raised; see the class docstring for waiting."""
        if self.outcome is _UNSET:
            if self._waiter is None:
                raise RuntimeError("not acknowledged yet: await it, or await client.flush()")
            self._waiter(self)
        outcome = self.outcome
        if isinstance(outcome, BaseException):
            raise outcome
        assert isinstance(outcome, Handle)
        return outcome

    def __await__(self) -> Generator[Any, None, Handle]:
        while self.outcome is _UNSET:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            if self._futures is None:
                self._futures = []
            self._futures.append(future)
            yield from future.__await__()
        return self.result()

    @property
    def server(self) -> str:
        return self.result().server

    def __str__(self) -> str:
        return str(self.result())

    def __repr__(self) -> str:
        state = "pending" if self.outcome is _UNSET else repr(self.outcome)
        return f"<Receipt {state}>"


class Listener:
    """A foreground job's WORK_* packets: callbacks for updates, its slot in a batch for the
    outcome."""

    __slots__ = ("batch", "handle", "index", "on_data", "on_status", "on_warning")

    def __init__(
        self,
        on_data: DataCallback | None,
        on_warning: DataCallback | None,
        on_status: StatusCallback | None,
    ) -> None:
        self.on_data = on_data
        self.on_warning = on_warning
        self.on_status = on_status
        self.batch: Batch | None = None
        self.index = 0
        self.handle: bytes | None = None  # as the server sent it: the key of `listeners`

    def packet(self, packet: Packet, handle: str) -> None:
        kind, args = packet.type, packet.args
        if kind == _WORK_COMPLETE:
            outcome: object = args[1]
        elif kind == _WORK_FAIL:
            outcome = JobFailed(handle)
        elif kind == _WORK_EXCEPTION:
            outcome = JobException(handle, args[1])
        else:
            self._update(kind, args, handle)
            return
        if self.batch is not None:
            self.batch.settle(self.index, outcome)

    def _update(self, kind: int, args: tuple[bytes, ...], handle: str) -> None:
        try:
            if kind == P.WORK_DATA and self.on_data:
                self.on_data(args[1])
            elif kind == P.WORK_WARNING and self.on_warning:
                self.on_warning(args[1])
            elif kind == P.WORK_STATUS and self.on_status:
                self.on_status(parse_int(args[1]), parse_int(args[2]))
        except Exception:  # the user's callback must not break the connection
            log.exception("update callback for job %s raised", handle)

    def lost(self, error: BaseException) -> None:
        if self.batch is not None:
            self.batch.settle(self.index, error)


class Request:
    """One submission, encoded once: a retry sends the same bytes (and so the same unique
    key) to the next server."""

    __slots__ = ("listener", "packet")

    def __init__(self, packet: bytes, listener: Listener | None = None) -> None:
        self.packet = packet
        self.listener = listener


def submit_type(priority: Priority, background: bool) -> PacketType:
    """The SUBMIT_JOB variant; ValueError for an unknown priority."""
    ptype = _SUBMIT.get((priority, background))
    if ptype is None:
        raise ValueError(f"priority must be normal, high or low, not {priority!r}")
    return ptype


# A pending reply: the packet type expected, by when (loop time), and who gets it: a future
# (`expect`), or a batch and the request's place in it with the listener to attach (`run`),
# or nobody (OPTION_REQ).
Pending = tuple[int, float, "asyncio.Future[Packet] | Batch | Receipt | None", int, Listener | None]


class Session:
    """A client's connection to one server.

    A foreground job's listener is attached when its JOB_CREATED is read, before any WORK_*
    packet for that handle can be.
    """

    def __init__(self, conn: Connection, timeout: float = 10.0) -> None:
        self.conn = conn
        self.name = conn.name
        self.timeout = timeout
        self.pending: deque[Pending] = deque()
        #: Entries of `pending` for pipelined submissions (receipts): nobody waits on those
        #: now, so they are no reason to busy-poll.
        self.pipelined = 0
        #: Foreground jobs' listeners by handle (bytes, as the server sends it).
        self.listeners: dict[bytes, list[Listener]] = {}
        self._loop = asyncio.get_running_loop()
        self._watchdog: asyncio.TimerHandle | None = None
        conn.closed.add_done_callback(self._lost)

    @classmethod
    async def open(
        cls,
        address: str,
        timeout: float,
        heartbeat: float | None,
        busy_poll: float = 0.0,
        tls: ssl.SSLContext | None = None,
        token: str | None = None,
    ) -> Session:
        conn = await Connection.open(
            parse_address(address),
            _unrouted,
            timeout=timeout,
            heartbeat=heartbeat,
            busy_poll=busy_poll,
            tls=tls,
            token=token,
        )
        session = cls(conn, timeout)
        # Nothing can be read before this: the server speaks only when spoken to.
        conn.on_packet = session.packet
        conn.waiting = session.waiting
        # Ask for WORK_EXCEPTION (gearmand sends plain WORK_FAIL otherwise). Replies come in
        # order, so nothing needs to wait for OPTION_RES; a server without the option answers
        # ERROR, which is fine: exceptions then arrive as failures.
        conn.write(encode_request(P.OPTION_REQ, b"exceptions"))
        session._pend(P.OPTION_RES, None)
        return session

    @property
    def alive(self) -> bool:
        return self.conn.is_open

    def waiting(self) -> bool:
        """A request someone waits on is unanswered, or a foreground job unfinished (a
        pipelined submission's acknowledgement is waited for at flush, not now)."""
        return len(self.pending) > self.pipelined or bool(self.listeners)

    def expect(self, data: bytes, reply: PacketType) -> asyncio.Future[Packet]:
        """Send one request; the future gets its reply (or ServerUnavailable)."""
        self.conn.write(data)
        future: asyncio.Future[Packet] = self._loop.create_future()
        self._pend(reply, future)
        return future

    def _pend(self, reply: int, target: asyncio.Future[Packet] | None) -> None:
        self.pending.append((reply, self._loop.time() + self.timeout, target, 0, None))
        self._watch()

    def _watch(self) -> None:
        if self._watchdog is None:
            self._watchdog = self._loop.call_later(self.timeout, self._check)

    def _check(self) -> None:
        """The reply timeout: a server that leaves its oldest request unanswered is dead."""
        self._watchdog = None
        if not self.pending:
            return
        deadline = self.pending[0][1]
        if deadline <= self._loop.time():
            self.conn.abort(ServerUnavailable(f"{self.name} did not answer within {self.timeout}s"))
        else:
            self._watchdog = self._loop.call_at(deadline, self._check)

    def packet(self, packet: Packet) -> None:
        kind = packet.type
        if kind == _WORK_COMPLETE:  # the commonest, first
            args = packet.args
            waiting = self.listeners.pop(args[0], None)
            if waiting is not None:
                for each in waiting:
                    if each.batch is not None:  # `each.packet(packet, handle)`, inlined
                        each.batch.settle(each.index, args[1])
            return
        if kind != _JOB_CREATED and kind in _WORK:
            # gearmand ends a WORK_FAIL it converted from an exception with a NUL.
            raw = packet.args[0].split(b"\0", 1)[0]
            waiting = self.listeners.pop(raw, None) if kind in _FINAL else self.listeners.get(raw)
            if waiting:
                handle = raw.decode("utf-8", "surrogateescape")
                for each in waiting:
                    each.packet(packet, handle)
            return
        if kind != _JOB_CREATED and kind not in _REPLIES:
            log.debug("ignoring unexpected %r from %s", packet, self.name)
            return
        if not self.pending:
            raise ServerUnavailable(f"{self.name} sent {packet!r} unasked")
        expected, _, target, index, listener = self.pending.popleft()
        if type(target) is Receipt:
            self.pipelined -= 1
        if kind == _ERROR:
            code, text = (arg.decode("utf-8", "replace") for arg in packet.args)
            _resolve(target, index, ServerError(code, text))
            return
        if kind != expected:
            raise ServerUnavailable(f"{self.name} sent {packet!r} instead of {P(expected).name}")
        if not isinstance(target, (Batch, Receipt)):
            _resolve(target, index, packet)
            return
        raw = packet.args[0]
        if listener is None:
            target.settle(index, Handle(raw.decode("utf-8", "surrogateescape"), self.name))
        elif listener.batch is target and target.outcomes[index] is _UNSET:
            listener.handle = raw
            waiting = self.listeners.get(raw)
            if waiting is None:
                self.listeners[raw] = [listener]
            else:
                waiting.append(listener)

    def forget(self, listener: Listener) -> None:
        """The caller stopped waiting (timeout, cancel): updates for the job are dropped."""
        listener.batch = None
        listeners = self.listeners.get(listener.handle or b"")
        if listeners and listener in listeners:
            listeners.remove(listener)
            if not listeners:
                del self.listeners[listener.handle or b""]

    def _lost(self, _: object) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        error = ServerUnavailable(f"lost connection to {self.name}: {self.conn.error}")
        self.pipelined = 0
        while self.pending:
            _, _, target, index, _ = self.pending.popleft()
            _resolve(target, index, error)
        for listeners in self.listeners.values():
            for listener in listeners:
                listener.lost(error)
        self.listeners.clear()

    def pipeline(self, receipt: Receipt, now: bool) -> None:
        """Send one background submission without waiting: its JOB_CREATED (or ERROR, or the
        connection's loss) settles `receipt`. `now`: write at once, else with the rest of this
        loop turn's output. ServerUnavailable if the connection is closed."""
        if now:
            self.conn.write(receipt.request.packet)
        else:
            self.conn.send(receipt.request.packet)
        self.pending.append((_JOB_CREATED, self._loop.time() + self.timeout, receipt, 0, None))
        self.pipelined += 1
        if self._watchdog is None:
            self._watch()

    async def run(self, requests: list[Request], timeout: float | None = None) -> list[object]:
        """Submit `requests` in one write; each outcome is the result (foreground), a Handle
        (background), or the exception that ended it (ServerUnavailable means: retry it)."""
        batch = self.start(requests, timeout)
        try:
            await batch.done
        finally:
            if batch.left:  # cancelled (the caller's timeout): stop listening
                self.abandon(batch, requests)
        return batch.outcomes

    def start(self, requests: list[Request], timeout: float | None = None) -> Batch:
        """`run` up to its wait: write `requests` in one write and return the batch whose
        `done` resolves once every outcome is in. A caller that stops waiting before then
        calls `abandon`. ServerUnavailable if the connection is closed."""
        if timeout is not None:
            self.timeout = timeout
        # One write for the whole batch: pipelining is the point of submit_many.
        self.conn.write(
            requests[0].packet
            if len(requests) == 1
            else b"".join([request.packet for request in requests])
        )
        batch = Batch(len(requests), self._loop)
        deadline = self._loop.time() + self.timeout
        pend = self.pending.append
        for index, request in enumerate(requests):
            listener = request.listener
            if listener is not None:  # arm it: report to this batch (a retry is a new job)
                listener.batch, listener.index, listener.handle = batch, index, None
            pend((_JOB_CREATED, deadline, batch, index, listener))
        if self._watchdog is None:
            self._watch()
        return batch

    def abandon(self, batch: Batch, requests: list[Request]) -> None:
        """The caller stopped waiting for `batch`: updates for its jobs are dropped."""
        for request in requests:
            if request.listener is not None and request.listener.batch is batch:
                self.forget(request.listener)


def _unrouted(packet: Packet) -> None:
    raise ServerUnavailable(f"unexpected {packet!r} before the session was set up")


def _resolve(
    target: asyncio.Future[Packet] | Batch | Receipt | None, index: int, outcome: object
) -> None:
    """Hand a direct reply, or the exception that replaces it, to whoever waits for it."""
    if isinstance(target, (Batch, Receipt)):
        target.settle(index, outcome)
    elif target is not None and not target.done():
        if isinstance(outcome, BaseException):
            target.set_exception(outcome)
        else:
            target.set_result(outcome)  # type: ignore[arg-type]
