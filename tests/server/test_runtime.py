"""The runtime's busy polling: after a read the loop polls on, without blocking, a while."""

from __future__ import annotations

import asyncio

import pytest

from jobwire.cli import serve
from jobwire.engine import Engine
from jobwire.server.runtime import BUSY_POLL, Runtime


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def turns(count: int = 2) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


def polling_runtime(window: float) -> tuple[Runtime, Clock]:
    runtime = Runtime(Engine(), asyncio.get_running_loop(), window)
    clock = Clock()
    runtime.monotonic = clock
    return runtime, clock


def test_a_read_keeps_the_loop_polling_until_a_window_passes_without_reads() -> None:
    async def main() -> None:
        runtime, clock = polling_runtime(0.001)
        assert not runtime.polling
        runtime.note_read()
        for _ in range(5):  # loop turns inside the window: a callback stays queued
            await turns(1)
            assert runtime.polling
        clock.now += 0.0005
        runtime.note_read()  # renews the window from the next turn
        await turns()
        clock.now += 0.0009  # 1.4 ms after the first read, 0.9 ms after the second
        await turns()
        assert runtime.polling
        clock.now += 0.0002
        await turns()
        assert not runtime.polling  # the loop blocks in its poller again
        runtime.note_read()  # and the next read starts another window
        assert runtime.polling

    asyncio.run(main())


def test_no_window_no_polling() -> None:
    async def main() -> None:
        runtime, _ = polling_runtime(0.0)
        runtime.note_read()
        assert not runtime.polling

    asyncio.run(main())


def test_the_command_line_default_is_the_servers() -> None:
    option = next(param for param in serve.params if param.name == "busy_poll")
    assert option.default == pytest.approx(BUSY_POLL * 1e6)
