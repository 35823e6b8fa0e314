"""The job a Rota (`/work` WebSocket) task gets, and how its outcome becomes a result.

`RotaJob` mirrors the Gearman `Job` of `jobwire.sdk.worker` (`handle`, `function`, `payload`,
`text`, `json()`, `send_status`) and adds what Rota carries: `args` (the OJS view of the
input), `attempt`, `log()` (kept by the server when the assignment asked for logs) and
`alert()` (sent at once). The update methods are safe from the worker's loop and from a thread
task, and do nothing once the job has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable
from typing import Any, Protocol

from jobwire.protocols.rota import NO_VALUE, Failure, JobCopy, Result, Success
from jobwire.sdk.errors import JobwireError
from jobwire.sdk.payload import to_bytes


class Retry(JobwireError):
    """Raise from a task to fail the job so that it runs again (within its attempts)."""


class RotaJob:
    __slots__ = (
        "_finished",
        "_loop",
        "_sink",
        "_thread",
        "args",
        "attempt",
        "function",
        "handle",
        "logs_wanted",
        "meta",
        "payload",
        "queue",
    )

    def __init__(
        self,
        copy: JobCopy,
        logs_wanted: bool,
        sink: JobSink,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.handle = copy.id
        self.function = copy.spec
        self.queue = copy.queue
        self.payload = copy.payload
        self.args = copy.args
        self.attempt = copy.attempt
        self.meta = copy.meta
        self.logs_wanted = logs_wanted
        self._sink = sink
        self._loop = loop
        self._thread = threading.get_ident()
        self._finished = False

    @property
    def id(self) -> str:
        return self.handle

    def __repr__(self) -> str:
        return f"<RotaJob {self.handle} {self.function}>"

    @property
    def text(self) -> str:
        return self.payload.decode("utf-8")

    def json(self) -> Any:
        return json.loads(self.payload)

    def send_status(self, numerator: int, denominator: int) -> None:
        """Progress, e.g. send_status(3, 10); sent with the next heartbeat."""
        self._call(self._sink.progress, self, int(numerator), int(denominator))

    def log(self, *lines: str) -> None:
        """Log lines for the server to keep; dropped unless the assignment asked for logs."""
        if self.logs_wanted:
            self._call(self._sink.log, self, [str(line) for line in lines])

    def alert(self, message: str, level: str = "warning") -> None:
        """An alert about this job, sent at once."""
        self._call(self._sink.alert, self, str(message), level)

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        if threading.get_ident() == self._thread:
            fn(*args)
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the worker has exited
            self._loop.call_soon_threadsafe(fn, *args)


class JobSink(Protocol):
    """Where a job's updates go (the worker); methods run on the worker's loop."""

    def progress(self, job: RotaJob, current: int, total: int) -> None: ...

    def log(self, job: RotaJob, lines: list[str]) -> None: ...

    def alert(self, job: RotaJob, message: str, level: str) -> None: ...


def success(job_id: str, value: Any) -> Success:
    """A task's return value as a result: bytes as they are (text when they are UTF-8), str as
    text, None as empty, anything else as JSON (a TypeError if it is not JSON-able)."""
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return Success(job_id, raw, raw.decode("utf-8"))
        except UnicodeDecodeError:
            return Success(job_id, raw, NO_VALUE)
    return Success(job_id, to_bytes(value), value)


def failure(job_id: str, exc: BaseException, *, timed_out: bool = False) -> Result:
    if timed_out:
        return Failure(job_id, "timeout", "the task ran past its timeout")
    if isinstance(exc, Retry):
        return Failure(job_id, "retry", str(exc), retryable=True)
    name = type(exc).__name__
    return Failure(job_id, name, str(exc) or name)
