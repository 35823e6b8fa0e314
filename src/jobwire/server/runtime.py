"""What every listener shares on the event loop: the engine, its timers, batched writes,
and the one commit barrier.

`Runtime` drives the engine's timer heap with a single loop timer, flushes the output of
every connection touched during a loop turn once, at the end of the turn, keeps the loop
polling for a short while after each read (`busy_poll`), and drives the store's committer.

The commit barrier: a listener acknowledges nothing ("accepted", "done") before what it
announces is durable. It asks `after_durable(callback)` (or awaits `durable()`), which
calls back once everything written so far is committed, or has failed. A commit that
fails retracts the new jobs it carried through one engine call (`Engine.retract`) before
any callback hears of it, so each listener only has to turn its acknowledgement into an
error. The committer is driven from here too: a batch may go to an idle disk between two
reads (`note_read`), and commits are polled for while a long read is worked through
(`poll_commits`).

Busy polling: a process asleep in epoll_wait is woken by the kernel when data arrives,
and on a virtual machine that wake-up (an interrupt to an idle vCPU, a context switch)
takes tens of microseconds, longer than the server spends on a job. A job's round trip
crosses the server several times (a submit, a worker's grab, its result), each one a
wake-up. So after a read the loop goes on polling without blocking for `busy_poll`
seconds, renewed by every read meanwhile, and sees the next request at once; then it
blocks as usual. Idle, it costs nothing; under load the loop is busy anyway; in between
it spends at most `busy_poll` of CPU per read. `jobwire serve --busy-poll 0` turns it off.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from jobwire.engine import Engine, StoreUnavailable
from jobwire.ports import Committer
from jobwire.ports.cluster import ClusterView, RemoteJobs
from jobwire.server.limits import ConnectionTable
from jobwire.store.base import MemoryStore

log = logging.getLogger("jobwire")


#: Seconds the loop keeps polling after a read, by default: longer than a peer on this
#: host takes to wake up and answer (a worker's grab after its NOOP, a client's next submit).
BUSY_POLL = 100e-6


class Runtime:
    def __init__(
        self,
        engine: Engine,
        loop: asyncio.AbstractEventLoop,
        busy_poll: float = 0.0,
        store: Committer | None = None,
    ) -> None:
        self.engine = engine
        self.loop = loop
        #: The store's committer (the memory store's commits are immediate).
        self.store: Committer = store if store is not None else MemoryStore()
        #: The jobs of the cluster's other nodes, for status queries; None: no cluster.
        self.cluster: ClusterView | None = None
        #: Operations on jobs the cluster's other nodes hold; None: every job is local.
        self.remote: RemoteJobs | None = None
        #: False: every barrier passes at once.
        self.durable_store = self.store.durable
        # Bound once: the hot path calls them per read and per packets of a long read.
        self.poll_commits: Callable[[], None] = self.store.poll
        self._commit_if_idle: Callable[[], None] = self.store.commit_if_idle
        self.store.on_failure(engine.retract)
        #: Asked by every listener before it serves a client (a Binary Star pair's vote,
        #: `jobwire.server.bstar`); None: always serve.
        self.gate: Callable[[], bool] | None = None
        #: Called when this server becomes the active one of a Binary Star pair.
        self.on_active: list[Callable[[], None]] = []
        #: Stops the server (set by it): `on_shutdown(graceful)`; None: not possible here.
        self.on_shutdown: Callable[[bool], None] | None = None
        #: This server's Binary Star state ("primary", "backup", "active", "passive"), for
        #: the refusals that tell clients why; None: not one of a pair.
        self.role: Callable[[], str | None] = lambda: None
        self.busy_poll = busy_poll  # seconds; 0: block in the poller as soon as idle
        #: Open connections of the TCP listeners and their bounds (`server/limits.py`).
        self.connections = ConnectionTable()
        self._polling = False  # a `_poll_on` callback is queued
        self._read_since = False  # a read happened since `_poll_on` last ran
        self._poll_until = 0.0  # the `monotonic()` time at which polling stops
        self._poll_on: Callable[[], None] = self._keep_polling
        self.monotonic: Callable[[], float] = time.monotonic
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        # The `flush` of each connection touched this turn, bound by the connection once:
        # compiled, calling `conn.flush()` on a protocol type looked the method up by name.
        self._dirty: list[Callable[[], None]] = []
        self._flush_scheduled = False
        # Bound once: `self.flush_all` would make a new method object every loop turn.
        self._flush_all: Callable[[], None] = self.flush_all
        engine.timers.on_earlier = self._arm
        self._rearm()

    # ---------------------------------------------------------------- batched writes

    def mark_dirty(self, flush: Callable[[], None]) -> None:
        """Call a connection's `flush` at the end of this loop turn (callers track their own
        dirty flag)."""
        self._dirty.append(flush)
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
        for flush in dirty:
            flush()

    def request_shutdown(self, graceful: bool) -> None:
        """An operator asked the server to stop (Gearman's `shutdown [graceful]`)."""
        if self.on_shutdown is not None:
            self.on_shutdown(graceful)

    def admit(self) -> bool:
        """Serve a client now? Always, unless this is the passive server of a pair."""
        gate = self.gate
        return gate is None or gate()

    # ---------------------------------------------------------------- commit barrier

    def after_durable(self, callback: Callable[[bool], None]) -> None:
        """Call `callback(ok)` once everything written so far is durable (at once when
        nothing is pending), or `callback(False)` if its commit failed; the new jobs of a
        failed commit are retracted by then."""
        if self.durable_store:
            self.store.after_commit(callback)
        else:
            callback(True)

    async def durable(self) -> None:
        """Wait until everything written so far is durable; raise StoreUnavailable if its
        commit failed."""
        store = self.store
        if not self.durable_store or not store.pending():
            return
        future: asyncio.Future[bool] = self.loop.create_future()

        def done(ok: bool) -> None:
            if not future.done():
                future.set_result(ok)

        store.after_commit(done)
        if not await future:
            raise StoreUnavailable("the store could not commit")

    # ---------------------------------------------------------------- busy polling

    @property
    def polling(self) -> bool:
        """The loop polls without blocking, for a while after the latest read."""
        return self._polling

    def note_read(self) -> None:
        """A connection read a request: a batch written before it may go to an idle disk
        now; keep the loop polling a while (see the module)."""
        if self.durable_store:
            self._commit_if_idle()
        if self._polling:
            self._read_since = True  # cheaper than reading the clock on every read
        elif self.busy_poll > 0:
            self._polling = True
            self._read_since = False
            self._poll_until = self.monotonic() + self.busy_poll
            self.loop.call_soon(self._poll_on)

    def _keep_polling(self) -> None:
        """Once per loop turn while polling: a callback ready to run makes the loop poll
        for I/O without blocking."""
        now = self.monotonic()
        if self._read_since:
            self._read_since = False
            self._poll_until = now + self.busy_poll
        if now < self._poll_until:
            self.loop.call_soon(self._poll_on)
        else:
            self._polling = False

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
