"""Gearman clients: `AsyncClient` (asyncio) and `Client` (the same API, blocking).

Reliability is the Lazy Pirate pattern (ZeroMQ guide ch. 4), applied per request: a server that
refuses the connection, drops it, or does not answer within `timeout` seconds has its connection
closed, and the request is sent again to the next server, up to `retries` more times (after every
full pass over the servers the client backs off, doubling from `backoff` up to `backoff_cap`);
then `ServerUnavailable` is raised.

Delivery guarantee: **at least once** for retried submissions. A retry is sent when the client
cannot tell whether the server kept the job (no JOB_CREATED before the timeout, or a foreground
job's connection lost before its result), so a job may run more than once: make tasks
idempotent, or pass a `unique` key. Every submission carries a unique key (a random one unless you
give one), so a retry that reaches the *same* server while it still holds the job is coalesced
onto it instead of creating a second job; a retry on another server, or after the server lost its
queue, creates a new one. Jobs are never silently dropped by the client: each call either returns
the result / handle or raises. Once a background job has its handle, the client's part is done:
whether it survives a server crash is up to the server (jobwire's SQLite store keeps it, gearmand
without a persistent queue does not).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import uuid
import zlib
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

from jobwire.protocols.gearman import Packet, PacketType, encode_request
from jobwire.sdk.connection import Connection, format_address, parse_address
from jobwire.sdk.errors import (
    JobException,
    JobFailed,
    ServerError,
    ServerUnavailable,
    Timeout,
)
from jobwire.sdk.payload import to_bytes

log = logging.getLogger("jobwire.sdk")

T = TypeVar("T")
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


def _int(raw: bytes) -> int:
    try:
        return int(raw)
    except ValueError:
        return 0


class _Listener:
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
                self.on_status(_int(args[1]), _int(args[2]))
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
class _Request:
    function: bytes
    unique: bytes
    payload: bytes
    priority: Priority
    background: bool
    listener: _Listener | None = None

    def encode(self) -> bytes:
        ptype = _SUBMIT[self.priority, self.background]
        return encode_request(ptype, self.function, self.unique, self.payload)


# A pending reply: the packet type expected, its future, and for submits the listener to attach.
_Pending = tuple[PacketType, "asyncio.Future[Packet]", _Listener | None]


class _Session:
    """A client's connection to one server.

    Gearman servers answer a connection's requests in order, so direct replies (JOB_CREATED,
    STATUS_RES, ...) are matched to requests first-in first-out; WORK_* packets are routed by
    job handle. A foreground job's listener is attached when its JOB_CREATED is read, before any
    WORK_* packet for that handle can be.
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.name = conn.name
        self.pending: deque[_Pending] = deque()
        self.listeners: dict[str, list[_Listener]] = {}
        conn.closed.add_done_callback(self._lost)

    @classmethod
    async def open(cls, address: str, timeout: float, heartbeat: float | None) -> _Session:
        session: _Session | None = None

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

    def expect(
        self, data: bytes, reply: PacketType, listener: _Listener | None = None
    ) -> asyncio.Future[Packet]:
        future: asyncio.Future[Packet] = asyncio.get_running_loop().create_future()
        self.conn.send(data)
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
            raise ValueError(f"unsolicited {packet!r}")
        expected, future, listener = self.pending.popleft()
        if kind == P.ERROR:
            code, text = (arg.decode("utf-8", "replace") for arg in packet.args)
            if expected != P.OPTION_RES and not future.done():
                future.set_exception(ServerError(code, text))
            return
        if kind != expected:
            raise ValueError(f"expected {expected.name}, got {packet!r}")
        if listener is not None:
            self.listeners.setdefault(packet.args[0].decode(), []).append(listener)
        if not future.done():
            future.set_result(packet)

    def forget(self, handle: str, listener: _Listener) -> None:
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

    async def run(self, requests: list[_Request], timeout: float) -> list[object]:
        """Submit `requests` in one write; each outcome is the result (foreground), a Handle
        (background), or the exception that ended it (ServerUnavailable means: retry it)."""
        for request in requests:
            if request.listener is not None:
                request.listener.arm()
        created = [
            self.expect(request.encode(), P.JOB_CREATED, request.listener) for request in requests
        ]
        await asyncio.wait(created, timeout=timeout)
        if not all(future.done() for future in created):
            self.conn.abort(ServerUnavailable(f"{self.name} did not answer within {timeout}s"))
            for future in created:
                future.cancel()  # these will never be answered

        async def finish(request: _Request, future: asyncio.Future[Packet]) -> object:
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


def _listener(background: bool) -> _Listener | None:
    return None if background else _Listener(None, None, None)


class AsyncClient:
    """Submit jobs to Gearman servers (jobwire or gearmand) from asyncio code.

    `servers`: "host[:port]" strings. `timeout`: seconds a server has to accept a connection or
    answer a request before the client gives up on it and retries on the next server, at most
    `retries` more times. `heartbeat`: while connected, a server that stays silent for three
    heartbeat intervals is presumed dead (so a foreground job on a hung server is retried rather
    than waited on forever). Safe to share between tasks of one event loop.

    Delivery: at least once for retried submissions; see the module docstring.
    """

    def __init__(
        self,
        servers: Iterable[str] = ("127.0.0.1:4730",),
        *,
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.25,
        backoff_cap: float = 4.0,
        heartbeat: float | None = 5.0,
    ) -> None:
        self.servers = [format_address(parse_address(server)) for server in servers]
        if not self.servers:
            raise ValueError("no servers given")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.backoff_cap = backoff_cap
        self.heartbeat = heartbeat
        self._sessions: dict[int, _Session] = {}
        self._opening: dict[int, asyncio.Task[_Session]] = {}
        self._round_robin = itertools.count()
        self._closed = False

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connections; requests still in flight fail with ServerUnavailable."""
        self._closed = True
        sessions, self._sessions = list(self._sessions.values()), {}
        await asyncio.gather(*(session.conn.close() for session in sessions))

    # ------------------------------------------------------------ submitting

    async def submit(
        self,
        function: str,
        payload: Any = b"",
        *,
        unique: str | None = None,
        priority: Priority = "normal",
        timeout: float | None = None,
        on_data: DataCallback | None = None,
        on_warning: DataCallback | None = None,
        on_status: StatusCallback | None = None,
    ) -> bytes:
        """Run a job and return its result.

        Raises JobFailed (WORK_FAIL), JobException (the task raised; `.data` holds what the
        worker reported), Timeout (no result within `timeout` seconds; the job is not cancelled),
        ServerUnavailable (retries exhausted) or ServerError (the server refused the job).
        `on_data`, `on_warning` and `on_status(numerator, denominator)` are called with the
        job's updates as they arrive; after a retry, updates may repeat.
        """
        listener = _Listener(on_data, on_warning, on_status)
        request = self._request(function, payload, unique, priority, False, listener)
        outcome = await self._with_deadline(self._execute([request], self._start(unique)), timeout)
        return self._unwrap(outcome[0], bytes)

    async def submit_background(
        self,
        function: str,
        payload: Any = b"",
        *,
        unique: str | None = None,
        priority: Priority = "normal",
    ) -> Handle:
        """Queue a job without waiting for it; returns its handle (see `status`)."""
        request = self._request(function, payload, unique, priority, True, None)
        outcome = await self._execute([request], self._start(unique))
        return self._unwrap(outcome[0], Handle)

    @overload
    async def submit_many(
        self,
        function: str,
        payloads: Iterable[Any],
        *,
        background: Literal[False] = False,
        priority: Priority = "normal",
        timeout: float | None = None,
        return_exceptions: bool = False,
    ) -> list[bytes]: ...

    @overload
    async def submit_many(
        self,
        function: str,
        payloads: Iterable[Any],
        *,
        background: Literal[True],
        priority: Priority = "normal",
        timeout: float | None = None,
        return_exceptions: bool = False,
    ) -> list[Handle]: ...

    async def submit_many(
        self,
        function: str,
        payloads: Iterable[Any],
        *,
        background: bool = False,
        priority: Priority = "normal",
        timeout: float | None = None,
        return_exceptions: bool = False,
    ) -> list[bytes] | list[Handle]:
        """Submit many jobs pipelined on one connection (all SUBMITs in one write) and return
        their results (or handles, with `background=True`) in order.

        A failed job raises its error once all jobs are done, unless `return_exceptions`, which
        puts the exception in its place in the list instead (typed as the result for brevity).
        Jobs whose server stopped answering are retried together on the next server.
        """
        requests = [
            self._request(function, payload, None, priority, background, _listener(background))
            for payload in payloads
        ]
        if not requests:
            return []
        outcomes = await self._with_deadline(
            self._execute(requests, next(self._round_robin)), timeout
        )
        if not return_exceptions:
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
        return outcomes  # type: ignore[return-value]

    async def stream(
        self,
        function: str,
        payload: Any = b"",
        *,
        unique: str | None = None,
        priority: Priority = "normal",
        timeout: float | None = None,
    ) -> AsyncGenerator[Update, None]:
        """Run a job and yield its updates as they arrive, then an Update("complete", result).

        Raises what `submit` raises. Leaving the loop early stops listening (the job goes on).
        """
        updates: asyncio.Queue[Update | None] = asyncio.Queue()
        job = asyncio.ensure_future(
            self.submit(
                function,
                payload,
                unique=unique,
                priority=priority,
                timeout=timeout,
                on_data=lambda data: updates.put_nowait(Update("data", data)),
                on_warning=lambda data: updates.put_nowait(Update("warning", data)),
                on_status=lambda n, d: updates.put_nowait(Update("status", b"", n, d)),
            )
        )
        job.add_done_callback(lambda _: updates.put_nowait(None))
        try:
            while (update := await updates.get()) is not None:
                yield update
            yield Update("complete", await job)
        finally:
            job.cancel()

    # ------------------------------------------------------------ status

    async def status(self, handle: str) -> JobStatus:
        """GET_STATUS. A `Handle` is asked of its own server; a plain string of every server."""
        server = getattr(handle, "server", None)
        indexes = (
            [self.servers.index(server)] if server in self.servers else range(len(self.servers))
        )
        packets = await self._ask_all(
            indexes, encode_request(P.GET_STATUS, handle.encode()), P.STATUS_RES
        )
        for args in packets:
            if args[1] == b"1":
                return JobStatus(True, args[2] == b"1", _int(args[3]), _int(args[4]))
        return JobStatus(False, False)

    async def status_unique(self, unique: str) -> JobStatus:
        """GET_STATUS_UNIQUE, asked of every server (a retried job may live on any of them)."""
        packets = await self._ask_all(
            range(len(self.servers)),
            encode_request(P.GET_STATUS_UNIQUE, unique.encode()),
            P.STATUS_RES_UNIQUE,
        )
        clients = 0
        for args in packets:
            if args[1] == b"1":
                return JobStatus(True, args[2] == b"1", _int(args[3]), _int(args[4]), _int(args[5]))
            clients += _int(args[5])
        return JobStatus(False, False, clients=clients)

    # ------------------------------------------------------------ internals

    def _request(
        self,
        function: str,
        payload: Any,
        unique: str | None,
        priority: Priority,
        background: bool,
        listener: _Listener | None,
    ) -> _Request:
        if priority not in ("normal", "high", "low"):
            raise ValueError(f"priority must be normal, high or low, not {priority!r}")
        raw_unique = (unique if unique is not None else uuid.uuid4().hex).encode()
        if len(raw_unique) > MAX_UNIQUE:
            raise ValueError(f"unique keys are at most {MAX_UNIQUE} bytes")
        raw_function = function.encode()
        if not raw_function or b"\0" in raw_function + raw_unique:
            raise ValueError("function names must be non-empty; neither may contain NUL")
        return _Request(raw_function, raw_unique, to_bytes(payload), priority, background, listener)

    def _start(self, unique: str | None) -> int:
        """The first server to try: by unique key, so equal keys meet; else round robin."""
        if unique:
            return zlib.crc32(unique.encode()) % len(self.servers)
        return next(self._round_robin) % len(self.servers)

    async def _session(self, index: int) -> _Session:
        if self._closed:
            raise ServerUnavailable("the client is closed")
        session = self._sessions.get(index)
        if session is not None and session.alive:
            return session
        # Concurrent callers share one connection attempt.
        opening = self._opening.get(index)
        if opening is None:
            opening = asyncio.ensure_future(
                _Session.open(self.servers[index], self.timeout, self.heartbeat)
            )
            self._opening[index] = opening
            opening.add_done_callback(lambda _: self._opening.pop(index, None))
        session = await asyncio.shield(opening)
        self._sessions[index] = session
        return session

    async def _pause(self, attempt: int) -> None:
        """Back off after each full pass over the servers, not between servers."""
        passes = attempt // len(self.servers)
        if attempt and attempt % len(self.servers) == 0:
            await asyncio.sleep(min(self.backoff * 2 ** (passes - 1), self.backoff_cap))

    async def _execute(self, requests: list[_Request], start: int) -> list[object]:
        """Lazy Pirate: send what is unfinished to the next server until all is done."""
        outcomes: list[object] = [None] * len(requests)
        todo = list(range(len(requests)))
        error: ServerUnavailable | None = None
        for attempt in range(self.retries + 1):
            await self._pause(attempt)
            index = (start + attempt) % len(self.servers)
            try:
                session = await self._session(index)
                results = await session.run([requests[i] for i in todo], self.timeout)
            except ServerUnavailable as exc:
                results = [exc] * len(todo)
            retry = []
            for i, result in zip(todo, results, strict=True):
                if isinstance(result, ServerUnavailable):
                    retry.append(i)
                    error = result
                else:
                    outcomes[i] = result
            todo = retry
            if not todo:
                return outcomes
            if self._closed:
                raise ServerUnavailable("the client was closed")
            log.warning(
                "%d job(s) not done on %s (%s); retrying", len(todo), self.servers[index], error
            )
        raise ServerUnavailable(f"gave up after {self.retries + 1} attempt(s): {error}")

    async def _ask(self, index: int, data: bytes, reply: PacketType) -> tuple[bytes, ...]:
        """One request to one server, reconnecting up to `retries` times."""
        error: ServerUnavailable | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(min(self.backoff * 2 ** (attempt - 1), self.backoff_cap))
            try:
                session = await self._session(index)
                return (await session.reply(session.expect(data, reply), self.timeout)).args
            except ServerUnavailable as exc:
                error = exc
        assert error is not None
        raise error

    async def _ask_all(
        self, indexes: Iterable[int], data: bytes, reply: PacketType
    ) -> list[tuple[bytes, ...]]:
        answers = await asyncio.gather(
            *(self._ask(i, data, reply) for i in indexes), return_exceptions=True
        )
        good = [answer for answer in answers if isinstance(answer, tuple)]
        if not good:
            for answer in answers:
                if isinstance(answer, BaseException):
                    raise answer
        return good

    @staticmethod
    async def _with_deadline(work: Awaitable[T], timeout: float | None) -> T:
        try:
            async with asyncio.timeout(timeout):
                return await work
        except TimeoutError as exc:
            if isinstance(exc, Timeout):
                raise
            raise Timeout(f"no result within {timeout}s") from None

    @staticmethod
    def _unwrap(outcome: object, kind: type[T]) -> T:
        if isinstance(outcome, BaseException):
            raise outcome
        assert isinstance(outcome, kind)
        return outcome


class Client:
    """The blocking twin of `AsyncClient`: same arguments, same methods, plain calls.

    It runs an AsyncClient on a private event loop in a daemon thread, so it works from any
    thread (including inside a running event loop's callbacks, though AsyncClient is nicer
    there) and keeps its connections open between calls. Update callbacks run on that thread.
    Call `close()` or use it as a context manager.
    """

    def __init__(self, servers: Iterable[str] = ("127.0.0.1:4730",), **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="jobwire-client", daemon=True
        )
        self._thread.start()
        servers = list(servers)

        async def make() -> AsyncClient:
            return AsyncClient(servers, **options)

        self._client = self._call(make())

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop.is_closed():
            coro.close()
            raise RuntimeError("client is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. KeyboardInterrupt: do not leave the request running
            raise

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._call(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    @property
    def servers(self) -> list[str]:
        return self._client.servers

    def submit(
        self,
        function: str,
        payload: Any = b"",
        *,
        unique: str | None = None,
        priority: Priority = "normal",
        timeout: float | None = None,
        on_data: DataCallback | None = None,
        on_warning: DataCallback | None = None,
        on_status: StatusCallback | None = None,
    ) -> bytes:
        """See `AsyncClient.submit`."""
        return self._call(
            self._client.submit(
                function,
                payload,
                unique=unique,
                priority=priority,
                timeout=timeout,
                on_data=on_data,
                on_warning=on_warning,
                on_status=on_status,
            )
        )

    def submit_background(
        self,
        function: str,
        payload: Any = b"",
        *,
        unique: str | None = None,
        priority: Priority = "normal",
    ) -> Handle:
        """See `AsyncClient.submit_background`."""
        return self._call(
            self._client.submit_background(function, payload, unique=unique, priority=priority)
        )

    def submit_many(
        self,
        function: str,
        payloads: Iterable[Any],
        *,
        background: bool = False,
        priority: Priority = "normal",
        timeout: float | None = None,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """See `AsyncClient.submit_many`."""
        return self._call(
            self._client.submit_many(
                function,
                list(payloads),
                background=background,  # type: ignore[call-overload]
                priority=priority,
                timeout=timeout,
                return_exceptions=return_exceptions,
            )
        )

    def stream(
        self,
        function: str,
        payload: Any = b"",
        *,
        unique: str | None = None,
        priority: Priority = "normal",
        timeout: float | None = None,
    ) -> Iterator[Update]:
        """See `AsyncClient.stream`; a plain iterator."""
        updates = self._client.stream(
            function, payload, unique=unique, priority=priority, timeout=timeout
        )

        async def step() -> Update | None:
            try:
                return await anext(updates)
            except StopAsyncIteration:
                return None

        try:
            while (update := self._call(step())) is not None:
                yield update
        finally:
            if not self._loop.is_closed():
                self._call(updates.aclose())

    def status(self, handle: str) -> JobStatus:
        """See `AsyncClient.status`."""
        return self._call(self._client.status(handle))

    def status_unique(self, unique: str) -> JobStatus:
        """See `AsyncClient.status_unique`."""
        return self._call(self._client.status_unique(unique))
