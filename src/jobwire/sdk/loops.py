"""Event loops for the SDK's own threads and processes: uvloop where it is installed.

uvloop (a dependency everywhere but Windows) does a socket read or write for a fraction of the
CPU asyncio's pure-Python transports spend, which is most of what a worker does per job.
`AsyncClient` runs on whatever loop its caller runs; `Worker.run` and the blocking `Client` pick
their own loop here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
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
