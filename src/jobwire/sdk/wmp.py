"""A Worker-Manager Protocol worker (docs/wmp.md), with the task API of the Gearman `Worker`.

    worker = WmpWorker(["tcp://127.0.0.1:5556", "tcp://10.0.0.2:5556"], slots=4, roles=["gpu"])

    @worker.task("resize", timeout=60)
    async def resize(job: WmpJob) -> bytes: ...

    worker.run()

Shape: one DEALER per manager (or device); `slots` jobs at once. Each free slot sends READY
to every manager; a WAKE for a free slot locks it for that manager and sends GIVE; TAKE runs
the job in the slot, NO unlocks it; a lock that gets neither within `lock_timeout` seconds
is released. When a job ends its slot sends DONE (the result, or `error`), then READY again.
Free slots re-send READY with back-off (`ready_base` doubling up to `ready_cap`, back to the
base whenever a slot frees) in case a manager forgot them; managers ignore a READY they
remember. HEARTBEAT goes to every link each `heartbeat` seconds; a link silent for
`liveness` of them is reopened. CANCEL stops the job (an async task is cancelled; a thread
task is abandoned, its result dropped) and frees the slot.

Tasks: `async def` tasks run on the worker's loop, plain functions in their own thread (as
the Gearman worker's); the return value is the result; `JobFailed` or any exception is a
failure (DONE with `error`); a task past its `timeout` fails. A job of `resize@gpu` (a job
requiring the role `gpu`) runs the `resize` task; `job.roles` says which roles it required.

Lifecycle as the Gearman worker: SIGTERM/SIGINT quiet the worker (WAKEs ignored, no READY),
wait up to `grace_period` for running jobs, hand the rest back (DONE with `retry=1`), send
DISCONNECT and exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, cast

import zmq.asyncio

import zmq
from jobwire.protocols.zmq import wmp
from jobwire.protocols.zmq.wmp import Message, WmpError
from jobwire.sdk.errors import JobFailed
from jobwire.sdk.lifecycle import Lifecycle, WorkerState
from jobwire.sdk.payload import to_bytes
from jobwire.sdk.tasks import Task, check_timeout, decorator, invoke, is_async

log = logging.getLogger("jobwire.sdk.wmp")

F = TypeVar("F", bound=Callable[..., Any])


class WmpJob:
    """One job handed to a task: `payload` bytes (`text`, `json()`), `function` (the task's
    name), `roles` (what the job required), `id` (also `handle`), `manager`, `attempt`.
    `send_status` and `send_data` reach the waiting client (Gearman WORK_STATUS/WORK_DATA,
    Majordomo PARTIAL...); safe from a thread task; dropped once the job has ended."""

    __slots__ = (
        "_finished",
        "_link",
        "_thread",
        "_via",
        "_worker",
        "attempt",
        "function",
        "id",
        "manager",
        "payload",
        "roles",
        "slot",
    )

    def __init__(
        self, worker: WmpWorker, link: _Link, slot: _Slot, message: Message, payload: bytes
    ) -> None:
        self._worker = worker
        self._link = link
        self._via = message.get("via")
        self._thread = threading.get_ident()
        self._finished = False
        self.slot = slot
        self.id = message.get("job")
        self.manager = message.get("manager")
        self.function, self.roles = wmp.split_function(message.get("function"))
        self.attempt = int(message.number("attempt", 1) or 1)
        self.payload = payload

    def __repr__(self) -> str:
        return f"<WmpJob {self.id} {self.function}>"

    @property
    def handle(self) -> str:
        return self.id

    @property
    def unique(self) -> str:
        return ""

    @property
    def text(self) -> str:
        return self.payload.decode("utf-8")

    def json(self) -> Any:
        return json.loads(self.payload)

    def send_status(self, numerator: int, denominator: int) -> None:
        self._emit({"progress": f"{int(numerator)}/{int(denominator)}"}, ())

    def send_data(self, data: Any) -> None:
        self._emit({}, (to_bytes(data),))

    def send_warning(self, data: Any) -> None:
        """Sent as data: WMP STATUS carries one kind of output."""
        self.send_data(data)

    def _emit(self, headers: dict[str, object], payload: tuple[bytes, ...]) -> None:
        if threading.get_ident() == self._thread:
            self._status(headers, payload)
            return
        loop = self._worker._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the worker exited
                loop.call_soon_threadsafe(self._status, headers, payload)

    def _status(self, headers: dict[str, object], payload: tuple[bytes, ...]) -> None:
        if not self._finished:
            self._send(wmp.STATUS, headers, payload)

    def _send(
        self, command: bytes, headers: Mapping[str, object], payload: Iterable[bytes]
    ) -> None:
        full = {"job": self.id, "slot": self.slot.name, "manager": self.manager, **headers}
        if self._via:
            full["via"] = self._via
        self._link.send(command, full, tuple(payload))

    def _finish(self, headers: Mapping[str, object], payload: Iterable[bytes] = ()) -> None:
        """DONE, once; later updates and results are dropped."""
        if self._finished:
            return
        self._finished = True
        self._send(wmp.DONE, headers, payload)


class _Link:
    """The DEALER to one manager or device."""

    def __init__(self, worker: WmpWorker, index: int, endpoint: str) -> None:
        self.worker = worker
        self.index = index
        self.endpoint = endpoint
        self.sock: zmq.asyncio.Socket | None = None
        self.receiver: asyncio.Task[None] | None = None
        self.last_heard = 0.0

    def open(self, context: zmq.asyncio.Context, now: float) -> None:
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        self.sock = sock
        self.last_heard = now
        self.receiver = asyncio.ensure_future(self._receive(sock))

    def close(self) -> None:
        if self.receiver is not None:
            self.receiver.cancel()
            self.receiver = None
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None

    def send(
        self,
        command: bytes,
        headers: Mapping[str, object] | None = None,
        payload: tuple[bytes, ...] = (),
    ) -> None:
        if self.sock is None:
            return
        sent = self.sock.send_multipart([b"", *wmp.encode(command, headers, payload)])
        future = cast("asyncio.Future[Any]", sent)
        future.add_done_callback(_ignore_failure)

    async def _receive(self, sock: zmq.asyncio.Socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            frames = await sock.recv_multipart()
            self.last_heard = loop.time()
            try:
                _, body = wmp.split_envelope(frames)
                message = wmp.decode(body)
            except WmpError as exc:
                log.warning("%s: dropped an invalid message: %s", self.endpoint, exc)
                continue
            try:
                self.worker._on_message(self, message)
            except WmpError as exc:
                log.warning("%s: dropped %s: %s", self.endpoint, message.command, exc)
            except Exception:
                log.exception("%s: handling %s failed", self.endpoint, message.command)


def _ignore_failure(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.debug("a send failed: %s", future.exception())


class _Slot:
    """One job's worth of the worker: free, locked for a manager (link, via), or busy."""

    __slots__ = ("job", "lock", "lock_timer", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock: tuple[int, str] | None = None
        self.lock_timer: asyncio.TimerHandle | None = None
        self.job: WmpJob | None = None

    @property
    def free(self) -> bool:
        return self.lock is None and self.job is None

    def unlock(self) -> None:
        self.lock = None
        if self.lock_timer is not None:
            self.lock_timer.cancel()
            self.lock_timer = None


class WmpWorker(Lifecycle[WmpJob]):
    """Runs tasks for jobs from every WMP manager (or device) in `managers` (module doc)."""

    _log = log

    def __init__(
        self,
        managers: Iterable[str] = ("tcp://127.0.0.1:5556",),
        *,
        slots: int = 10,
        roles: Iterable[str] = (),
        grace_period: float = 25.0,
        heartbeat: float = 2.5,
        liveness: int = 3,
        lock_timeout: float = 5.0,
        ready_base: float = 1.0,
        ready_cap: float = 30.0,
        lease: float | None = None,
        name: str | None = None,
    ) -> None:
        if slots < 1:
            raise ValueError("slots must be at least 1")
        roles = sorted(set(roles))
        if len(roles) > wmp.MAX_ROLES or not all(wmp.valid_name(role) for role in roles):
            raise ValueError(f"at most {wmp.MAX_ROLES} roles, each without , @ + = or spaces")
        super().__init__(grace_period)
        self.managers = list(managers)
        self.slots = slots
        self.roles = roles
        self.heartbeat = heartbeat
        self.liveness = liveness
        self.lock_timeout = lock_timeout
        self.ready_base = ready_base
        self.ready_cap = ready_cap
        self.lease = lease
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.tasks: dict[str, Task[WmpJob]] = {}
        self._links: list[_Link] = []
        self._slots: dict[str, _Slot] = {}
        self._jobs: dict[tuple[str, str], WmpJob] = {}  # (manager, job id) -> job
        self._ready_reset: asyncio.Event | None = None
        self._context: zmq.asyncio.Context | None = None

    @classmethod
    def from_worker(cls, worker: Any, managers: Iterable[str], **options: Any) -> WmpWorker:
        """A WmpWorker with the tasks of a Gearman `Worker` (their jobs are `WmpJob`s, which
        have the Gearman job's attributes and methods)."""
        made = cls(managers, **options)
        for task in worker.tasks.values():
            made.add_task(task.name, task.func, timeout=task.timeout)
        return made

    # ------------------------------------------------------------ tasks

    def task(self, name: str, *, timeout: float | None = None) -> Callable[[F], F]:
        """Decorator: run the function for jobs of `name`. Register tasks before `run`."""
        return decorator(lambda func: self.add_task(name, func, timeout=timeout))

    def add_task(
        self, name: str, func: Callable[[WmpJob], Any], *, timeout: float | None = None
    ) -> None:
        if not wmp.valid_name(name):
            raise ValueError("task names must be non-empty, without , @ + = or line breaks")
        check_timeout(timeout)
        self.tasks[name] = Task(name, func, timeout, is_async(func))

    # ------------------------------------------------------------ running

    async def serve(self) -> None:
        if not self.tasks:
            raise ValueError("the worker has no tasks")
        if not self.managers:
            raise ValueError("the worker has no managers")
        self._begin()
        loop = asyncio.get_running_loop()
        self._context = zmq.asyncio.Context()
        self._ready_reset = asyncio.Event()
        self._slots = {str(n): _Slot(str(n)) for n in range(self.slots)}
        self._links = [_Link(self, n, endpoint) for n, endpoint in enumerate(self.managers)]
        for link in self._links:
            link.open(self._context, loop.time())
            self._ready(link)
        chores = [asyncio.create_task(self._beat()), asyncio.create_task(self._reready())]
        if self._stop_early:
            self._stop_early = False
            assert self._stop is not None
            self._stop.set()
        await self._until_stopped(lambda: self._shutdown(chores))

    async def _shutdown(self, chores: list[asyncio.Task[None]]) -> None:
        await self._wind_down(
            lambda job: job._finish({"error": "the worker is stopping", "retry": 1}), "returning"
        )
        for chore in chores:
            chore.cancel()
        await asyncio.gather(*chores, return_exceptions=True)
        for link in self._links:
            link.send(wmp.DISCONNECT)
        await asyncio.sleep(0.05)  # let the DISCONNECTs and DONEs leave
        for link in self._links:
            link.close()
        if self._context is not None:
            self._context.term()
        self.state = WorkerState.TERMINATED
        log.info("stopped")

    def _quieted(self) -> None:
        for slot in self._slots.values():
            if slot.lock is not None and slot.job is None:
                slot.unlock()

    def _resumed(self) -> None:
        for link in self._links:
            self._ready(link)

    # ------------------------------------------------------------ READY and liveness

    def _ready_headers(self, slot: _Slot) -> dict[str, object]:
        headers: dict[str, object] = {
            "slot": slot.name,
            "functions": ",".join(self.tasks),
            "heartbeat": self.heartbeat,
            "name": self.name,
        }
        if self.roles:
            headers["roles"] = ",".join(self.roles)
        if self.lease is not None:
            headers["lease"] = self.lease
        return headers

    def _ready(self, link: _Link | None = None, slots: Iterable[_Slot] | None = None) -> None:
        """READY for each free slot (or those given), to one link or all."""
        if self.state is not WorkerState.RUNNING:
            return
        links = [link] if link is not None else self._links
        for slot in slots if slots is not None else self._slots.values():
            if slot.free:
                headers = self._ready_headers(slot)
                for target in links:
                    target.send(wmp.READY, headers)

    def _freed(self, slot: _Slot) -> None:
        """A slot is free again: READY it everywhere, and start the back-off over."""
        self._ready(slots=(slot,))
        if self._ready_reset is not None:
            self._ready_reset.set()

    async def _reready(self) -> None:
        assert self._ready_reset is not None and self._stop is not None
        delay = self.ready_base
        while not self._stop.is_set():
            try:
                async with asyncio.timeout(delay):
                    await self._ready_reset.wait()
            except TimeoutError:
                self._ready()
                delay = min(delay * 2, self.ready_cap)
            else:
                self._ready_reset.clear()
                delay = self.ready_base

    async def _beat(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.heartbeat)
            now = loop.time()
            for link in self._links:
                if now - link.last_heard > self.heartbeat * self.liveness:
                    log.warning("%s is silent: reconnecting", link.endpoint)
                    link.close()
                    assert self._context is not None
                    link.open(self._context, now)
                    self._ready(link)
                link.send(wmp.HEARTBEAT)

    # ------------------------------------------------------------ messages

    def _on_message(self, link: _Link, message: Message) -> None:
        command = message.command
        if command == wmp.WAKE:
            self._wake(link, message)
        elif command == wmp.TAKE:
            self._take(link, message)
        elif command == wmp.NO:
            slot = self._slots.get(message.get("slot"))
            if slot is not None and slot.job is None and slot.lock == self._key(link, message):
                slot.unlock()
                self._freed(slot)
        elif command == wmp.CANCEL:
            self._cancel(message)
        elif command == wmp.ERROR:
            log.warning("%s: ERROR %s", link.endpoint, message.get("reason"))
        elif command == wmp.DISCONNECT:
            log.info("%s: manager %s is leaving", link.endpoint, message.get("manager"))

    @staticmethod
    def _key(link: _Link, message: Message) -> tuple[int, str]:
        return (link.index, message.get("via"))

    def _wake(self, link: _Link, message: Message) -> None:
        slot = self._slots.get(message.get("slot"))
        if slot is None or not slot.free or self.state is not WorkerState.RUNNING:
            return  # busy: RFC 14 says ignore it
        key = self._key(link, message)
        slot.lock = key
        loop = asyncio.get_running_loop()
        slot.lock_timer = loop.call_later(self.lock_timeout, self._lock_expired, slot, key)
        headers: dict[str, object] = {"slot": slot.name}
        if key[1]:
            headers["via"] = key[1]
        link.send(wmp.GIVE, headers)

    def _lock_expired(self, slot: _Slot, key: tuple[int, str]) -> None:
        if slot.lock == key and slot.job is None:
            log.info("slot %s: no TAKE or NO within %ss; unlocked", slot.name, self.lock_timeout)
            slot.lock_timer = None
            slot.unlock()
            self._freed(slot)

    def _take(self, link: _Link, message: Message) -> None:
        slot = self._slots.get(message.get("slot"))
        payload = b"".join(message.payload)
        if slot is None:
            slot = _Slot(message.get("slot"))  # only to answer through
        job = WmpJob(self, link, slot, message, payload)
        usable = slot.name in self._slots and (
            slot.free or (slot.job is None and slot.lock == self._key(link, message))
        )
        if not usable or self.state is not WorkerState.RUNNING:
            # Locked for another manager meanwhile, or stopping: hand it back.
            job._finish({"error": "no free slot for the job", "retry": 1})
            return
        slot.unlock()
        task = self.tasks.get(job.function)
        if task is None:
            job._finish({"error": f"no task for {job.function}"})
            self._freed(slot)
            return
        slot.job = job
        self._jobs[(job.manager, job.id)] = job
        self._launch(job, self._run(job, task))

    def _cancel(self, message: Message) -> None:
        job = self._jobs.get((message.get("manager"), message.get("job")))
        if job is None:
            return
        log.info("job %s cancelled by %s: %s", job.id, job.manager, message.get("reason"))
        job._finished = True  # its result is no longer wanted
        running = self._running.get(job)
        if running is not None:
            running.cancel()
        else:
            self._release(job)

    # ------------------------------------------------------------ jobs

    async def _run(self, job: WmpJob, task: Task[WmpJob]) -> None:
        timer = asyncio.timeout(task.timeout)
        try:
            async with timer:
                result = await invoke(task, job, to_bytes, f"jobwire-wmp-{job.id}")
        except asyncio.CancelledError:
            if not job._finished:
                job._finish({"error": "the job was cancelled", "retry": 1})
            raise
        except JobFailed as exc:
            job._finish({"error": str(exc) or "failed"})
        except BaseException as exc:
            if timer.expired():
                log.warning("job %s (%s) timed out", job.id, job.function)
                job._finish({"error": "timed out"})
            else:
                log.exception("job %s (%s) raised", job.id, job.function)
                text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                job._finish({"error": text}, (text.encode("utf-8", "replace"),))
        else:
            job._finish({}, (result,))
        finally:
            self._ended(job)

    def _job_ended(self) -> None:
        for job in [job for job in self._jobs.values() if job not in self._running]:
            self._release(job)

    def _release(self, job: WmpJob) -> None:
        if self._jobs.get((job.manager, job.id)) is job:
            del self._jobs[(job.manager, job.id)]
        slot = job.slot
        if slot.job is job:
            slot.job = None
            self._freed(slot)
