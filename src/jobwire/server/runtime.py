"""What every listener shares on the event loop: the engine, its timers, batched writes.

`Runtime` drives the engine's timer heap with a single loop timer and flushes the output
of every connection touched during a loop turn once, at the end of the turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from jobwire.engine import Engine

log = logging.getLogger("jobwire")


class Flushable(Protocol):
    def flush(self) -> None: ...


class Runtime:
    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.loop = loop
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._dirty: list[Flushable] = []
        self._flush_scheduled = False
        # Bound once: `self.flush_all` would make a new method object every loop turn.
        self._flush_all: Callable[[], None] = self.flush_all
        engine.timers.on_earlier = self._arm
        self._rearm()

    # ---------------------------------------------------------------- batched writes

    def mark_dirty(self, conn: Flushable) -> None:
        """Flush `conn` at the end of this loop turn (callers track their own dirty flag)."""
        self._dirty.append(conn)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush_all)

    @property
    def idle_turn(self) -> bool:
        """No connection waits for the end of this loop turn to be written."""
        return not self._dirty

    def flush_all(self) -> None:
        """Write the output of every connection touched in this turn."""
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, []
        for conn in dirty:
            conn.flush()

    # ---------------------------------------------------------------- timers

    def _arm(self, when: float) -> None:
        if self._timer_at is not None and self._timer_at <= when:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        # The engine keeps wall-clock deadlines; the loop's timer runs on its own clock.
        delay = max(0.0, when - time.time())
        self._timer = self.loop.call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = None
        try:
            self.engine.run_timers()
        except Exception:  # a bug in one timer must not stop all the others
            log.exception("timer callback failed")
        self._rearm()

    def _rearm(self) -> None:
        deadline = self.engine.timers.next_deadline()
        if deadline is not None:
            self._arm(deadline)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def call_safely(fn: Callable[[], None], what: str) -> None:
    try:
        fn()
    except Exception:
        log.exception("%s failed", what)
