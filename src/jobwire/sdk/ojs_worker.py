"""A worker for the Open Job Spec HTTP worker protocol (`/ojs/v1/workers/...`).

The task API is the Gearman `Worker`'s (`@worker.task(name, timeout=...)`, async tasks on the
loop, plain functions each in their own daemon thread), with an `OjsJob` in place of the
Gearman `Job`: `handle`/`id`, `function`/`type`, `queue`, `args`, `meta`, `attempt`,
`payload`, `text`, `json()`. A job's `payload` undoes the README's mapping rule: a job whose
`args` are one string (a Gearman-submitted job appears as `[payload as UTF-8]`) has that
string's UTF-8 as payload; any other has the JSON encoding of its `args`, the bytes a Gearman
worker would get.

Outcomes: the return value is acked as the job's `result` (JSON; bytes must be UTF-8 and go as
a string, `None` as null). A task that raises is nacked with `{code, message, retryable,
details}`: `code` is the exception's class name, `details` its `error_class` and traceback, and
it is not retryable, except `Retry` (`jobwire.sdk.ws_job.Retry`, code `retry`), which is: the
job's retry policy then decides when it runs again, and whether it may. A task past its
`timeout` (or the job's own `timeout_ms`, whichever is shorter) is nacked `timeout`. A job of a
type this worker has no task for is nacked retryable (`no_task`), so that another worker may
run it: give `queues` that hold only this worker's types to avoid that.

Protocol: the worker registers (`POST /workers/register`, jobwire's extension; a server
without it gets plain fetches), fetches up to its free slots (`POST /workers/fetch`, or the
seed's `/jobs/fetch` if the server has only those), waits `poll_interval` after an empty
fetch (or until a slot frees), acks or nacks each job, and heartbeats every `heartbeat` seconds
(default: the server's interval) with its `state` and `active_jobs` (which extends their
visibility). It adopts the state each heartbeat reply carries: `quiet` (fetch nothing, finish
held jobs), `running` (fetch again; unless this worker was quieted by its own SIGTSTP) and
`terminate` (as SIGTERM: finish held jobs, exit).

Lifecycle as the other SDK workers (`jobwire.sdk.lifecycle`): SIGTERM/SIGINT quiet the worker,
wait up to `grace_period` for running jobs, nack the rest for requeueing (`worker_shutdown`),
deregister and return; SIGTSTP/SIGCONT quiet and resume it (a heartbeat goes out at once, so
the server knows). The state the worker reports is its own (`quiet` after SIGTSTP, else
`running`), so an operator's `running` is not undone by a worker that was only quiet because
the server said so.

Reliability: a server that cannot be reached (refused, timed out, 5xx) is retried with
exponential backoff (`reconnect_base` doubling up to `reconnect_cap`, reset once the server
answers), and the worker registers again: a restarted server has forgotten it. Held jobs go on
running; their acks and nacks are retried until the server answers them (at shutdown, for up to
`connect_timeout` seconds). A server that no longer knows a job (it requeued it, or lost it)
refuses its ack: the job runs again elsewhere (at least once).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import traceback
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import orjson

from jobwire.sdk.lifecycle import Lifecycle, WorkerState
from jobwire.sdk.tasks import Task, check_timeout, decorator, invoke, is_async
from jobwire.sdk.tls import TLSOption, bearer_header, client_context
from jobwire.sdk.ws_job import Retry

log = logging.getLogger("jobwire.sdk.ojs_worker")

F = TypeVar("F", bound=Callable[..., Any])

BASE = "/ojs/v1"
_JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}
MAX_FETCH = 1000  # the most jobs one fetch may ask for
_TRACEBACK_CHARS = 4000


@dataclass(frozen=True, slots=True)
class _Paths:
    fetch: str
    ack: str  # formatted with the job id
    nack: str

    def job(self, kind: str, job_id: str) -> str:
        return (self.ack if kind == "ack" else self.nack).format(id=job_id)


#: The HTTP binding's worker routes, and the worker-protocol seed's (a fallback).
WORKER_PATHS = _Paths("/workers/fetch", "/workers/ack", "/workers/nack")
SEED_PATHS = _Paths("/jobs/fetch", "/jobs/{id}/ack", "/jobs/{id}/nack")


class Unavailable(Exception):
    """The server could not be reached, or answered 5xx."""


class OjsJob:
    """One OJS job handed to a task (module doc). `envelope` is the job as the server sent it.

    `send_status`, `send_data` and `send_warning` exist so that tasks written for the Gearman
    `Worker` run unchanged; OJS's core binding has no route for them: `send_status` is kept
    in `progress`, the others are dropped.
    """

    __slots__ = (
        "args",
        "attempt",
        "envelope",
        "function",
        "handle",
        "meta",
        "payload",
        "progress",
        "queue",
        "reported",
    )

    def __init__(self, envelope: dict[str, Any]) -> None:
        self.envelope = envelope
        self.handle = str(envelope["id"])
        self.function = str(envelope.get("type", ""))
        self.queue = str(envelope.get("queue", "default"))
        args = envelope.get("args")
        self.args: list[Any] = args if isinstance(args, list) else []
        meta = envelope.get("meta")
        self.meta: dict[str, Any] = meta if isinstance(meta, dict) else {}
        attempt = envelope.get("attempt")
        self.attempt = attempt if isinstance(attempt, int) else 1
        self.payload = payload_of(self.args)
        self.progress: tuple[int, int] | None = None
        self.reported = False  # its ack or nack is decided (and on its way)

    def __repr__(self) -> str:
        return f"<OjsJob {self.handle} {self.function}>"

    @property
    def id(self) -> str:
        return self.handle

    @property
    def type(self) -> str:
        return self.function

    @property
    def timeout(self) -> float | None:
        """The job's own execution timeout (`timeout_ms`), in seconds."""
        value = self.envelope.get("timeout_ms")
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return value / 1000
        return None

    @property
    def text(self) -> str:
        return self.payload.decode("utf-8")

    def json(self) -> Any:
        return json.loads(self.payload)

    def send_status(self, numerator: int, denominator: int) -> None:
        self.progress = (int(numerator), int(denominator))

    def send_data(self, data: Any) -> None:
        log.debug("job %s: send_data has no OJS route; dropped", self.handle)

    def send_warning(self, data: Any) -> None:
        log.debug("job %s: send_warning has no OJS route; dropped", self.handle)


def payload_of(args: list[Any]) -> bytes:
    """The job's bytes: one string argument as UTF-8, else the JSON encoding of `args`."""
    if len(args) == 1 and isinstance(args[0], str):
        return args[0].encode("utf-8", "surrogatepass")
    return orjson.dumps(args)


def result_value(value: Any) -> Any:
    """A task's return value as the JSON `result` of its ack (a TypeError if it has none)."""
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise TypeError("a result in bytes must be UTF-8 text for OJS") from None
    orjson.dumps(value)  # raises TypeError (orjson.JSONEncodeError) if not JSON-able
    return value


def error_of(exc: BaseException, *, timed_out: bool = False) -> dict[str, Any]:
    """The nack's `error` for a task that raised `exc`."""
    if timed_out:
        return {"code": "timeout", "message": "the task ran past its timeout", "retryable": False}
    name = type(exc).__name__
    if isinstance(exc, Retry):
        return {"code": "retry", "message": str(exc) or "retry", "retryable": True}
    trace = "".join(traceback.format_exception(exc))[-_TRACEBACK_CHARS:]
    return {
        "code": name,
        "message": str(exc) or name,
        "retryable": False,
        "details": {"error_class": name, "traceback": trace},
    }


class OjsWorker(Lifecycle[OjsJob]):
    """Runs tasks for jobs fetched from an Open Job Spec server over HTTP (module doc).

        worker = OjsWorker("http://127.0.0.1:8080", queues=["default"], concurrency=4)

        @worker.task("resize", timeout=60)
        async def resize(job: OjsJob) -> dict: ...

        worker.run()

    `queues`: fetched in this order (default: the task names, then `default`; a Gearman job
    sits in the queue named after its function). `heartbeat`: seconds between heartbeats
    (default: what the server's registration reply says, else 5). `visibility_timeout`:
    seconds the server reserves a fetched job for this worker (renewed by each heartbeat;
    default: the server's). `poll_interval`: seconds between empty fetches.
    """

    _log = log

    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        *,
        queues: Iterable[str] | None = None,
        concurrency: int = 10,
        grace_period: float = 25.0,
        heartbeat: float | None = None,
        visibility_timeout: float | None = None,
        poll_interval: float = 1.0,
        reconnect_base: float = 1.0,
        reconnect_cap: float = 32.0,
        connect_timeout: float = 10.0,
        worker_id: str | None = None,
        hostname: str | None = None,
        labels: Iterable[str] = (),
        tls: TLSOption = None,
        token: str | None = None,
    ) -> None:
        self.tls = client_context(tls)
        self.token = token
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        for name, value in (("heartbeat", heartbeat), ("visibility_timeout", visibility_timeout)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive")
        super().__init__(grace_period)
        self.url = url
        self.queues = list(queues) if queues is not None else None
        self.concurrency = concurrency
        self.heartbeat = heartbeat
        self.visibility_timeout = visibility_timeout
        self.poll_interval = poll_interval
        self.reconnect_base = reconnect_base
        self.reconnect_cap = reconnect_cap
        self.connect_timeout = connect_timeout
        self.hostname = hostname or socket.gethostname()
        self.worker_id = worker_id or f"{self.hostname}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.labels = list(labels)
        self.tasks: dict[str, Task[OjsJob]] = {}
        #: True once the server took the registration, False if it has no such extension.
        self.registered: bool | None = None
        #: Counters, for monitoring (and tests): registrations accepted, fetches and
        #: heartbeats answered.
        self.registrations = 0
        self.fetches = 0
        self.heartbeats = 0
        self._paths = WORKER_PATHS
        self._beats = True  # the server has the heartbeat route
        self._connected = False
        self._interval = heartbeat or 5.0
        self._held: dict[str, OjsJob] = {}  # fetched and not yet acked or nacked
        self._reports: set[asyncio.Task[None]] = set()
        self._own_quiet = False  # quiet by this worker's own choice (SIGTSTP, quiet())
        self._own_changes = 0
        self._server_quiet = False  # the server's last word was "quiet"
        self._http: aiohttp.ClientSession | None = None
        self._wake: asyncio.Event | None = None  # the fetcher: a slot freed, state changed
        self._beat_now: asyncio.Event | None = None

    @property
    def base(self) -> str:
        url = self.url.rstrip("/")
        return url if url.endswith(BASE) else url + BASE

    # ------------------------------------------------------------ tasks

    def task(self, name: str, *, timeout: float | None = None) -> Callable[[F], F]:
        """Decorator: run the function for jobs of type `name`. Register tasks before `run`."""
        return decorator(lambda func: self.add_task(name, func, timeout=timeout))

    def add_task(
        self, name: str, func: Callable[[OjsJob], Any], *, timeout: float | None = None
    ) -> None:
        if not name:
            raise ValueError("task names must be non-empty")
        check_timeout(timeout)
        self.tasks[name] = Task(name, func, timeout, is_async(func))

    def fetch_queues(self) -> list[str]:
        if self.queues is not None:
            return list(self.queues)
        return list(dict.fromkeys([*self.tasks, "default"]))

    # ------------------------------------------------------------ running

    async def serve(self) -> None:
        """Serve until stopped (or told to terminate); then quiet, wait out the grace
        period, give the rest back, deregister and return."""
        if not self.tasks:
            raise ValueError("the worker has no tasks")
        if self.queues is not None and not self.queues:
            raise ValueError("queues must not be empty")
        self._begin()
        assert self._stop is not None
        self._wake = asyncio.Event()
        self._beat_now = asyncio.Event()
        self._connected = False
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.connect_timeout),
            headers=bearer_header(self.token),
            connector=aiohttp.TCPConnector(ssl=self.tls) if self.tls is not None else None,
        )
        fetcher = asyncio.create_task(self._fetch_loop(), name="ojs worker fetches")
        beater = asyncio.create_task(self._heartbeats(), name="ojs worker heartbeats")
        if self._stop_early:
            self._stop_early = False
            self._stop.set()
        await self._until_stopped(lambda: self._shutdown(fetcher, beater))

    @property
    def _stopping(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    # ------------------------------------------------------------ lifecycle

    def _go_quiet(self) -> None:
        # SIGTSTP, quiet(), and the start of a stop: the worker's own choice.
        if not self._own_quiet:
            self._own_quiet = True
            self._own_changes += 1
            self._beat_soon()
        super()._go_quiet()

    def _go_running(self) -> None:
        # SIGCONT, resume().
        if self._stopping:
            return
        if self._own_quiet:
            self._own_quiet = False
            self._own_changes += 1
            self._beat_soon()
        if self._server_quiet:
            log.info("resuming once the server agrees (its last word was quiet)")
            return
        super()._go_running()

    def _request_stop(self) -> None:
        super()._request_stop()
        self._wake_fetcher()

    def _quieted(self) -> None:
        self._beat_soon()

    def _resumed(self) -> None:
        self._beat_soon()
        self._wake_fetcher()

    def _adopt(self, state: Any) -> None:
        """The state the server returned (registration or heartbeat reply)."""
        if state == WorkerState.QUIET.value:
            self._server_quiet = True
            if self.state is WorkerState.RUNNING:
                log.info("the server directs this worker to quiet")
                Lifecycle._go_quiet(self)
        elif state == WorkerState.RUNNING.value:
            self._server_quiet = False
            if self.state is WorkerState.QUIET and not self._own_quiet and not self._stopping:
                log.info("the server directs this worker to run")
                Lifecycle._go_running(self)
        elif state == WorkerState.TERMINATE.value and not self._stopping:
            log.info("the server directs this worker to terminate")
            self._request_stop()

    def _reported_state(self) -> str:
        if self._stopping or self.state in (WorkerState.TERMINATE, WorkerState.TERMINATED):
            if self.state is WorkerState.RUNNING:
                return WorkerState.QUIET.value
            if self.state is WorkerState.TERMINATED:
                return WorkerState.TERMINATE.value
            return self.state.value
        return WorkerState.QUIET.value if self._own_quiet else WorkerState.RUNNING.value

    async def _shutdown(self, fetcher: asyncio.Task[None], beater: asyncio.Task[None]) -> None:
        self._wake_fetcher()
        await self._wind_down(self._give_back, "giving back")
        # A fetch in flight ends within the request timeout; jobs it brings are given back.
        await asyncio.wait([fetcher], timeout=self.connect_timeout + 1)
        fetcher.cancel()
        if self._reports:
            _, pending = await asyncio.wait(set(self._reports), timeout=self.connect_timeout)
            for report in pending:
                report.cancel()
            if pending:
                log.warning("%d ack(s)/nack(s) not delivered: the server is gone", len(pending))
            await asyncio.gather(*pending, return_exceptions=True)
        beater.cancel()
        await asyncio.gather(fetcher, beater, return_exceptions=True)
        if self._connected and self.registered:
            with contextlib.suppress(Unavailable):
                status, reply = await self._post(
                    "/workers/deregister", {"worker_id": self.worker_id}
                )
                if status != 200:
                    log.debug("deregistration refused: %s", _message(reply))
        assert self._http is not None
        await self._http.close()
        self.state = WorkerState.TERMINATED
        log.info("stopped")

    def _give_back(self, job: OjsJob) -> None:
        """Requeue a job this worker will not finish (grace period over, or stopping)."""
        if job.reported:
            return
        job.reported = True
        error = {"code": "worker_shutdown", "message": "the worker stopped", "retryable": True}
        body = {"job_id": job.id, "worker_id": self.worker_id, "error": error, "requeue": True}
        self._report(job, "nack", body)

    # ------------------------------------------------------------ HTTP

    async def _post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        """POST `body` as JSON; the status and decoded reply. `Unavailable` if the server
        cannot be reached or answers 5xx."""
        assert self._http is not None
        try:
            async with self._http.post(
                self.base + path, data=orjson.dumps(body), headers=_JSON_HEADERS
            ) as response:
                status = response.status
                raw = await response.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise Unavailable(str(exc) or type(exc).__name__) from exc
        try:
            reply = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            reply = None
        if status >= 500:
            raise Unavailable(f"HTTP {status}: {_message(reply)}")
        return status, reply

    def _lost(self, exc: Unavailable) -> None:
        if self._connected:
            log.warning("lost %s (%s); reconnecting", self.base, exc)
        self._connected = False
        self._wake_fetcher()

    async def _pause(self, seconds: float) -> None:
        """Sleep, but not past a stop."""
        assert self._stop is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()

    async def _register(self) -> None:
        body: dict[str, Any] = {
            "worker_id": self.worker_id,
            "hostname": self.hostname,
            "pid": os.getpid(),
            "queues": self.fetch_queues(),
            "concurrency": self.concurrency,
        }
        if self.labels:
            body["labels"] = self.labels
        status, reply = await self._post("/workers/register", body)
        if status == 200 and isinstance(reply, dict):
            self.registered = True
            self.registrations += 1
            interval = reply.get("heartbeat_interval")
            if self.heartbeat is None and isinstance(interval, int | float) and interval > 0:
                self._interval = float(interval)
            log.info("registered with %s as %s", self.base, self.worker_id)
            self._connected = True
            self._adopt(reply.get("state"))
        else:
            if self.registered is not False:
                log.info(
                    "%s refused the registration (%d %s): fetching without one",
                    self.base,
                    status,
                    _message(reply),
                )
            self.registered = False
            self._connected = True
        self._beat_soon()

    # ------------------------------------------------------------ fetching

    def _wake_fetcher(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _beat_soon(self) -> None:
        if self._beat_now is not None:
            self._beat_now.set()

    async def _fetch_loop(self) -> None:
        assert self._wake is not None
        delay = self.reconnect_base
        while not self._stopping:
            self._wake.clear()
            if not self._connected:
                try:
                    await self._register()
                except Unavailable as exc:
                    log.info("cannot reach %s (%s); retrying in %.2gs", self.base, exc, delay)
                    await self._pause(delay)
                    delay = min(delay * 2, self.reconnect_cap)
                else:
                    delay = self.reconnect_base
                continue
            free = self.concurrency - len(self._held)
            if self.state is not WorkerState.RUNNING or free <= 0:
                await self._wake.wait()
                continue
            try:
                jobs = await self._fetch(min(free, MAX_FETCH))
            except Unavailable as exc:
                self._lost(exc)
                continue
            for envelope in jobs:
                self._start(envelope)
            if not jobs and not self._wake.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_interval):
                        await self._wake.wait()

    async def _fetch(self, count: int) -> list[dict[str, Any]]:
        body: dict[str, Any] = {
            "queues": self.fetch_queues(),
            "count": count,
            "worker_id": self.worker_id,
        }
        if self.visibility_timeout is not None:
            body["visibility_timeout_ms"] = max(1, round(self.visibility_timeout * 1000))
        status, reply = await self._post(self._paths.fetch, body)
        if status in (404, 405) and self._paths is WORKER_PATHS:
            log.info("%s has no %s: using %s", self.base, WORKER_PATHS.fetch, SEED_PATHS.fetch)
            self._paths = SEED_PATHS
            return []
        if status != 200 or not isinstance(reply, dict):
            log.warning("fetch refused (%d): %s", status, _message(reply))
            return []
        self.fetches += 1
        jobs = reply.get("jobs")
        if not isinstance(jobs, list):
            job = reply.get("job")
            jobs = [job] if job is not None else []
        return [job for job in jobs if isinstance(job, dict) and "id" in job]

    # ------------------------------------------------------------ heartbeats

    async def _heartbeats(self) -> None:
        assert self._beat_now is not None
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval):
                    await self._beat_now.wait()
            self._beat_now.clear()
            if self._connected and self._beats:
                await self._beat()

    async def _beat(self) -> None:
        changes = self._own_changes
        body: dict[str, Any] = {
            "worker_id": self.worker_id,
            "state": self._reported_state(),
            "active_jobs": sorted(self._held),
        }
        if self.visibility_timeout is not None:
            body["visibility_timeout_ms"] = max(1, round(self.visibility_timeout * 1000))
        try:
            status, reply = await self._post("/workers/heartbeat", body)
        except Unavailable as exc:
            self._lost(exc)
            return
        if status in (404, 405):
            log.info("%s has no heartbeat route: heartbeats off", self.base)
            self._beats = False
            return
        if status != 200 or not isinstance(reply, dict):
            log.warning("heartbeat refused (%d): %s", status, _message(reply))
            return
        self.heartbeats += 1
        if changes != self._own_changes:
            self._beat_soon()  # the reply answers a state this worker has left: ask again
            return
        self._adopt(reply.get("state"))

    # ------------------------------------------------------------ jobs

    def _start(self, envelope: dict[str, Any]) -> None:
        job = OjsJob(envelope)
        if job.id in self._held:
            return
        self._held[job.id] = job
        if self._stopping or self.state in (WorkerState.TERMINATE, WorkerState.TERMINATED):
            self._give_back(job)
            return
        self._launch(job, self._run_job(job))

    async def _run_job(self, job: OjsJob) -> None:
        try:
            kind, body = await self._outcome(job)
            if job.reported:  # given back meanwhile
                return
            job.reported = True
            await asyncio.shield(self._report(job, kind, body))
        finally:
            self._ended(job)

    async def _outcome(self, job: OjsJob) -> tuple[str, dict[str, Any]]:
        task = self.tasks.get(job.function)
        if task is None:
            error = {
                "code": "no_task",
                "message": f"this worker has no task for {job.function!r}",
                "retryable": True,
            }
            return "nack", {"job_id": job.id, "worker_id": self.worker_id, "error": error}
        timeout = task.timeout
        if job.timeout is not None:
            timeout = job.timeout if timeout is None else min(timeout, job.timeout)
        timer = asyncio.timeout(timeout)
        try:
            async with timer:
                value = await invoke(task, job, result_value, f"jobwire-{job.id}")
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # even SystemExit from a task must not end the worker
            if not timer.expired() and not isinstance(exc, Retry):
                log.exception("job %s (%s) raised", job.id, job.function)
            return "nack", {
                "job_id": job.id,
                "worker_id": self.worker_id,
                "error": error_of(exc, timed_out=timer.expired()),
            }
        return "ack", {"job_id": job.id, "worker_id": self.worker_id, "result": value}

    def _report(self, job: OjsJob, kind: str, body: dict[str, Any]) -> asyncio.Task[None]:
        report = asyncio.create_task(self._deliver(job, kind, body), name=f"{kind} {job.id}")
        self._reports.add(report)
        report.add_done_callback(self._reports.discard)
        return report

    async def _deliver(self, job: OjsJob, kind: str, body: dict[str, Any]) -> None:
        """Ack or nack `job`, retrying while the server cannot be reached."""
        delay = self.reconnect_base
        try:
            while True:
                try:
                    status, reply = await self._post(self._paths.job(kind, job.id), body)
                except Unavailable as exc:
                    self._lost(exc)
                    log.debug("%s of job %s: %s; retrying in %.2gs", kind, job.id, exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.reconnect_cap)
                    continue
                if status != 200:
                    log.warning(
                        "%s of job %s refused (%d): %s", kind, job.id, status, _message(reply)
                    )
                return
        finally:
            self._held.pop(job.id, None)
            self._wake_fetcher()


def _message(reply: Any) -> str:
    """The message of an OJS error body, or the body itself."""
    if isinstance(reply, dict):
        error = reply.get("error")
        if isinstance(error, dict):
            return f"{error.get('code')}: {error.get('message')}"
    return repr(reply)
