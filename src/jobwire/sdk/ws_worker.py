"""A worker for the Rota protocol: jobs pushed over jobwire's `/work` WebSocket.

The task API is the Gearman `Worker`'s (`@worker.task(name, timeout=...)`, async or plain
functions, return value = result, `JobFailed` or any exception = failure), with a Rota job
(`jobwire.sdk.ws_job.RotaJob`) in place of the Gearman one. Each task names the job spec it
implements (`spec=`: a dict or a JSON file; default `{"name": <task name>}`); the server only
assigns jobs of specs whose registered checksum matches.

Protocol (docs/rota.md): the first heartbeat registers (host, OS, pid, queues, specs); then a
heartbeat goes out every `heartbeat` seconds (at most a third of the server's timeout) with
`wants` = `concurrency` while running (0 when quiet), CPU and RAM use, and what piled up:
progress, logs, results. Results and alerts go out at once, and so does a batch of updates
that grew past `batch_bytes`. The server never assigns more than `wants` jobs in all.

Reliability: a dropped connection is reopened with exponential backoff (`reconnect_base`
doubling up to `reconnect_cap`, reset once a connection was welcomed), as the Gearman
`Worker` does. A server that says nothing for `server_timeout` seconds (default: the larger of
its `heartbeat_timeout` and three of its `beat_interval`s) is gone too: the worker registers
with revision 2, so the server sends a `beat` whenever it has nothing else to say. Jobs that
ran on the old connection still finish, but their results are dropped: the server already
gave those jobs back to the queue.

Lifecycle as the Gearman worker: SIGTERM/SIGINT quiet the worker (wants 0), wait up to
`grace_period` for running jobs, then fail the rest as retryable and exit; SIGTSTP/SIGCONT
make it quiet and running again. The server's `state` messages (an operator's `jobwire
worker-state rota:N ...`) do the same: `quiet` as SIGTSTP, `running` as SIGCONT, `terminate`
as SIGTERM. Before it exits, the worker sends the results it still has and waits (up to
`connect_timeout`) for the server's answer to them: their `ack`, so they are durable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from jobwire.protocols.rota import (
    ALERT_LEVELS,
    REVISION,
    Ack,
    Alert,
    Assignment,
    ErrorMessage,
    Failure,
    Heartbeat,
    LogBatch,
    Progress,
    Registration,
    Result,
    Revoke,
    RotaError,
    SetState,
    SpecRef,
    SpecsChanged,
    Status,
    Welcome,
    checksum,
    decode_server_message,
    encode,
    load_spec,
    validate_spec,
)
from jobwire.sdk.lifecycle import Lifecycle, WorkerState
from jobwire.sdk.tasks import Task, check_timeout, decorator, invoke, is_async
from jobwire.sdk.tls import TLSOption, bearer_header, client_context
from jobwire.sdk.ws_job import RotaJob, failure, success

log = logging.getLogger("jobwire.sdk.ws_worker")

F = TypeVar("F", bound=Callable[..., Any])
SpecSource = dict[str, Any] | str | Path | None


@dataclass(frozen=True, slots=True)
class _Task(Task[RotaJob]):
    spec: dict[str, Any]
    checksum: str


def _load_spec(name: str, spec: SpecSource) -> dict[str, Any]:
    if spec is None:
        return {"name": name}
    if isinstance(spec, str | Path):
        loaded = load_spec(Path(spec).read_bytes())
    else:
        validate_spec(spec)
        loaded = spec
    if loaded["name"] != name:
        raise ValueError(f"task {name!r} names spec {loaded['name']!r}; they must match")
    return loaded


def _rss() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class RotaWorker(Lifecycle[RotaJob]):
    """Runs tasks for jobs pushed by a jobwire server over its `/work` WebSocket.

    worker = RotaWorker("http://127.0.0.1:8080", concurrency=4)

    `tls` (an `ssl.SSLContext`, a CA file, or (ca, cert, key) paths) for a wss:// or https://
    server, `token` for one run with --auth (sent as Authorization: Bearer).

    @worker.task("resize", spec="specs/resize.json", timeout=60)
    async def resize(job: RotaJob) -> dict: ...

    worker.run()
    """

    _log = log

    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        *,
        concurrency: int = 10,
        queues: list[str] | None = None,
        grace_period: float = 25.0,
        heartbeat: float = 1.0,
        reconnect_base: float = 1.0,
        reconnect_cap: float = 32.0,
        connect_timeout: float = 10.0,
        batch_bytes: int = 64 * 1024,
        hostname: str | None = None,
        server_timeout: float | None = None,
        tls: TLSOption = None,
        token: str | None = None,
    ) -> None:
        self.tls = client_context(tls)
        self.token = token
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        super().__init__(grace_period)
        self.url = url.rstrip("/") + ("" if url.rstrip("/").endswith("/work") else "/work")
        self.concurrency = concurrency
        self.queues = queues
        self.heartbeat = heartbeat
        self.reconnect_base = reconnect_base
        self.reconnect_cap = reconnect_cap
        self.connect_timeout = connect_timeout
        self.batch_bytes = batch_bytes
        self.hostname = hostname or socket.gethostname()
        #: Seconds of silence after which the server is taken for gone; None: from the welcome.
        self.server_timeout = server_timeout
        self.tasks: dict[str, _Task] = {}
        #: The server's id for this worker and its verdict on each spec (from the welcome).
        self.worker_id: str | None = None
        self.specs_accepted: dict[str, bool] = {}
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._generation = 0
        self._interval = heartbeat
        self._job_generation: dict[str, int] = {}
        self._progress: dict[str, tuple[int, int]] = {}
        self._logs: dict[str, list[str]] = {}
        self._alerts: list[Alert] = []
        self._results: list[Result] = []
        self._batched = 0  # rough bytes of status waiting for the next heartbeat
        self._seq = 0
        #: Heartbeats whose results the server has not answered yet: seq -> results left.
        self._unanswered: dict[int, int] = {}
        self._answered: asyncio.Event | None = None
        #: Seconds of server silence that end the connection (None: no limit), per connection.
        self._silence_limit: float | None = None
        #: Connections the server welcomed, and those given up because it went silent.
        self.registrations = 0
        self.server_silences = 0
        self._wake: asyncio.Event | None = None
        self._sampled = (time.monotonic(), time.process_time())

    # ------------------------------------------------------------ tasks

    def task(
        self, name: str, *, timeout: float | None = None, spec: SpecSource = None
    ) -> Callable[[F], F]:
        """Decorator: run the function for jobs of spec `name`. Register tasks before `run`."""
        return decorator(lambda func: self.add_task(name, func, timeout=timeout, spec=spec))

    def add_task(
        self,
        name: str,
        func: Callable[[RotaJob], Any],
        *,
        timeout: float | None = None,
        spec: SpecSource = None,
    ) -> None:
        check_timeout(timeout)
        document = _load_spec(name, spec)
        self.tasks[name] = _Task(
            name,
            func,
            timeout,
            is_async(func),
            document,
            checksum(document),
        )

    # ------------------------------------------------------------ running

    async def serve(self) -> None:
        """Serve until `stop()`; then quiet, wait out the grace period, fail the rest, return."""
        if not self.tasks:
            raise ValueError("the worker has no tasks")
        self._wake = asyncio.Event()
        self._answered = asyncio.Event()
        self._begin()
        assert self._stop is not None
        maintainer = asyncio.create_task(self._maintain(), name="rota worker connection")
        if self._stop_early:
            self._stop.set()
        await self._until_stopped(lambda: self._shutdown(maintainer))

    def _from_any_thread(self, action: Callable[[], None]) -> None:
        # Unlike the Gearman worker's: a stop once the loop has closed also counts for later.
        loop = self._loop
        if loop is None or loop.is_closed():
            if action == self._request_stop:
                self._stop_early = True
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(action)

    # ------------------------------------------------------------ lifecycle

    def _quieted(self) -> None:
        self._flush_soon()

    def _resumed(self) -> None:
        self._flush_soon()

    async def _shutdown(self, maintainer: asyncio.Task[None]) -> None:
        await self._wind_down(
            lambda job: self._finish(
                job, Failure(job.handle, "worker_shutdown", "stopped", retryable=True)
            ),
            "giving back",
        )
        await self._last_results()
        maintainer.cancel()
        await asyncio.gather(maintainer, return_exceptions=True)
        self.state = WorkerState.TERMINATED
        log.info("stopped")

    async def _last_results(self) -> None:
        """Send what results are left and wait (up to `connect_timeout`) until the server
        has answered every result sent: acknowledged as durable, or refused."""
        ws = self._ws
        if ws is None:
            return
        if self._results:
            await self._send(ws, self._heartbeat())
        assert self._answered is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.connect_timeout):
                while self._unanswered and self._ws is ws:
                    self._answered.clear()
                    await self._answered.wait()

    def _answer(self, seq: int | None, results: int) -> None:
        """The server answered `results` of heartbeat `seq`'s results (an ack: all)."""
        if seq is None or seq not in self._unanswered:
            return
        left = self._unanswered[seq] - results
        if left > 0:
            self._unanswered[seq] = left
        else:
            del self._unanswered[seq]
        assert self._answered is not None
        self._answered.set()

    # ------------------------------------------------------------ the connection

    async def _maintain(self) -> None:
        """Keep one `/work` connection open; reconnect with backoff."""
        delay = self.reconnect_base
        timeout = aiohttp.ClientWSTimeout(ws_close=self.connect_timeout)
        async with aiohttp.ClientSession() as session:
            while not self._stopping:
                try:
                    async with asyncio.timeout(self.connect_timeout):
                        ws = await session.ws_connect(
                            self.url,
                            timeout=timeout,
                            max_msg_size=0,
                            ssl=self.tls if self.tls is not None else True,
                            headers=bearer_header(self.token),
                        )
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    log.info("cannot connect to %s (%s); retrying in %.2gs", self.url, exc, delay)
                else:
                    welcomed = await self._serve_connection(ws)
                    if welcomed:
                        delay = self.reconnect_base
                    log.warning(
                        "lost %s (%s); reconnecting in %.2gs", self.url, ws.close_code, delay
                    )
                if self._stopping:
                    break  # results of a new connection's jobs could not be sent anyway
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.reconnect_cap)
        await asyncio.Event().wait()  # stopping: `_shutdown` cancels us

    @property
    def _stopping(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    async def _serve_connection(self, ws: aiohttp.ClientWebSocketResponse) -> bool:
        """Register, then read until the socket closes; True if the server welcomed us."""
        self._generation += 1
        self._ws = ws
        # What piled up for the old connection's jobs is moot: the server requeued them.
        self._progress.clear()
        self._logs.clear()
        self._results.clear()
        self._unanswered.clear()
        self._batched = 0
        self._silence_limit = None
        welcomed = False
        sender: asyncio.Task[None] | None = None
        try:
            await self._send(ws, self._heartbeat(register=True))
            sender = asyncio.create_task(self._heartbeats(ws), name="rota heartbeats")
            while True:
                try:
                    msg = await ws.receive(timeout=self._silence_limit)
                except TimeoutError:
                    self.server_silences += 1
                    log.warning("the server is silent (%.3gs): it is gone", self._silence_limit)
                    await self._abandon(ws)
                    break
                if msg.type in _CLOSED:
                    break
                if msg.type is not aiohttp.WSMsgType.TEXT:
                    continue
                try:
                    message = decode_server_message(msg.data)
                except RotaError as exc:
                    log.warning("ignoring a message from the server: %s", exc)
                    continue
                welcomed |= isinstance(message, Welcome)
                self._on_message(message)
        except (aiohttp.ClientError, OSError) as exc:
            log.debug("connection error: %r", exc)
        finally:
            self._ws = None
            self._unanswered.clear()
            if self._answered is not None:
                self._answered.set()
            if sender is not None:
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
            if not ws.closed:
                with contextlib.suppress(Exception):
                    await ws.close()
        return welcomed

    async def _abandon(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """Close a connection to a silent server without waiting long for its answer."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(min(1.0, self.connect_timeout)):
                await ws.close(code=aiohttp.WSCloseCode.GOING_AWAY)

    async def _heartbeats(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        assert self._wake is not None
        while not ws.closed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval):
                    await self._wake.wait()
            self._wake.clear()
            await self._send(ws, self._heartbeat())

    async def _send(self, ws: aiohttp.ClientWebSocketResponse, heartbeat: Heartbeat) -> None:
        with contextlib.suppress(aiohttp.ClientError, OSError, RuntimeError):
            await ws.send_frame(encode(heartbeat), aiohttp.WSMsgType.TEXT)

    def _flush_soon(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _heartbeat(self, *, register: bool = False) -> Heartbeat:
        now, cpu_time = time.monotonic(), time.process_time()
        then, cpu_then = self._sampled
        self._sampled = (now, cpu_time)
        cpu = round(100 * (cpu_time - cpu_then) / (now - then), 1) if now > then else None
        status = Status(
            cpu=cpu,
            ram=_rss(),
            progress=tuple(Progress(job, c, t) for job, (c, t) in self._progress.items()),
            logs=tuple(LogBatch(job, tuple(lines)) for job, lines in self._logs.items()),
            alerts=tuple(self._alerts),
        )
        results = tuple(self._results)
        self._progress.clear()
        self._logs.clear()
        self._alerts.clear()
        self._results.clear()
        self._batched = 0
        registration = None
        if register:
            registration = Registration(
                hostname=self.hostname,
                os=f"{platform.system()} {platform.release()}".strip(),
                pid=os.getpid(),
                queues=tuple(self.queues) if self.queues is not None else None,
                specs=tuple(SpecRef(t.name, t.checksum) for t in self.tasks.values()),
                revision=REVISION,
            )
        self._seq += 1
        if results:
            self._unanswered[self._seq] = len(results)
        return Heartbeat(
            seq=self._seq,
            register=registration,
            wants=self.concurrency if self.state is WorkerState.RUNNING else 0,
            status=status,
            results=results,
        )

    def _on_message(self, message: Any) -> None:
        if isinstance(message, Assignment):
            self._start(message)
        elif isinstance(message, Revoke):
            self._revoke(message)
        elif isinstance(message, Ack):
            self._answer(message.seq, ALL)
        elif isinstance(message, SetState):
            self._directed(message.state)
        elif isinstance(message, Welcome):
            self.worker_id = message.worker
            self.registrations += 1
            self._interval = min(self.heartbeat, message.heartbeat_timeout / 3)
            self._silence_limit = self.server_timeout
            if self._silence_limit is None and message.beat_interval is not None:
                self._silence_limit = max(message.heartbeat_timeout, 3 * message.beat_interval)
            self._judged(message.specs)
            log.info("registered with %s as %s", self.url, message.worker)
        elif isinstance(message, SpecsChanged):
            self._judged(message.specs)
        elif isinstance(message, ErrorMessage):
            level = logging.DEBUG if message.code == "job_not_held" else logging.WARNING
            log.log(level, "server error %s: %s", message.code, message.message)
            if message.code == "store_unavailable":
                self._answer(message.seq, ALL)  # not durable; nothing more will come
            elif message.job is not None:
                self._answer(message.seq, 1)  # one result (or update) refused

    def _directed(self, state: str) -> None:
        """An operator's state, from the server."""
        log.info("the server directs this worker to %s", state)
        if state == "quiet":
            self._go_quiet()
        elif state == "running":
            self._go_running()
        elif state == "terminate" and not self._stopping:
            self._request_stop()

    def _judged(self, verdicts: Any) -> None:
        self.specs_accepted = {v.name: v.accepted for v in verdicts}
        for v in verdicts:
            if not v.accepted:
                log.warning("spec %s (checksum %s) refused: %s", v.name, v.checksum, v.reason)

    # ------------------------------------------------------------ jobs

    def _start(self, assignment: Assignment) -> None:
        assert self._loop is not None
        job = RotaJob(assignment.job, assignment.logs, self, self._loop)
        self._job_generation[job.handle] = self._generation
        if self.state in (WorkerState.TERMINATE, WorkerState.TERMINATED):
            self._finish(job, Failure(job.handle, "worker_shutdown", "stopping", retryable=True))
            return
        self._launch(job, self._run_job(job))

    def _revoke(self, revoke: Revoke) -> None:
        for job, task in list(self._running.items()):
            if job.handle == revoke.job:
                log.info("job %s revoked by the server: %s", job.handle, revoke.reason)
                job._finished = True  # nothing more is sent for it
                self._job_generation.pop(job.handle, None)
                task.cancel()

    async def _run_job(self, job: RotaJob) -> None:
        try:
            await self._run_task(job)
        finally:
            self._ended(job)

    async def _run_task(self, job: RotaJob) -> None:
        task = self.tasks.get(job.function)
        if task is None:
            self._finish(job, Failure(job.handle, "no_task", f"no task for {job.function}"))
            return
        timer = asyncio.timeout(task.timeout)
        result: Result
        try:
            async with timer:
                value = await invoke(task, job, _same, f"jobwire-{job.handle}")
            result = success(job.handle, value)
        except asyncio.CancelledError:
            if not job._finished:  # cancelled from outside, not revoked: still answer
                self._finish(job, Failure(job.handle, "cancelled", "cancelled", retryable=True))
            raise
        except BaseException as exc:  # even SystemExit from a task must not end the worker
            if not timer.expired():
                log.exception("job %s (%s) raised", job.handle, job.function)
            result = failure(job.handle, exc, timed_out=timer.expired())
        self._finish(job, result)

    def _finish(self, job: RotaJob, result: Result) -> None:
        if job._finished:
            return
        job._finished = True
        if self._job_generation.pop(job.handle, None) != self._generation or self._ws is None:
            log.warning("result of job %s dropped: its connection was lost", job.handle)
            return
        self._results.append(result)
        self._flush_soon()

    # JobSink: updates from running jobs, on the loop.

    def progress(self, job: RotaJob, current: int, total: int) -> None:
        if not job._finished:
            self._progress[job.handle] = (max(0, current), max(0, total))
            self._grew(64)

    def log(self, job: RotaJob, lines: list[str]) -> None:
        if not job._finished:
            self._logs.setdefault(job.handle, []).extend(lines)
            self._grew(sum(len(line) + 4 for line in lines))

    def alert(self, job: RotaJob, message: str, level: str) -> None:
        if level not in ALERT_LEVELS:
            level = "warning"
        self._alerts.append(Alert(level, message, job.handle))
        self._flush_soon()

    def _grew(self, size: int) -> None:
        self._batched += size
        if self._batched >= self.batch_bytes:
            self._flush_soon()


ALL = 1 << 62  # every result of a heartbeat

_CLOSED = (
    aiohttp.WSMsgType.CLOSE,
    aiohttp.WSMsgType.CLOSING,
    aiohttp.WSMsgType.CLOSED,
    aiohttp.WSMsgType.ERROR,
)


def _same(value: Any) -> Any:
    return value
