"""The Majordomo worker: runs tasks for MDP requests, with the Gearman `Worker`'s task API.

Shape: for every task, `concurrency` DEALER sockets, each READY for that task's service and
holding one request at a time (RFC 7: a worker serves one service, one request at a time),
so the broker's own dispatch spreads the requests. Tasks run as they do for the Gearman
worker (`jobwire.sdk.tasks`): `async def` on the event loop, plain functions each in a
thread of their own.

Heartbeats run on the event loop, for every socket, also while its task runs (the ZeroMQ
Guide's `mdwrkapi` beats only inside `recv()`, so a long task makes the broker declare a
busy worker dead; jobwire's broker expires busy workers too). Any command from the broker
counts as its heartbeat; brokers beat idle workers only, so only an idle socket counts
missed beats: `liveness` of them and the broker is lost. A lost broker, or a DISCONNECT,
closes the socket and opens a new one that sends READY again, after a back-off of
`reconnect_base` seconds doubling to `reconnect_cap` (reset once the broker answers). A
request running on the old socket finishes, but its reply is dropped: the broker requeued
it (or is gone).

Replies: a task's return value is the FINAL (0.1 REPLY), one frame by the payload rule, or
several if it returns `Frames`. `job.send_data` sends a PARTIAL (0.2; dropped in 0.1). A
task that raises, or outlives its `timeout`, answers jobwire's error reply
[`\\x00jobwire:error`, `500`, "Type: message"], which the SDK's clients raise as
`ServiceError`; MDP has no other way for a worker to say a request failed.

The sockets use the event loop's reader on the socket's descriptor (as the broker does),
not `zmq.asyncio`: sends from timers, threads and job ends never leave futures behind.

Lifecycle: as the Gearman worker's (SIGTERM/SIGINT stop gracefully, SIGTSTP quiet, SIGCONT
resume; `stop()`, `quiet()`, `resume()`). A quiet socket sends DISCONNECT once its request
is answered, so the broker sends it nothing more; at the end of the grace period the
requests still running are abandoned and their sockets DISCONNECT, which makes jobwire
requeue them for another worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable
from typing import Any, Final, TypeVar

import zmq
from jobwire.protocols.zmq import mdp
from jobwire.protocols.zmq.mdp import MdpError, Version
from jobwire.sdk.errors import JobFailed
from jobwire.sdk.lifecycle import Lifecycle, WorkerState
from jobwire.sdk.tasks import Task, check_timeout, decorator, invoke, is_async
from jobwire.sdk.zmq.common import DEFAULT_ENDPOINT, error_body, reply_frames, version_of

log = logging.getLogger("jobwire.sdk.zmq.worker")

F = TypeVar("F", bound=Callable[..., Any])

#: Messages taken from one socket per wake-up before other callbacks get the loop.
BATCH: Final = 64
#: Seconds a closing socket may take to deliver its last replies and DISCONNECT.
CLOSE_LINGER_MS: Final = 1000
FAILED: Final = b"500"


class MdpJob:
    """One request handed to a task: the same surface as the Gearman worker's `Job`.

    `frames` is the request body; `payload` is the frames joined (jobwire's mapping rule),
    `text` and `json()` decode it. `handle` is the client address the broker gave (the job
    id, with jobwire), `function` the service. `send_data` sends a PARTIAL (MDP 0.2);
    `send_status` and `send_warning` have no Majordomo message and do nothing. All three are
    safe from an async task or a thread task, and do nothing once the job has ended.
    """

    __slots__ = (
        "_client",
        "_finished",
        "_generation",
        "_link",
        "_thread",
        "frames",
        "function",
        "handle",
        "payload",
        "unique",
    )

    def __init__(self, link: _Link, client: bytes, frames: tuple[bytes, ...]) -> None:
        self._link = link
        self._generation = link.generation
        self._client = client
        self._thread = threading.get_ident()
        self._finished = False
        self.frames = frames
        self.payload = b"".join(frames)
        self.handle = client.decode("utf-8", "replace")
        self.function = link.name
        self.unique = ""

    def __repr__(self) -> str:
        return f"<MdpJob {self.handle} {self.function}>"

    @property
    def text(self) -> str:
        return self.payload.decode("utf-8")

    def json(self) -> Any:
        return json.loads(self.payload)

    def send_data(self, data: Any) -> None:
        """A partial reply (MDP 0.2 PARTIAL; MDP 0.1 has none, so it is dropped)."""
        if self._link.version is Version.V1:
            return
        frames = reply_frames(data)
        if threading.get_ident() == self._thread:
            self._partial(frames)
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the worker has exited
            self._link.loop.call_soon_threadsafe(self._partial, frames)

    def send_status(self, numerator: int, denominator: int) -> None:
        """Majordomo has no progress message: nothing is sent."""

    def send_warning(self, data: Any) -> None:
        """Majordomo has no warning message: nothing is sent."""

    def _partial(self, frames: list[bytes]) -> None:
        if not self._finished and self._current:
            self._link.send(mdp.worker_reply(self._link.version, self._client, frames, final=False))

    @property
    def _current(self) -> bool:
        """Still on the socket that received it (else the broker forgot it: drop)."""
        return self._generation == self._link.generation and self._link.sock is not None

    def _finish(self, frames: list[bytes]) -> None:
        if self._finished:
            return
        self._finished = True
        if not self._current:
            log.warning(
                "reply to %s (%s) dropped: its socket was replaced; the broker requeued it",
                self.handle,
                self.function,
            )
            return
        self._link.send(mdp.worker_reply(self._link.version, self._client, frames))

    def _abandon(self) -> None:
        self._finished = True


class _Link:
    """One DEALER socket READY for one service, and its heartbeats and reconnects."""

    def __init__(self, worker: MdpWorker, name: str, index: int) -> None:
        self.worker = worker
        self.name = name
        self.service = name.encode()
        self.index = index
        self.version = worker.version
        self.loop = asyncio.get_running_loop()
        self.sock: zmq.Socket[bytes] | None = None
        self.generation = 0
        self.jobs: set[MdpJob] = set()
        self.active = False  # wants to be connected (running, not quiet)
        self.liveness = 0
        self.delay = worker.reconnect_base
        self.last_sent = 0.0
        self._fd = -1
        self._timer: asyncio.TimerHandle | None = None
        self._check_due = False

    def __repr__(self) -> str:
        return f"<link {self.name}#{self.index}>"

    @property
    def busy(self) -> bool:
        return any(job._generation == self.generation for job in self.jobs)

    # ------------------------------------------------------------ connecting

    def start(self) -> None:
        if self.active:
            return
        self.active = True
        if self.sock is None and self._timer is None:
            self._open()

    def _open(self) -> None:
        self._timer = None
        if not self.active:
            return
        worker = self.worker
        assert worker._context is not None
        sock = worker._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(worker.endpoint)
        self.sock = sock
        self.generation += 1
        self.liveness = worker.liveness
        self._fd = sock.getsockopt(zmq.FD)  # type: ignore[assignment]
        self.loop.add_reader(self._fd, self._readable)
        self.send(mdp.ready(self.version, self.service))
        self._timer = self.loop.call_later(worker.heartbeat, self._tick)
        log.info("%s: READY for %s at %s", self, self.name, worker.endpoint)

    def _close(self, linger: int = 0) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        sock = self.sock
        if sock is None:
            return
        self.sock = None
        self.loop.remove_reader(self._fd)
        sock.close(linger=linger)

    def _reconnect(self, why: str) -> None:
        """Close the socket and open a new one (new identity, new READY) after the back-off."""
        self._close()
        self.worker.reconnects += 1
        if not self.active:
            return
        log.warning("%s: %s; reconnecting in %.2gs", self, why, self.delay)
        self._timer = self.loop.call_later(self.delay, self._open)
        self.delay = min(self.delay * 2, self.worker.reconnect_cap)

    def leave(self) -> None:
        """Stop serving: DISCONNECT (the broker sends nothing more) and close."""
        self.active = False
        if self.sock is not None:
            self.send(mdp.disconnect(self.version))
            log.info("%s: DISCONNECT", self)
        self._close(CLOSE_LINGER_MS)

    # ------------------------------------------------------------ traffic

    def send(self, frames: list[bytes]) -> None:
        sock = self.sock
        if sock is None:
            return
        try:
            sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # the broker is not reading (high-water mark): dropped
            log.debug("%s: a message was dropped: %s", self, exc)
        self.last_sent = self.loop.time()
        # The descriptor is edge-triggered and a send can consume its edge: look again.
        if not self._check_due:
            self._check_due = True
            self.loop.call_soon(self._readable)

    def _readable(self) -> None:
        self._check_due = False
        sock = self.sock
        for _ in range(BATCH):
            if sock is None or sock is not self.sock:  # closed or replaced meanwhile
                return
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError as exc:
                log.debug("%s: receive failed: %s", self, exc)
                return
            self._handle(frames)
        if not self._check_due:  # more may wait: go on after other callbacks
            self._check_due = True
            self.loop.call_soon(self._readable)

    def _handle(self, frames: list[bytes]) -> None:
        try:
            message = mdp.decode_for_worker(frames)
        except MdpError as exc:
            log.warning("%s: dropped an invalid message: %s", self, exc)
            return
        if isinstance(message, mdp.Disconnect):
            self._reconnect("the broker sent DISCONNECT")
            return
        self.liveness = self.worker.liveness
        self.delay = self.worker.reconnect_base  # the broker answers: back-off starts over
        if isinstance(message, mdp.WorkerRequest):
            if self.busy:  # a broker that breaks RFC 7's one-at-a-time: serve it anyway
                log.warning("%s: a second request while one runs", self)
            self.worker._start(self, message.client, message.body)

    def _tick(self) -> None:
        """Every heartbeat interval: count a missed beat (idle only), send ours."""
        worker = self.worker
        self._timer = None
        if not self.busy:
            self.liveness -= 1
            if self.liveness <= 0:
                self._reconnect("the broker is silent")
                return
        now = self.loop.time()
        if now - self.last_sent >= worker.heartbeat / 2:  # not while other commands go out
            self.send(mdp.heartbeat(self.version))
            worker.heartbeats_sent += 1
        self._timer = self.loop.call_later(worker.heartbeat, self._tick)

    def job_ended(self, job: MdpJob) -> None:
        self.jobs.discard(job)
        if job._generation == self.generation:
            # Brokers beat only idle workers: the silence while it ran was no missed beat.
            self.liveness = self.worker.liveness
        if self.worker.state is not WorkerState.RUNNING and not self.busy:
            self.leave()


class MdpWorker(Lifecycle[MdpJob]):
    """Runs tasks for Majordomo requests from one broker.

        worker = MdpWorker("tcp://127.0.0.1:5555", version=2, concurrency=4)

        @worker.task("resize", timeout=60)
        async def resize(job: MdpJob) -> bytes:
            job.send_data(b"halfway")          # a PARTIAL (MDP 0.2)
            return await make_thumbnail(job.payload)

        worker.run()

    `version`: MDP 1 (RFC 7) or 2 (RFC 18). `concurrency`: sockets per task, each running
    one request at a time. `heartbeat` must be the broker's interval (jobwire's
    `--mdp-heartbeat`, 2.5 s by default); `liveness`: beats an idle socket may miss before
    the broker counts as lost. `reconnect_base`/`reconnect_cap`: the back-off, doubling.
    `grace_period`: seconds a graceful stop waits for running tasks.

    `reconnects` and `heartbeats_sent` count what the worker did (for monitoring).
    """

    _log = log

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        *,
        version: int | Version = Version.V1,
        concurrency: int = 1,
        heartbeat: float = 2.5,
        liveness: int = 3,
        reconnect_base: float = 1.0,
        reconnect_cap: float = 32.0,
        grace_period: float = 25.0,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if heartbeat <= 0 or liveness < 1:
            raise ValueError("heartbeat must be positive and liveness at least 1")
        super().__init__(grace_period)
        self.endpoint = endpoint
        self.version = version_of(version)
        self.concurrency = concurrency
        self.heartbeat = heartbeat
        self.liveness = liveness
        self.reconnect_base = reconnect_base
        self.reconnect_cap = reconnect_cap
        self.tasks: dict[str, Task[MdpJob]] = {}
        self.reconnects = 0
        self.heartbeats_sent = 0
        self._context: zmq.Context[zmq.Socket[bytes]] | None = None
        self._links: list[_Link] = []

    # ------------------------------------------------------------ tasks

    def task(self, name: str, *, timeout: float | None = None) -> Callable[[F], F]:
        """Decorator: run the function for requests to service `name`."""
        return decorator(lambda func: self.add_task(name, func, timeout=timeout))

    def add_task(
        self, name: str, func: Callable[[MdpJob], Any], *, timeout: float | None = None
    ) -> None:
        if not name or name.startswith("mmi.") or name.startswith("titanic."):
            raise ValueError("a service name is not empty, nor an mmi.* or titanic.* name")
        check_timeout(timeout)
        self.tasks[name] = Task(name, func, timeout, is_async(func))

    # ------------------------------------------------------------ running

    async def serve(self) -> None:
        """Serve until `stop()`; then quiet, wait out the grace period, abandon the rest."""
        if not self.tasks:
            raise ValueError("the worker has no tasks")
        self._begin()
        self._context = zmq.Context()
        self._links = [
            _Link(self, name, index) for name in self.tasks for index in range(self.concurrency)
        ]
        for link in self._links:
            link.start()
        if self._stop_early:
            self._stop_early = False
            assert self._stop is not None
            self._stop.set()
        await self._until_stopped(self._shutdown)

    def _quieted(self) -> None:
        for link in self._links:
            if not link.busy:
                link.leave()

    def _resumed(self) -> None:
        for link in self._links:
            link.start()

    async def _shutdown(self) -> None:
        await self._wind_down(MdpJob._abandon, "abandoning")
        for link in self._links:
            link.leave()
        context, self._context = self._context, None
        if context is not None:
            # term() waits (up to the linger) for the last replies and DISCONNECTs to go.
            await asyncio.to_thread(context.term)
        self.state = WorkerState.TERMINATED
        log.info("stopped")

    # ------------------------------------------------------------ requests

    def _start(self, link: _Link, client: bytes, body: tuple[bytes, ...]) -> None:
        job = MdpJob(link, client, body)
        if self.state is not WorkerState.RUNNING:
            # Quiet or stopping: leave it to the broker (DISCONNECT requeues it with jobwire).
            log.info("not starting %s: not running", job)
            job._abandon()
            return
        task = self.tasks[link.name]
        link.jobs.add(job)
        self._launch(job, self._run(job, task))

    async def _run(self, job: MdpJob, task: Task[MdpJob]) -> None:
        timer = asyncio.timeout(task.timeout)
        try:
            async with timer:
                frames = await invoke(task, job, reply_frames, f"jobwire-mdp-{job.handle}")
        except asyncio.CancelledError:
            job._abandon()  # terminate: the DISCONNECT that follows hands it back
            raise
        except JobFailed as exc:
            job._finish(error_body(FAILED, str(exc) or "failed"))
        except BaseException as exc:  # even SystemExit from a task must not end the worker
            if timer.expired():
                log.warning("%s timed out", job)
                text = f"timed out after {task.timeout}s"
            else:
                log.exception("%s raised", job)
                text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            job._finish(error_body(FAILED, text))
        else:
            job._finish(frames)
        finally:
            job._link.job_ended(job)
            self._ended(job)
