"""Tasks shared by the Gearman `Worker` and the `RotaWorker`: registration and running.

A task is a function of one job. `async def` tasks run on the worker's event loop; plain
functions each run in their own daemon thread (`in_thread`), so a task that blocks forever
costs only its thread and cannot keep the process from exiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

J = TypeVar("J")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Task(Generic[J]):
    name: str
    func: Callable[[J], Any]
    timeout: float | None
    is_async: bool


def check_timeout(timeout: float | None) -> None:
    if timeout is not None and timeout <= 0:
        raise ValueError("timeout must be positive")


def is_async(func: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(func)


def decorator(register: Callable[[Callable[..., Any]], None]) -> Callable[[F], F]:
    """A decorator that hands the function to `register` and returns it unchanged."""

    def wrap(func: F) -> F:
        register(func)
        return func

    return wrap


async def invoke(task: Task[J], job: J, convert: Callable[[Any], R], thread_name: str) -> R:
    """Run `task` for `job` and `convert` its return value (in the task's thread, if any)."""
    if task.is_async:
        return convert(await task.func(job))
    func = task.func
    return await in_thread(lambda: convert(func(job)), thread_name)


async def in_thread(call: Callable[[], R], name: str) -> R:
    """Run `call` in its own daemon thread and await its result on the running loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[R] = loop.create_future()

    def settle(result: R | None, error: BaseException | None) -> None:
        if future.done():  # timed out or cancelled meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(cast(R, result))

    def target() -> None:
        result: R | None = None
        error: BaseException | None = None
        try:
            result = call()
        except Exception as exc:
            error = exc
        except BaseException as exc:  # SystemExit and friends must not cross into the loop
            error = RuntimeError(f"task raised {exc!r}")
        with contextlib.suppress(RuntimeError):  # the worker's loop is gone
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, name=name, daemon=True).start()
    return await future
