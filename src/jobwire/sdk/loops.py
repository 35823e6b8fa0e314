"""Event loops for the SDK's own threads and processes: uvloop where it is installed.

uvloop (a dependency everywhere but Windows) does a socket read or write for a fraction of the
CPU asyncio's pure-Python transports spend, which is most of what a worker does per job.
`AsyncClient` runs on whatever loop its caller runs; `Worker.run` picks its loop here, and the
blocking `Client` runs a `CallerLoop`, which the threads that call it run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run`, on uvloop if it is installed (its I/O costs a fraction of asyncio's)."""
    try:
        import uvloop
    except ImportError:  # Windows: uvloop does not exist there
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's if it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class CallerLoop:
    """A private event loop run by the threads that wait on it, for the blocking `Client`.

    A loop in a thread of its own costs every blocking call two hand-offs between threads, a
    wake-up each way: on a 2-core VM, 0.273 ms p50 per foreground round trip against 0.226. Here
    the calling thread runs the loop itself until its own work is done, so a blocking call costs
    what the same call costs on `AsyncClient`. Between calls nothing runs: connections stay open
    and what arrives waits in the socket.

    Calls from several threads share the loop (leader and followers): one thread runs it, the
    others hand it their work and wait until that work is done or the loop is free, and then one
    of them runs it. Callbacks of the work therefore run in whichever thread runs the loop.
    """

    def __init__(self) -> None:
        # asyncio's own loop: uvloop sets up signal handling (a socket pair) on every run in the
        # main thread, which costs a call more than uvloop's faster I/O saves.
        self.loop = asyncio.new_event_loop()
        self._turn = threading.Condition()
        self._leading = False  # a thread is running the loop

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` on the loop and return its result (or raise its exception)."""
        if self.loop.is_closed():
            work.close()
            raise RuntimeError("the loop is closed")
        running = asyncio._get_running_loop()
        if running is self.loop:
            work.close()
            raise RuntimeError("a blocking call from the loop's own callbacks would deadlock")
        if running is not None:
            # This thread runs another loop, which cannot pause for ours: a helper thread waits.
            return _in_helper_thread(lambda: self.run(work))
        with self._turn:
            lead = not self._leading
            self._leading = True
        if lead:
            return self._lead(self.loop.create_task(_stop_after(work, self.loop)))
        return self._follow(asyncio.run_coroutine_threadsafe(work, self.loop))

    def _lead(self, task: asyncio.Task[T]) -> T:
        try:
            # Not run_until_complete: that stops the loop from a done callback, one loop
            # iteration after the work ends; the work stops the loop itself (`_stop_after`).
            while not task.done():
                self.loop.run_forever()
            return task.result()
        except BaseException:
            task.cancel()  # e.g. KeyboardInterrupt: the next turn of the loop ends the work
            raise
        finally:
            self._hand_over()

    def _follow(self, future: concurrent.futures.Future[T]) -> T:
        future.add_done_callback(self._notify)
        try:
            while True:
                with self._turn:
                    while self._leading and not future.done():
                        self._turn.wait()
                    if future.done():
                        return future.result()
                    self._leading = True
                try:
                    self.loop.run_until_complete(asyncio.wrap_future(future, loop=self.loop))
                finally:
                    self._hand_over()
        except BaseException:
            future.cancel()
            raise

    def try_hold(self) -> bool:
        """Take the loop without running it, if no thread runs it now: for work that only
        queues callbacks and writes to sockets (the loop's own thread rules hold, since no
        other thread runs it meanwhile). True if taken; give it back with `release`."""
        if self.loop.is_closed() or asyncio._get_running_loop() is not None:
            return False
        with self._turn:
            if self._leading:
                return False
            self._leading = True
            return True

    def release(self) -> None:
        """Give back a loop taken with `try_hold`."""
        self._hand_over()

    def _hand_over(self) -> None:
        with self._turn:
            self._leading = False
            self._turn.notify_all()

    def _notify(self, _: object) -> None:
        with self._turn:
            self._turn.notify_all()

    def close(self) -> None:
        self.loop.close()


async def _stop_after(work: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop) -> T:
    """`work`, then stop `loop` (which returns from `run_forever` after this iteration)."""
    try:
        return await work
    finally:
        loop.stop()


def _in_helper_thread(call: Callable[[], T]) -> T:
    outcome: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            failure.append(exc)

    helper = threading.Thread(target=target, name="jobwire-client-call", daemon=True)
    helper.start()
    helper.join()
    if failure:
        raise failure[0]
    return outcome[0]
