"""The worker lifecycle shared by the Gearman `Worker` and the `RotaWorker`.

Open Job Spec worker protocol: running -> quiet -> terminate -> terminated. On the main
thread, SIGTERM/SIGINT stop gracefully (quiet, wait up to `grace_period` for running jobs, fail
the rest); a second stop skips what is left of the grace period. SIGTSTP: quiet; SIGCONT:
running again. `stop`, `quiet` and `resume` do the same from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine
from enum import StrEnum
from typing import Any, ClassVar, Generic, TypeVar

from mypy_extensions import mypyc_attr

from jobwire.sdk.loops import run

J = TypeVar("J")


class WorkerState(StrEnum):
    RUNNING = "running"  # grabbing jobs
    QUIET = "quiet"  # finishing held jobs, taking nothing new
    TERMINATE = "terminate"  # grace period over: failing what still runs
    TERMINATED = "terminated"


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled; the other workers are not
class Lifecycle(Generic[J]):
    """State, stop/quiet/resume and the grace period; subclasses serve and run the jobs."""

    _log: ClassVar[logging.Logger]

    def __init__(self, grace_period: float) -> None:
        self.grace_period = grace_period
        self.state = WorkerState.TERMINATED
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running: dict[J, asyncio.Task[None]] = {}
        self._stop: asyncio.Event | None = None
        self._hurry: asyncio.Event | None = None
        self._stop_early = False
        #: While the grace period runs: resolved when a job ends (see `_job_gone`).
        self._gone: asyncio.Future[None] | None = None

    async def serve(self) -> None:
        raise NotImplementedError

    def run(self) -> None:
        """Serve until stopped, on uvloop if it is installed. On the main thread, signals drive
        the lifecycle (module doc)."""
        run(self._main())

    async def _main(self) -> None:
        if threading.current_thread() is threading.main_thread():
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGTERM, self._request_stop)
            loop.add_signal_handler(signal.SIGINT, self._request_stop)
            loop.add_signal_handler(signal.SIGTSTP, self._go_quiet)
            loop.add_signal_handler(signal.SIGCONT, self._go_running)
        await self.serve()

    def stop(self) -> None:
        """Stop gracefully, as SIGTERM does; a second call skips what is left of the grace
        period. Safe from any thread."""
        self._from_any_thread(self._request_stop)

    def quiet(self) -> None:
        """Take no new jobs (as SIGTSTP). Safe from any thread."""
        self._from_any_thread(self._go_quiet)

    def resume(self) -> None:
        """Take jobs again after `quiet` (as SIGCONT). Safe from any thread."""
        self._from_any_thread(self._go_running)

    def _from_any_thread(self, action: Callable[[], None]) -> None:
        loop = self._loop
        if loop is None:  # serve() has not started: a stop still counts
            self._stop_early = self._stop_early or action == self._request_stop
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the worker has ended
            loop.call_soon_threadsafe(action)

    # ------------------------------------------------------------ serving

    def _begin(self) -> None:
        """Start serving on the running loop."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._hurry = asyncio.Event()
        self.state = WorkerState.RUNNING

    async def _until_stopped(self, shutdown: Callable[[], Awaitable[None]]) -> None:
        """Wait for a stop, then `shutdown`; being cancelled skips the grace period."""
        assert self._stop is not None and self._hurry is not None
        try:
            await self._stop.wait()
        except asyncio.CancelledError:
            self._hurry.set()
            raise
        finally:
            await shutdown()

    def _launch(self, job: J, work: Coroutine[Any, Any, None]) -> bool:
        """Run `work` in its own Task (started at once where asyncio can: Python 3.12+); `work`
        must call `_ended(job)` when it is over, so no done callback is needed. True if the
        task is still running (an eager task may already have finished)."""
        assert self._loop is not None
        task = _task(self._loop, work)
        if task.done():
            return False
        self._running[job] = task
        return True

    def _ended(self, job: J) -> None:
        self._running.pop(job, None)
        if self._gone is not None:
            self._job_gone()
        self._job_ended()

    def _job_gone(self) -> None:
        """Wake the grace period's wait: a job ended (its task may live on, as a slot)."""
        gone = self._gone
        if gone is not None and not gone.done():
            gone.set_result(None)

    def _job_ended(self) -> None:
        """Hook: a job just ended (its slot is free)."""

    # ------------------------------------------------------------ transitions

    def _request_stop(self) -> None:
        assert self._stop is not None and self._hurry is not None
        if self._stop.is_set():
            self._log.warning("stopping now: failing the jobs still running")
            self._hurry.set()
            return
        self._log.info("stopping: finishing %d running job(s) first", len(self._running))
        self._stop.set()

    def _go_quiet(self) -> None:
        if self.state is not WorkerState.RUNNING:
            return
        self._log.info("quiet: taking no new jobs")
        self.state = WorkerState.QUIET
        self._quieted()

    def _go_running(self) -> None:
        if self.state is not WorkerState.QUIET or (self._stop and self._stop.is_set()):
            return
        self._log.info("running: taking jobs again")
        self.state = WorkerState.RUNNING
        self._resumed()

    def _quieted(self) -> None:
        """Hook: the worker just went quiet."""

    def _resumed(self) -> None:
        """Hook: the worker just went back to running."""

    async def _wind_down(self, fail: Callable[[J], None], verb: str) -> None:
        """Quiet, wait up to the grace period (or a hurry) for running jobs, then `fail` and
        cancel the rest; the state is TERMINATE afterwards."""
        assert self._hurry is not None
        self._go_quiet()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace_period
        while self._running and not self._hurry.is_set():
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            hurry = asyncio.ensure_future(self._hurry.wait())
            self._gone = gone = loop.create_future()
            await asyncio.wait(
                {*self._running.values(), hurry, gone},
                timeout=remaining,
                return_when=asyncio.FIRST_COMPLETED,
            )
            self._gone = None
            hurry.cancel()
        self.state = WorkerState.TERMINATE
        if self._running:
            self._log.warning("grace period over: %s %d running job(s)", verb, len(self._running))
        running = list(self._running.items())
        for job, task in running:
            fail(job)
            task.cancel()
        await asyncio.gather(*(task for _, task in running), return_exceptions=True)
        self._running.clear()  # a task cancelled before it started never called _ended


if sys.version_info >= (3, 12):

    def _task(
        loop: asyncio.AbstractEventLoop, work: Coroutine[Any, Any, None]
    ) -> asyncio.Task[None]:
        # Eager: runs up to its first real suspension now, so a job that never waits costs no
        # loop turn, and its result goes out with the read that brought it.
        return asyncio.Task(work, loop=loop, eager_start=True)

else:

    def _task(
        loop: asyncio.AbstractEventLoop, work: Coroutine[Any, Any, None]
    ) -> asyncio.Task[None]:
        # The loop's own method: `asyncio.create_task` adds a Python-level call and a name;
        # the loop is passed in, as `get_running_loop()` makes a getpid() system call.
        return loop.create_task(work)
