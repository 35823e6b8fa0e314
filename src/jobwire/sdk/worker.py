"""The Gearman worker: runs tasks for jobs from every server it is given.

Shape (many-to-many): one connection per server, one shared budget of `concurrency` job slots.
A connection only sends GRAB_JOB_UNIQ while a slot is free (a GRAB in flight reserves one), so the
worker never holds more than `concurrency` jobs. Grabs are pipelined: after a wake-up (connect,
NOOP) a connection sends one GRAB; once a GRAB brings a job, the server evidently has work, and
the connection keeps a GRAB in flight for every free slot. Each GRAB is answered (JOB_ASSIGN or
NO_JOB); when the last one in flight came back NO_JOB the connection sends PRE_SLEEP and waits for
the server's NOOP. It never polls. A NOOP that arrives while all slots are busy is remembered and
acted on when a slot frees. Results and the GRABs that follow them go out in one write per read
or loop turn (or per few results, when a read brought many jobs).

A worker with a single server asks it for the `grab-waits` option (OPTION_REQ; gearmand answers
UNKNOWN_OPTION and nothing changes): jobwire then holds a GRAB that finds no job and answers it
when a job comes, so the worker keeps a GRAB in flight for every free slot and never sleeps, and
a new job reaches it without the NOOP and GRAB round trip. Not with several servers: a held GRAB
reserves a slot that another server's jobs could use.

Reliability (Paranoid Pirate, ZeroMQ guide ch. 4): every connection heartbeats (see
`connection.py`); a connection that drops or stops answering is reopened after an exponential
backoff (`reconnect_base` doubling up to `reconnect_cap`, reset once a connection works) and the
abilities are registered again. A job whose connection died while it ran still finishes, but its
result cannot be delivered: the server has requeued the job, which will run again (at least once).

Binary Star pairs: list both servers; the worker connects to both. The passive one closes each
connection at once, so that link keeps reconnecting, and its backoff would grow to
`reconnect_cap`; `settle_delay` (the Guide's 2 s) caps it, so the worker is serving on the
backup about a settle delay after it takes over.

Lifecycle (Open Job Spec worker protocol): running -> quiet -> terminate -> terminated.
SIGTERM/SIGINT: quiet, wait up to `grace_period` for running jobs, WORK_FAIL the rest, exit.
SIGTSTP: quiet; SIGCONT: running again. A quiet worker also sends RESET_ABILITIES on each
connection once it holds no job from it, so servers stop counting it (admin `status`) and stop
waking it instead of a worker that would take the job. Not earlier: gearmand requeues the jobs a
connection holds when it resets its abilities, and would run them twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import os
import socket
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from mypy_extensions import mypyc_attr

from jobwire.protocols.gearman import Packet, PacketType, encode_request
from jobwire.sdk.connection import Connection, format_address, parse_address
from jobwire.sdk.errors import JobFailed, ServerUnavailable
from jobwire.sdk.lifecycle import Lifecycle, _task
from jobwire.sdk.lifecycle import WorkerState as WorkerState
from jobwire.sdk.payload import to_bytes
from jobwire.sdk.slots import SlotPool
from jobwire.sdk.tasks import Task, check_timeout, decorator, invoke, is_async
from jobwire.sdk.tls import TLSOption, client_context

log = logging.getLogger("jobwire.sdk.worker")

P = PacketType
F = TypeVar("F", bound=Callable[..., Any])

# The packet types a job's path compares with, as plain names: `P.X` goes through the enum
# class's `__getattr__` hook, several times slower than a module global, several times a job.
_JOB_ASSIGN = P.JOB_ASSIGN
_JOB_ASSIGN_UNIQ = P.JOB_ASSIGN_UNIQ
_NO_JOB = P.NO_JOB
_NOOP = P.NOOP
_WORK_COMPLETE = P.WORK_COMPLETE
_GRAB = encode_request(P.GRAB_JOB_UNIQ)
_RUNNING = WorkerState.RUNNING  # the same hook: checked twice a job
_ENDING = (WorkerState.TERMINATE, WorkerState.TERMINATED)
_PRE_SLEEP = encode_request(P.PRE_SLEEP)
_RESET = encode_request(P.RESET_ABILITIES)
_GRAB_WAITS = b"grab-waits"
_ASK_GRAB_WAITS = encode_request(P.OPTION_REQ, _GRAB_WAITS)
#: Jobs run on long-lived slot tasks (`slots.py`) where a Task costs more than a no-op job;
#: from Python 3.12 a Task per job, started eagerly (`lifecycle._task`), costs less.
_USE_SLOTS = sys.version_info < (3, 12)


def server_timeout_ms(timeout: float) -> int:
    """CAN_DO_TIMEOUT for a task with a local `timeout`.

    The worker enforces the timeout itself (WORK_FAIL). The server's copy is only a backstop for
    a worker that hangs as a whole, and servers *requeue* on expiry, so it is set later than the
    local one: the local WORK_FAIL must win. gearmand's minimum is one second.
    """
    return max(1000, math.ceil((timeout + max(2.0, timeout / 2)) * 1000))


class Job:
    """One job handed to a task.

    `payload` is bytes (`text` and `json()` decode it). `send_status`, `send_data` and
    `send_warning` reach the waiting client; they are plain methods, safe to call from an async
    task or from a thread task, and do nothing once the job has ended (e.g. timed out).
    """

    __slots__ = (
        "_conn",
        "_finished",
        "_loop",
        "_owner",
        "function",
        "handle",
        "payload",
        "unique",
    )

    def __init__(
        self,
        handle: str,
        function: str,
        unique: str,
        payload: bytes,
        conn: Connection,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.handle = handle
        self.function = function
        self.unique = unique
        self.payload = payload
        self._conn = conn
        self._loop = loop
        self._owner = threading.get_ident()
        self._finished = False

    def __repr__(self) -> str:
        return f"<Job {self.handle} {self.function}>"

    @property
    def text(self) -> str:
        return self.payload.decode("utf-8")

    def json(self) -> Any:
        return json.loads(self.payload)

    def send_status(self, numerator: int, denominator: int) -> None:
        """Progress, e.g. send_status(3, 10)."""
        self._emit(P.WORK_STATUS, str(int(numerator)).encode(), str(int(denominator)).encode())

    def send_data(self, data: Any) -> None:
        """A partial result (payload rule applies)."""
        self._emit(P.WORK_DATA, to_bytes(data))

    def send_warning(self, data: Any) -> None:
        self._emit(P.WORK_WARNING, to_bytes(data))

    def _emit(self, ptype: PacketType, *args: bytes) -> None:
        packet = encode_request(ptype, self.handle.encode(), *args)
        if threading.get_ident() == self._owner:
            self._write(packet)
            return
        # From a task's thread: hop onto the loop. Callbacks run in order, so updates still go
        # out before the result, which also reaches the loop through call_soon_threadsafe.
        with contextlib.suppress(RuntimeError):  # the loop is closed: the worker has exited
            self._loop.call_soon_threadsafe(self._write, packet)

    def _write(self, packet: bytes) -> None:
        if self._finished:
            return
        if not self._conn.is_open:
            log.debug("dropping an update of %s: its connection is gone", self.handle)
            return
        self._conn.send(packet)

    def _finish(self, packet: bytes) -> None:
        """Send the final packet(s) once; later updates and results are dropped."""
        if self._finished:
            return
        if not self._conn.is_open:
            log.warning(
                "result of job %s dropped: connection to %s was lost; the server runs it again",
                self.handle,
                self._conn.name,
            )
        else:
            self._conn.send_batched(packet)
        self._finished = True


class _Link:
    """The worker's connection to one server and where it is in the grab/sleep cycle."""

    def __init__(self, address: str) -> None:
        self.address = parse_address(address)
        self.name = format_address(self.address)
        self.conn: Connection | None = None
        self.grabs = 0  # GRABs in flight (each reserves a slot)
        self.wants_grab = False  # the server may have work for us (just connected, or NOOP)
        self.hot = False  # the last GRAB answered brought a job: keep every free slot grabbing
        self.grab_waits = False  # the server holds GRABs until it has a job (jobwire)
        self.registered = False  # abilities sent on this connection

    @property
    def ready(self) -> bool:
        return self.conn is not None and self.conn.is_open


def _debug() -> bool:
    return log.isEnabledFor(logging.DEBUG)


def _describe(exc: BaseException) -> bytes:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text.encode("utf-8", "replace")


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled; users may subclass it
class Worker(Lifecycle[Job]):
    """Runs tasks for Gearman jobs from every server in `servers`.

    `concurrency`: most jobs held at once across all servers. `grace_period`: seconds a
    graceful stop waits for running jobs before failing them. `heartbeat`: seconds between
    liveness checks of each server (dead after three silent ones). `reconnect_base` /
    `reconnect_cap`: the reconnect backoff, doubling. `settle_delay`: the servers include a
    Binary Star pair, and the backoff never exceeds it (see the module docstring).
    `client_id`: shown by the admin `workers` command (default host:pid). `tls` and
    `token`: as AsyncClient's (docs/security.md).

        worker = Worker(["127.0.0.1:4730"], concurrency=4)

        @worker.task("resize", timeout=60)
        async def resize(job: Job) -> bytes: ...

        worker.run()

    `async def` tasks run on the worker's event loop (they must not block it); plain functions
    each run in their own daemon thread, so a task that blocks forever costs only its thread, and
    cannot keep the process from exiting. A task's return value is the result (payload rule);
    raising `JobFailed` fails the job quietly, any other exception sends WORK_EXCEPTION (type and
    message) then WORK_FAIL. A task past its `timeout` is failed: an async one is cancelled, a
    thread one is abandoned (Python cannot stop a thread) and its eventual result dropped.
    """

    _log = log

    def __init__(
        self,
        servers: Iterable[str] = ("127.0.0.1:4730",),
        *,
        concurrency: int = 10,
        grace_period: float = 25.0,
        heartbeat: float = 5.0,
        reconnect_base: float = 1.0,
        reconnect_cap: float = 32.0,
        connect_timeout: float = 10.0,
        client_id: str | None = None,
        settle_delay: float | None = None,
        tls: TLSOption = None,
        token: str | None = None,
    ) -> None:
        self.tls = client_context(tls)
        self.token = token
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if settle_delay is not None:
            if settle_delay <= 0:
                raise ValueError("settle_delay must be more than 0 s")
            # A Binary Star pair: retry the passive server at least every settle delay.
            reconnect_cap = min(reconnect_cap, settle_delay)
            reconnect_base = min(reconnect_base, reconnect_cap)
        self.settle_delay = settle_delay
        super().__init__(grace_period)
        self.servers = list(servers)
        self.concurrency = concurrency
        self.heartbeat = heartbeat
        self.reconnect_base = reconnect_base
        self.reconnect_cap = reconnect_cap
        self.connect_timeout = connect_timeout
        self.client_id = client_id or f"{socket.gethostname()}:{os.getpid()}"
        self.tasks: dict[str, Task[Job]] = {}
        # Results (and the GRABs after them) per write: a quarter of the slots' worth, so that
        # a server is never idle while this worker finishes the rest of a wave of jobs.
        self._batch = max(2, concurrency // 2)
        self._links: list[_Link] = []
        self._next_link = 0
        self._slots: SlotPool | None = None

    # ------------------------------------------------------------ tasks

    def task(self, name: str, *, timeout: float | None = None) -> Callable[[F], F]:
        """Decorator: run the function for jobs of `name`. Register tasks before `run`."""
        return decorator(lambda func: self.add_task(name, func, timeout=timeout))

    def add_task(
        self, name: str, func: Callable[[Job], Any], *, timeout: float | None = None
    ) -> None:
        if not name or "\0" in name:
            raise ValueError("task names must be non-empty and contain no NUL")
        check_timeout(timeout)
        self.tasks[name] = Task(name, func, timeout, is_async(func))

    # ------------------------------------------------------------ running

    async def serve(self) -> None:
        """Serve until `stop()`; then quiet, wait out the grace period, fail the rest, return."""
        if not self.tasks:
            raise ValueError("the worker has no tasks")
        if not self.servers:
            raise ValueError("the worker has no servers")
        self._begin()
        assert self._stop is not None and self._loop is not None
        if _USE_SLOTS:
            self._slots = SlotPool(self._loop, self._ending)
        self._links = [_Link(server) for server in self.servers]
        maintainers = [asyncio.create_task(self._maintain(link)) for link in self._links]
        if self._stop_early:
            self._stop_early = False
            self._stop.set()
        await self._until_stopped(lambda: self._shutdown(maintainers))

    # ------------------------------------------------------------ lifecycle

    def _ending(self) -> bool:
        return self.state in _ENDING

    def _quieted(self) -> None:
        self._unregister_idle()

    def _unregister_idle(self) -> None:
        """Quiet: drop the abilities of connections that hold no job and await no grab."""
        busy = {job._conn for job in self._running}
        for link in self._links:
            # A grab-waits server (jobwire) answers held GRABs on RESET_ABILITIES and keeps the
            # jobs a worker holds; gearmand would requeue them, so wait for those to finish.
            idle = link.grab_waits or (not link.grabs and link.conn not in busy)
            if link.registered and link.ready and idle:
                assert link.conn is not None
                link.conn.send(_RESET)
                link.registered = False

    def _resumed(self) -> None:
        for link in self._links:
            if link.ready:
                assert link.conn is not None
                if not link.registered:
                    link.conn.send(self._abilities())
                    link.registered = True
                link.wants_grab = True
        self._dispatch()

    async def _shutdown(self, maintainers: list[asyncio.Task[None]]) -> None:
        await self._wind_down(
            lambda job: job._finish(encode_request(P.WORK_FAIL, job.handle.encode())), "failing"
        )
        if self._slots is not None:
            await self._slots.close()
            self._slots = None
        for maintainer in maintainers:
            maintainer.cancel()
        await asyncio.gather(*maintainers, return_exceptions=True)
        # Close politely, so the WORK_FAILs just written reach the servers.
        await asyncio.gather(*(link.conn.close() for link in self._links if link.conn))
        self.state = WorkerState.TERMINATED
        log.info("stopped")

    # ------------------------------------------------------------ connections

    def _abilities(self) -> bytes:
        return b"".join(
            encode_request(P.CAN_DO, task.name.encode())
            if task.timeout is None
            else encode_request(
                P.CAN_DO_TIMEOUT, task.name.encode(), str(server_timeout_ms(task.timeout)).encode()
            )
            for task in self.tasks.values()
        )

    async def _maintain(self, link: _Link) -> None:
        """Keep `link` connected and registered: Paranoid Pirate reconnects with backoff."""
        delay = self.reconnect_base
        while True:
            try:
                conn = await Connection.open(
                    link.address,
                    functools.partial(self._on_packet, link),
                    timeout=self.connect_timeout,
                    heartbeat=self.heartbeat,
                    after_read=self._settle,  # after every read: grab for what is free
                    batch=self._batch,
                    tls=self.tls,
                    token=self.token,
                )
            except ServerUnavailable as exc:
                log.info("%s; retrying in %.2gs", exc, delay)
            else:
                link.conn, link.grabs, link.wants_grab, link.hot = conn, 0, True, False
                link.grab_waits = False
                hello = encode_request(P.SET_CLIENT_ID, self.client_id.encode())
                if len(self._links) == 1:
                    hello += _ASK_GRAB_WAITS
                link.registered = self.state is WorkerState.RUNNING
                if link.registered:
                    hello += self._abilities()
                conn.send(hello)
                log.info("connected to %s", link.name)
                self._dispatch()
                await asyncio.shield(conn.closed)  # cancelling us must not cancel `closed`
                link.grabs = 0
                link.wants_grab = link.hot = link.registered = False
                self._dispatch()  # the slots its GRABs reserved may be usable elsewhere
                if conn.heard_anything:
                    delay = self.reconnect_base  # it worked for a while: start over
                log.warning("lost %s (%s); reconnecting in %.2gs", link.name, conn.error, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.reconnect_cap)

    def _on_packet(self, link: _Link, packet: Packet) -> None:
        """One packet of a read; the connection calls `_settle` once the read is handled."""
        kind = packet.type
        if kind in (_JOB_ASSIGN_UNIQ, _JOB_ASSIGN):
            link.grabs -= 1
            link.wants_grab = link.hot = True  # the server has work: grab for every free slot
            args = packet.args
            unique = args[2] if kind == _JOB_ASSIGN_UNIQ else b""
            self._start(link, args[0], args[1], unique, args[-1])
        elif kind == _NO_JOB:
            link.grabs = max(0, link.grabs - 1)
            link.wants_grab = link.hot = False  # later news than any NOOP or job before it
            # Sleep only once every GRAB is answered: one still in flight may bring a job.
            if not link.grabs and self.state is _RUNNING:
                assert link.conn is not None
                link.conn.send(_PRE_SLEEP)
        elif kind == _NOOP:
            link.wants_grab = True
        elif kind == P.OPTION_RES and packet.args[0] == _GRAB_WAITS:
            link.grab_waits = link.wants_grab = link.hot = True
        elif kind == P.ERROR:
            code, text = (arg.decode("utf-8", "replace") for arg in packet.args)
            if code == "UNKNOWN_OPTION":  # a server without grab-waits (gearmand)
                log.debug("%s does not hold GRABs; sleeping and waking as usual", link.name)
                return
            # JOB_NOT_FOUND answers the WORK_FAIL we send after WORK_EXCEPTION (the server had
            # already ended the job) or a result for a job the server took back (timeout).
            level = logging.DEBUG if code == "JOB_NOT_FOUND" else logging.WARNING
            log.log(level, "%s: ERROR %s %s", link.name, code, text)
        else:
            log.debug("%s: ignoring %r", link.name, packet)

    def _settle(self) -> None:
        """After any change in jobs or grabs: grab if running, else unregister what is idle."""
        if self.state is not _RUNNING:
            self._unregister_idle()
            return
        links = self._links
        if len(links) == 1:  # `_dispatch` for the usual shape, inlined: this runs twice a job
            link = links[0]
            free = self.concurrency - len(self._running) - link.grabs
            if free > 0 and link.wants_grab and (link.hot or not link.grabs) and link.ready:
                assert link.conn is not None
                count = free if link.hot else 1
                link.conn.send(_GRAB * count)
                link.grabs += count
            return
        self._dispatch()

    def _dispatch(self) -> None:
        """Grab on servers that may have work, while slots are free, one GRAB per server and
        round (rotating for fairness); a hot server gets more rounds, a cold one a single probe.
        The GRABs are queued, not written: they go out with this turn's results."""
        if self.state is not _RUNNING:
            return
        links = self._links
        if len(links) == 1:  # the usual shape, and this runs after every job: no rounds
            link = links[0]
            free = self.concurrency - len(self._running) - link.grabs
            if free > 0 and link.wants_grab and (link.hot or not link.grabs) and link.ready:
                assert link.conn is not None
                count = free if link.hot else 1
                link.conn.send(_GRAB * count)
                link.grabs += count
            return
        free = self.concurrency - len(self._running) - sum(lk.grabs for lk in links)
        count = len(links)
        granted = True
        while free > 0 and granted:
            granted = False
            start = self._next_link
            for step in range(count):
                index = (start + step) % count
                link = links[index]
                if link.wants_grab and (link.hot or not link.grabs) and link.ready:
                    assert link.conn is not None
                    link.conn.send(_GRAB)
                    link.grabs += 1
                    self._next_link = (index + 1) % count
                    granted = True
                    free -= 1
                    if not free:
                        return

    # ------------------------------------------------------------ jobs

    def _start(
        self, link: _Link, handle: bytes, function: bytes, unique: bytes, payload: bytes
    ) -> None:
        assert link.conn is not None and self._loop is not None
        if self.state in _ENDING:
            # Too late to run it: closing the connection hands it back to the server.
            log.info("not starting job %s: shutting down", handle.decode("utf-8", "replace"))
            return
        job = Job(
            handle.decode("utf-8", "surrogateescape"),
            function.decode("utf-8", "surrogateescape"),
            unique.decode("utf-8", "surrogateescape"),
            payload,
            link.conn,
            self._loop,
        )
        task = self.tasks.get(job.function)
        if task is None:  # the server sent a function we never registered
            log.warning("no task for %s; failing job %s", job.function, job.handle)
            job._finish(encode_request(P.WORK_FAIL, handle))
            return
        if task.timeout is None and task.is_async:
            work = self._run_async(job, handle, task)
        else:
            work = self._run_guarded(job, handle, task)
        if self._slots is not None:
            slot = self._slots.take()
            assert slot.task is not None
            self._running[job] = slot.task
            if not self._slots.start(slot, work):
                return  # its first step ran: what it sent goes out with this read's output
        else:  # `_launch`, inlined: this runs once a job
            started = _task(self._loop, work)
            if started.done():
                return
            self._running[job] = started
        # Its first step runs in the next loop turn. A flush queued now runs in that turn
        # too, behind the step: a job that ends in its first step has its result written
        # then, not from a flush that step would queue for the turn after.
        link.conn.flush_later()

    def _job_ended(self) -> None:
        self._settle()

    async def _run_async(self, job: Job, handle: bytes, task: Task[Job]) -> None:
        """The common case, kept lean: an async task without a timeout."""
        try:
            result = await task.func(job)
            if type(result) is not bytes:
                result = to_bytes(result)
        except BaseException as exc:
            self._failed(job, handle, exc, timed_out=False)
            if isinstance(exc, asyncio.CancelledError):
                raise
        else:
            # `job._finish`, inlined for the usual case.
            conn = job._conn
            if not job._finished and conn.is_open:
                conn.send_batched(encode_request(_WORK_COMPLETE, handle, result))
                job._finished = True
            else:
                job._finish(encode_request(_WORK_COMPLETE, handle, result))
        finally:
            # `_ended(job)`, inlined.
            self._running.pop(job, None)
            if self._gone is not None:
                self._job_gone()
            self._settle()

    async def _run_guarded(self, job: Job, handle: bytes, task: Task[Job]) -> None:
        """A thread task, or one with a timeout."""
        if _debug():
            log.debug("job %s (%s) started", job.handle, job.function)
        timer = asyncio.timeout(task.timeout)
        try:
            async with timer:
                result = await invoke(task, job, to_bytes, f"jobwire-{job.handle}")
        except BaseException as exc:
            self._failed(job, handle, exc, timed_out=timer.expired())
            if isinstance(exc, asyncio.CancelledError):
                raise
        else:
            job._finish(encode_request(_WORK_COMPLETE, handle, result))
            if _debug():
                log.debug("job %s (%s) done", job.handle, job.function)
        finally:
            self._ended(job)

    @staticmethod
    def _failed(job: Job, handle: bytes, exc: BaseException, *, timed_out: bool) -> None:
        if isinstance(exc, asyncio.CancelledError):
            if not job._finished:  # cancelled from outside, not by terminate: still answer
                job._finish(encode_request(P.WORK_FAIL, handle))
        elif isinstance(exc, JobFailed):
            job._finish(encode_request(P.WORK_FAIL, handle))
        elif timed_out:
            log.warning("job %s (%s) timed out", job.handle, job.function)
            job._finish(encode_request(P.WORK_FAIL, handle))
        else:  # even SystemExit from a task must not end the worker
            log.exception("job %s (%s) raised", job.handle, job.function)
            # Servers that end the job on WORK_EXCEPTION answer the WORK_FAIL with ERROR
            # JOB_NOT_FOUND (ignored); the WORK_FAIL is for those that do not.
            job._finish(
                encode_request(P.WORK_EXCEPTION, handle, _describe(exc))
                + encode_request(P.WORK_FAIL, handle)
            )
