"""Gearman clients: `AsyncClient` (asyncio) and `Client` (the same API, blocking).

Reliability is the Lazy Pirate pattern (ZeroMQ guide ch. 4), applied per request: a server that
refuses the connection, drops it, or does not answer within `timeout` seconds has its connection
closed, and the request is sent again to the next server, up to `retries` more times (after every
full pass over the servers the client backs off, doubling from `backoff` up to `backoff_cap`);
then `ServerUnavailable` is raised.

Binary Star (ZeroMQ guide ch. 4): given `settle_delay`, the two `servers` are a primary/backup
pair (primary first). The client sends to one server and stays with it while it answers; when
it fails (a killed server refuses the connection, a passive one closes it at once), the client
waits `settle_delay` seconds (the Guide's 2 s: long enough for the backup to notice the
primary's silence and take over on the client's vote), switches to the other server and
resends the same request, as the Guide's `bstarcli` does; `retries` bounds the switches.

Delivery guarantee: **at least once** for retried submissions. A retry is sent when the client
cannot tell whether the server kept the job (no JOB_CREATED before the timeout, or a foreground
job's connection lost before its result), so a job may run more than once: make tasks
idempotent, or pass a `unique` key. Every submission carries a unique key (a random one unless you
give one), so a retry that reaches the *same* server while it still holds the job is coalesced
onto it instead of creating a second job; a retry on another server, or after the server lost its
queue, creates a new one. Each call either returns the result / handle or raises; note that
`ServerUnavailable` does not prove the job was not created (a server may have accepted it and
answered too late). Once a background job has its handle, the client's part is done:
whether it survives a server crash is up to the server (jobwire's SQLite store keeps it, gearmand
without a persistent queue does not).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Iterable, Iterator
from typing import Any, Literal, TypeVar, cast, overload

from jobwire.protocols.gearman import PacketType, encode_request
from jobwire.sdk.connection import format_address, parse_address
from jobwire.sdk.errors import NotAcknowledged, ServerUnavailable, Timeout
from jobwire.sdk.loops import CallerLoop
from jobwire.sdk.session import (
    _UNSET,
    DataCallback,
    Handle,
    JobStatus,
    Listener,
    Priority,
    Receipt,
    Request,
    Session,
    StatusCallback,
    Update,
    parse_int,
)
from jobwire.sdk.submit import ClientCore
from jobwire.sdk.tls import TLSOption, client_context

log = logging.getLogger("jobwire.sdk")

T = TypeVar("T")
P = PacketType
#: Background submissions a blocking `Client` keeps unacknowledged before `submit_background`
#: waits for the oldest (bounds its memory, as a Kafka producer's buffer does).
MAX_UNACKED = 10_000
#: Seconds a client busy-polls after a request or reply, by default: longer than a no-op job's
#: round trip, short beside a job that does real work.
BUSY_POLL = 200e-6


def _listener(background: bool) -> Listener | None:
    return None if background else Listener(None, None, None)


class AsyncClient(ClientCore):
    """Submit jobs to Gearman servers (jobwire or gearmand) from asyncio code.

    `servers`: "host[:port]" strings. `timeout`: seconds a server has to accept a connection or
    answer a request before the client gives up on it and retries on the next server, at most
    `retries` more times. `heartbeat`: while connected, a server that stays silent for three
    heartbeat intervals is presumed dead (so a foreground job on a hung server is retried rather
    than waited on forever). `busy_poll`: seconds the client keeps polling for replies, without
    sleeping, after each request or reply while it waits for one (it yields the CPU to any other
    process on each pass); on a virtual machine, where waking a sleeping process takes tens of
    microseconds, this takes that much off each round trip, for up to `busy_poll` of CPU time per
    request. 0 disables it. Safe to share between tasks of one event loop.

    `settle_delay`: the two servers are a Binary Star pair (primary first): stay with the
    server that answers; on failure wait `settle_delay` seconds (the Guide uses 2), then resend
    the same request to the other one. Give enough `retries` to outlast a failover.

    `tls`: connect over TLS (an `ssl.SSLContext`, a CA file, or (ca, cert, key) paths for
    mutual TLS); `token`: authenticate each connection with it (OPTION_REQ auth:TOKEN) for a
    server run with --auth. docs/security.md says more.

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
        busy_poll: float = BUSY_POLL,
        settle_delay: float | None = None,
        tls: TLSOption = None,
        token: str | None = None,
        max_unacked: int = MAX_UNACKED,
    ) -> None:
        addresses = [format_address(parse_address(server)) for server in servers]
        super().__init__(addresses, timeout, settle_delay)
        self.tls = client_context(tls)
        self.token = token
        if max_unacked < 1:
            raise ValueError("max_unacked must be at least 1")
        self.max_unacked = max_unacked
        if not self.servers:
            raise ValueError("no servers given")
        if settle_delay is not None and (settle_delay < 0 or len(self.servers) != 2):
            raise ValueError("settle_delay needs a Binary Star pair (two servers) and >= 0 s")
        if busy_poll < 0:
            raise ValueError("busy_poll must be 0 or more seconds")
        self.busy_poll = busy_poll
        self.retries = retries
        self.backoff = backoff
        self.backoff_cap = backoff_cap
        self.heartbeat = heartbeat
        self._opening: dict[int, asyncio.Task[Session]] = {}
        self._closed = False
        # Pipelined background submissions (receipts): how many are not settled for good, the
        # failed ones not reported by a flush yet, those waiting for a retry, and who waits.
        self._unacked = 0
        self._failed: list[Receipt] = []
        self._to_retry: list[Receipt] = []
        self._drained: asyncio.Future[None] | None = None
        self._room: asyncio.Future[None] | None = None
        self._drainer: asyncio.Future[None] | None = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, kind: object, *exc: object) -> None:
        await self.close(raise_unacknowledged=kind is None)

    async def close(self, *, raise_unacknowledged: bool = True) -> None:
        """Wait for every pipelined submission's acknowledgement (see `flush`), then close the
        connections; requests still in flight fail with ServerUnavailable. Raises
        NotAcknowledged after closing if any submission failed (with `raise_unacknowledged`
        false, as when leaving a `with` block on an exception, it logs them instead)."""
        failure: NotAcknowledged | None = None
        try:
            if not self._closed:
                await self.flush()
        except NotAcknowledged as exc:
            failure = exc
        finally:
            self._closed = True
            sessions, self._sessions = list(self._sessions.values()), {}
            await asyncio.gather(*(session.conn.close() for session in sessions))
        if failure is not None:
            if raise_unacknowledged:
                raise failure
            log.error("closing the client: %s", failure)

    async def flush(self) -> None:
        """Wait until every background submission sent without waiting
        (`submit_background_nowait`, the blocking `Client.submit_background`) is acknowledged
        (retried first where the client could not tell), then raise NotAcknowledged listing
        those that failed since the last flush. Once it returns, every one of them was
        acknowledged: on a durable server, every job is on disk."""
        while self._unacked:
            if self._drained is None or self._drained.done():
                self._drained = asyncio.get_running_loop().create_future()
            await self._drained
        failed, self._failed = self._failed, []
        if failed:
            failures = [(receipt, cast(BaseException, receipt.outcome)) for receipt in failed]
            raise NotAcknowledged(failures) from failures[0][1]

    @property
    def unacknowledged(self) -> int:
        """Background submissions sent without waiting whose acknowledgement is still due."""
        return self._unacked

    # ------------------------------------------------------------ submitting

    async def submit_background(
        self,
        function: str,
        payload: Any = b"",
        *,
        unique: str | None = None,
        priority: Priority = "normal",
    ) -> Handle:
        """Queue a job without waiting for it to run, and wait for the server's
        acknowledgement (JOB_CREATED: on a durable server, the job is on disk); returns its
        handle (see `status`). One round trip and one group commit per call: to submit many
        jobs, use `submit_background_nowait` + `flush`, `submit_many`, or concurrent calls."""
        request = self._request(function, payload, unique, priority, True, None)
        outcome = await self._execute([request], self._start(unique))
        return self._unwrap(outcome[0], Handle)

    def submit_background_nowait(
        self,
        function: str,
        payload: Any = b"",
        *,
        unique: str | None = None,
        priority: Priority = "normal",
    ) -> Receipt:
        """Send a background job without waiting for its acknowledgement; returns a `Receipt`
        (`await receipt` gives the handle). Submissions are pipelined on the connection, so
        many of them share the server's group commits; `flush()` (and `close()`, and leaving
        `async with`) waits for all of them and raises NotAcknowledged for any that failed. A
        submission the connection lost before its acknowledgement is retried as `submit_many`'s
        are (the same unique key, so the same server coalesces it). Jobs reach each server in
        the order they were sent, except retried ones."""
        return self._pipeline(function, payload, unique, priority, None, False)

    def _pipeline(
        self,
        function: str,
        payload: Any,
        unique: str | None,
        priority: Priority,
        waiter: Callable[[Receipt], None] | None,
        now: bool,
        start: int | None = None,
    ) -> Receipt:
        if self._closed:
            raise ServerUnavailable("the client is closed")
        request = self._request(function, payload, unique, priority, True, None)
        if start is None:
            start = self._start(unique)
        receipt = Receipt(request, start, self._settled, waiter)
        self._unacked += 1
        session = self._sessions.get(start % len(self.servers))
        if session is not None and session.alive and self._drainer is None:
            session.pipeline(receipt, now)
        else:  # not connected yet, or retries under way: queue behind them, in order
            self._retry(receipt)
        return receipt

    def _pipeline_now(
        self,
        function: str,
        payload: Any,
        unique: str | None,
        priority: Priority,
        waiter: Callable[[Receipt], None],
    ) -> Receipt | int | None:
        """`_submit_pipelined` when it would not wait (connected to the server it picks,
        nothing queued for retries, room in the window), without running the loop; else
        the server picked (to pass on to `_submit_pipelined`), or None if none was."""
        if self._closed or self._drainer is not None or self._unacked + 1 >= self.max_unacked:
            return None  # (the slow path waits for room after sending, to stay below the cap)
        start = self._start(unique)
        session = self._sessions.get(start % len(self.servers))
        if session is None or not session.alive:
            return start
        request = self._request(function, payload, unique, priority, True, None)
        receipt = Receipt(request, start, self._settled, waiter)
        session.pipeline(receipt, True)
        self._unacked += 1
        return receipt

    async def _submit_pipelined(
        self,
        function: str,
        payload: Any,
        unique: str | None,
        priority: Priority,
        waiter: Callable[[Receipt], None],
        start: int | None = None,
    ) -> Receipt:
        """The blocking Client's `submit_background`: written when it returns; waits only for
        room (`max_unacked`), a connection, or retries under way."""
        receipt = self._pipeline(function, payload, unique, priority, waiter, True, start)
        if self._drainer is not None:
            # Queued behind a connection being opened (the first call) or retries: this
            # loop runs only during calls, so see it written before returning.
            await asyncio.shield(self._drainer)
        while self._unacked >= self.max_unacked:
            if self._room is None or self._room.done():
                self._room = asyncio.get_running_loop().create_future()
            await self._room
        return receipt

    def _settled(self, receipt: Receipt) -> None:
        """A receipt's outcome came in: final, or a connection loss to retry (once through the
        Lazy Pirate loop)."""
        outcome = receipt.outcome
        if isinstance(outcome, ServerUnavailable) and not receipt.retried and not self._closed:
            receipt.outcome = _UNSET
            receipt.retried = True
            self._retry(receipt, sent=True)
            return
        self._unacked -= 1
        if isinstance(outcome, BaseException):
            self._failed.append(receipt)
        if not self._unacked and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        if self._room is not None and self._unacked < self.max_unacked and not self._room.done():
            self._room.set_result(None)

    def _retry(self, receipt: Receipt, sent: bool = False) -> None:
        """Send `receipt` through the retry loop, after those already queued for it."""
        if sent:
            receipt.retried = True
            receipt.start = ~receipt.start  # marks "the first attempt failed" for `_resend`
        self._to_retry.append(receipt)
        if self._drainer is None:
            self._drainer = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        """Resend what waits for the retry loop, in the order it was submitted, one group (of
        receipts for the same first server) at a time; new submissions queue behind it."""
        try:
            while self._to_retry:
                receipts, self._to_retry = self._to_retry, []
                groups: dict[int, list[Receipt]] = {}
                for receipt in receipts:
                    groups.setdefault(receipt.start, []).append(receipt)
                for start, group in groups.items():
                    await self._resend(start, group)
        finally:
            self._drainer = None

    async def _resend(self, start: int, receipts: list[Receipt]) -> None:
        """Send receipts not sent yet (`start` >= 0) once their server is connected, as any
        other; put those whose connection was lost (`start` < 0) through the Lazy Pirate loop,
        from the next server on, and settle them with what it ends with."""
        if start >= 0:
            sent = 0
            try:
                session = await self._session(start % len(self.servers))
                for receipt in receipts:
                    session.pipeline(receipt, True)
                    sent += 1
                return
            except ServerUnavailable:  # the first attempt failed: on to the loop
                receipts = receipts[sent:]  # those sent are settled by the connection's loss
        else:
            start = ~start
        for receipt in receipts:
            receipt.retried = True
            receipt.start = start
        requests = [receipt.request for receipt in receipts]
        first: list[object] = [ServerUnavailable("the first attempt failed")] * len(requests)
        outcomes: list[object]
        try:
            outcomes = await self._attempts(requests, start, first)
        except Exception as exc:
            outcomes = [exc] * len(requests)
        except BaseException as exc:  # cancelled: the loop is going away
            outcomes = [ServerUnavailable(f"submission abandoned: {exc!r}")] * len(requests)
            raise
        finally:
            for receipt, outcome in zip(receipts, outcomes, strict=True):
                receipt.settle(0, outcome)

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
        start = next(self._round_robin) if self.settle_delay is None else self._current
        outcomes = await self._with_deadline(self._execute(requests, start), timeout)
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

    async def status(self, handle: str | Receipt) -> JobStatus:
        """GET_STATUS. A `Handle` is asked of its own server; a plain string of every server.
        A `Receipt` is waited for first."""
        if isinstance(handle, Receipt):
            handle = await handle
        server = getattr(handle, "server", None)
        indexes = (
            [self.servers.index(server)] if server in self.servers else range(len(self.servers))
        )
        packets = await self._ask_all(
            indexes, encode_request(P.GET_STATUS, handle.encode()), P.STATUS_RES
        )
        for args in packets:
            if args[1] == b"1":
                return JobStatus(True, args[2] == b"1", parse_int(args[3]), parse_int(args[4]))
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
                return JobStatus(
                    True,
                    args[2] == b"1",
                    parse_int(args[3]),
                    parse_int(args[4]),
                    parse_int(args[5]),
                )
            clients += parse_int(args[5])
        return JobStatus(False, False, clients=clients)

    # ------------------------------------------------------------ internals

    async def _session(self, index: int) -> Session:
        if self._closed:
            raise ServerUnavailable("the client is closed")
        session = self._sessions.get(index)
        if session is not None and session.alive:
            return session
        # Concurrent callers share one connection attempt.
        opening = self._opening.get(index)
        if opening is None:
            opening = asyncio.ensure_future(
                Session.open(
                    self.servers[index],
                    self.timeout,
                    self.heartbeat,
                    self.busy_poll,
                    self.tls,
                    self.token,
                )
            )
            self._opening[index] = opening
            opening.add_done_callback(lambda _: self._opening.pop(index, None))
        session = await asyncio.shield(opening)
        self._sessions[index] = session
        return session

    async def _pause(self, attempt: int) -> None:
        """Back off after each full pass over the servers, not between servers; in a Binary
        Star pair, wait the settle delay before every switch."""
        if self.settle_delay is not None:
            await asyncio.sleep(self.settle_delay)
            return
        passes = attempt // len(self.servers)
        if attempt and attempt % len(self.servers) == 0:
            await asyncio.sleep(min(self.backoff * 2 ** (passes - 1), self.backoff_cap))

    async def _execute(self, requests: list[Request], start: int) -> list[object]:
        """Lazy Pirate: send what is unfinished to the next server until all is done.

        The first attempt on a server that is already connected, by far the usual case, runs
        here; the retry loop only when it is needed."""
        session = self._sessions.get(start % len(self.servers))
        if session is None or not session.alive:
            return await self._attempts(requests, start, [])
        outcomes = await session.run(requests, self.timeout)
        for outcome in outcomes:
            if isinstance(outcome, ServerUnavailable):
                return await self._attempts(requests, start, outcomes)
        return outcomes

    async def _attempts(
        self, requests: list[Request], start: int, first: list[object]
    ) -> list[object]:
        """The attempts after `first`, the outcomes of the first (empty: not made yet)."""
        error: ServerUnavailable | None = None
        if first:
            outcomes = first
            todo = [i for i, outcome in enumerate(first) if isinstance(outcome, ServerUnavailable)]
            if todo:  # what the first attempt met, should no retry follow (`retries=0`)
                error = cast(ServerUnavailable, first[todo[0]])
        else:
            outcomes = [None] * len(requests)
            todo = list(range(len(requests)))
        for attempt in range(1 if first else 0, self.retries + 1):
            if attempt:
                if self._closed:
                    raise ServerUnavailable("the client was closed")
                log.warning(
                    "%d job(s) not done on %s (%s); retrying",
                    len(todo),
                    self.servers[(start + attempt - 1) % len(self.servers)],
                    error,
                )
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
            if not retry:
                if self.settle_delay is not None:
                    self._current = index  # a pair: stay with the server that answered
                return outcomes
            todo = retry
        raise ServerUnavailable(f"gave up after {self.retries + 1} attempt(s): {error}")

    async def _ask(self, index: int, data: bytes, reply: PacketType) -> tuple[bytes, ...]:
        """One request to one server, reconnecting up to `retries` times."""
        error: ServerUnavailable | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(min(self.backoff * 2 ** (attempt - 1), self.backoff_cap))
            try:
                session = await self._session(index)
                return (await session.expect(data, reply)).args
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


#: The blocking Client's pipelined calls between two turns of its loop (which read the
#: acknowledgements that came meanwhile).
READ_EVERY = 32


async def _nothing() -> None:
    """One turn of the loop."""


class Client:
    """The blocking twin of `AsyncClient`: same arguments, same methods, plain calls.

    It runs an AsyncClient on a private event loop that each call runs in the calling thread
    (`CallerLoop`), so a call costs no hand-off to another thread, and it keeps its connections
    open between calls. It works from any thread, and from several at once (their calls share
    the connections); from inside a running event loop a call runs in a helper thread, though
    AsyncClient is nicer there. Update callbacks run in the thread running the loop: the
    caller's, or that of another call made at the same time. Call `close()` or use it as a
    context manager.
    """

    def __init__(self, servers: Iterable[str] = ("127.0.0.1:4730",), **options: Any) -> None:
        self._runner = CallerLoop()
        self._since_read = 0  # pipelined calls since the loop last ran
        servers = list(servers)

        async def make() -> AsyncClient:
            return AsyncClient(servers, **options)

        self._client = self._call(make())

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._runner.loop.is_closed():
            coro.close()
            raise RuntimeError("the Client is closed")
        return self._runner.run(coro)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        self._close(raise_unacknowledged=kind is None)

    def close(self) -> None:
        """`flush()`, then close the connections; raises NotAcknowledged (after closing) if a
        background submission failed. Leaving the `with` block does the same, but when it is
        left by an exception it logs the failures instead of raising over that exception."""
        self._close(raise_unacknowledged=True)

    def _close(self, raise_unacknowledged: bool) -> None:
        if self._runner.loop.is_closed():
            return
        try:
            self._call(self._client.close(raise_unacknowledged=raise_unacknowledged))
        finally:
            self._runner.close()

    def flush(self) -> None:
        """Wait until every `submit_background` so far is acknowledged by the server (on a
        durable server: on disk), then raise NotAcknowledged listing those that failed since
        the last flush (refused, e.g. a full queue, or no server answered within the retries).
        See `AsyncClient.flush`."""
        self._call(self._client.flush())

    @property
    def unacknowledged(self) -> int:
        """`submit_background` calls whose acknowledgement is still due."""
        return self._client.unacknowledged

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

    @overload
    def submit_background(
        self,
        function: str,
        payload: Any = b"",
        *,
        unique: str | None = None,
        priority: Priority = "normal",
        wait: Literal[False] = False,
    ) -> Receipt: ...

    @overload
    def submit_background(
        self,
        function: str,
        payload: Any = b"",
        *,
        unique: str | None = None,
        priority: Priority = "normal",
        wait: Literal[True],
    ) -> Handle: ...

    def submit_background(
        self,
        function: str,
        payload: Any = b"",
        *,
        unique: str | None = None,
        priority: Priority = "normal",
        wait: bool = False,
    ) -> Receipt | Handle:
        """Queue a job without waiting for it to run.

        By default the request is written at once and the call returns a `Receipt` without
        waiting for the server's acknowledgement: a plain loop of calls is pipelined on the
        connection (and shares the server's group commits). `flush()`, `close()` and leaving
        the `with` block wait for every acknowledgement and raise NotAcknowledged for any
        submission that failed; `receipt.result()` (or `.server`, `str(receipt)`) waits for
        that one's handle. At most `max_unacked` (10,000) are outstanding: past that the call
        waits for the oldest.

        `wait=True`: the blocking call: wait for this job's own acknowledgement (one round
        trip and one group commit) and return its `Handle`, raising if it failed.
        """
        if wait:
            return self._call(
                self._client.submit_background(function, payload, unique=unique, priority=priority)
            )
        client = self._client
        if self._runner.try_hold():
            # The common case, connected and nothing queued: write the request without a
            # turn of the loop (which costs more than the rest of the call); every
            # READ_EVERY calls, one turn reads the acknowledgements that came meanwhile.
            try:
                sent = client._pipeline_now(function, payload, unique, priority, self._wait_for)
            finally:
                self._runner.release()
            if isinstance(sent, Receipt):
                self._since_read += 1
                if self._since_read >= READ_EVERY:
                    self._since_read = 0
                    self._call(_nothing())
                return sent
            start = sent
        else:
            start = None
        self._since_read = 0
        return self._call(
            client._submit_pipelined(function, payload, unique, priority, self._wait_for, start)
        )

    def _wait_for(self, receipt: Receipt) -> None:
        """Run the loop until `receipt` is settled (its outcome is the caller's to read)."""

        async def settled() -> None:
            with contextlib.suppress(Exception):
                await receipt

        self._call(settled())

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
            if not self._runner.loop.is_closed():
                self._call(updates.aclose())

    def status(self, handle: str | Receipt) -> JobStatus:
        """See `AsyncClient.status`."""
        return self._call(self._client.status(handle))

    def status_unique(self, unique: str) -> JobStatus:
        """See `AsyncClient.status_unique`."""
        return self._call(self._client.status_unique(unique))
