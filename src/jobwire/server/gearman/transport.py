"""A Gearman connection's transport side: reads in, batched replies out.

Every complete request in a read is handled before anything is written, and each
connection writes at most once per loop turn (`Runtime.mark_dirty`), except NOOP and
NO_JOB (`send_now`). Output that announces something the store must keep waits for its
commit (`acks`). The requests themselves are handled by the subclass,
`handlers.GearmanConnection`, as the `Sink` of this connection's `Scanner`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from jobwire.engine import Engine
from jobwire.protocols.gearman.replies import error
from jobwire.protocols.gearman.scanner import Scanner, Sink
from jobwire.server.errors import count_error
from jobwire.server.gearman.acks import Acks
from jobwire.server.limits import IdleGuard

if TYPE_CHECKING:
    from jobwire.server.gearman.gate import Gate
    from jobwire.server.gearman.server import GearmanOptions, GearmanServer

log = logging.getLogger("jobwire.gearman")


def _closed() -> bool:
    return True


def _drop(data: bytes) -> None:
    pass


class Transport(Sink, asyncio.Protocol):
    """One client or worker connection: transport events and output."""

    def __init__(self, server: GearmanServer) -> None:
        self.server = server
        self.engine: Engine = server.engine
        self.scanner = Scanner(self, server.id_prefix, server.options.max_packet)
        self.transport: asyncio.Transport | None = None
        # The transport's `write` and `is_closing`, bound once: compiled, calling a method
        # by name looks it up in the transport's type on every call.
        self._write: Callable[[bytes], None] = _drop
        self._is_closing: Callable[[], bool] = _closed
        #: `flush`, bound once, for the runtime to call at the end of a loop turn.
        self.flush_later: Callable[[], None] = self.flush
        self.out: list[bytes] = []
        self.dirty = False
        # Output positions count every entry ever queued on `out`; `sent` is out[0]'s.
        self.sent = 0
        self.acks = Acks(self, server.runtime)
        self.durable = self.acks.durable
        self.closing = False
        self.write_paused = False  # the transport's buffer is over its high-water mark
        self.conn_id = 0
        self.fd = -1
        self.peer_ip = "-"
        self.push_due = False  # `before_flush` has work: do it before the next flush
        # In `data_received`: a commit reported meanwhile (`Acks.poll`) must not flush the
        # replies of the read, which are not held yet.
        self.reading = False
        #: The time of this read's submits: read once, at the first (0: not yet).
        self.now = 0.0
        #: Output a peer leaves unread beyond this is a peer we stop serving (`--max-output`).
        self.max_output = server.runtime.connections.limits.max_output or (1 << 62)
        #: Closes the connection if it stays silent (unauthenticated) too long; None once
        #: it spoke (or idle connections may stay).
        self.idle: IdleGuard | None = None
        self.admitted = False  # counted in the runtime's connection table
        #: With --auth: what this connection's principal may send (`gate.Gate`); None: all.
        self.gate: Gate | None = None
        self.principal = "-"  # the principal's name, once known

    # ------------------------------------------------------------ transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self._write = self.transport.write
        self._is_closing = self.transport.is_closing
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self.fd = sock.fileno()
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self.server.options.keepalive:
                    _set_keepalive(sock, self.server.options)
            except OSError:
                pass
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and peer:
            self.peer_ip = str(peer[0])

    def data_received(self, data: bytes) -> None:
        if self.closing:  # refused, or closing after a fatal error: nothing more is read
            return
        if self.idle is not None and self.server.runtime.connections.settle_on_data:
            self.idle.settle()
            self.idle = None
        self.server.runtime.note_read()
        acks = self.acks
        count_before = acks.count
        was_dirty = self.dirty
        self.dirty = True  # sends below need not mark the connection: done once at the end
        self.reading = True
        self.now = 0.0
        try:
            gate = self.gate
            if gate is None:
                self.scanner.feed(data)
            else:
                gate.feed(data)
        finally:
            self.reading = False
        if acks.count != count_before:
            acks.hold(self.sent, self.sent + len(self.out))
        if not was_dirty:
            runtime = self.server.runtime
            if runtime.idle_turn and not acks.holds:
                # Nothing else waits for the end of the turn: the replies go now, a loop
                # pass sooner (on a serial round trip, the worker's JOB_ASSIGN).
                self.flush()
            else:
                # Written at the end of the loop turn, with whatever other reads of this turn
                # add (a client's JOB_CREATED together with results of its jobs), and after
                # the events this read made for other connections, which a job waits for.
                runtime.mark_dirty(self.flush_later)

    def tick(self) -> None:
        """Sink: every 16 packets of a long read. A durable store's commits are polled for:
        a read of many submits runs for tens of microseconds, and other clients'
        acknowledgements need not wait."""
        if self.durable:
            self.acks.poll()

    def pause_writing(self) -> None:
        # The peer reads slower than we answer: stop reading its requests until it catches up.
        self.write_paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.transport is not None and not self.closing:
            self.transport.resume_reading()

    def settle_idle(self) -> None:
        """Authenticated: the idle timeout for unauthenticated connections no longer applies."""
        if self.idle is not None:
            self.idle.settle()
            self.idle = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self.idle is not None:
            self.idle.settle()
            self.idle = None
        if self.admitted:
            self.admitted = False
            self.server.runtime.connections.release(self.peer_ip)
        self.sent += len(self.out)
        self.out.clear()
        # The bound methods hold the transport, which holds this protocol.
        self._write, self._is_closing = _drop, _closed

    # ------------------------------------------------------------ for the subclass

    def before_flush(self) -> None:
        """`push_due` was set: work to do before the next flush."""
        raise NotImplementedError

    # ------------------------------------------------------------ output

    def send(self, data: bytes) -> None:
        self.out.append(data)
        if not self.dirty:
            self.dirty = True
            self.server.runtime.mark_dirty(self.flush_later)

    def send_now(self, data: bytes) -> None:
        """Write at once, ahead of this turn's batch: for NOOP and NO_JOB.

        They go out at most once each time a worker runs dry, so writing them alone costs
        no batching under load, and it takes a write off the critical path of the next job
        (the worker sleeps, or is woken, before the other replies of this turn are written).
        """
        transport = self.transport
        if (
            transport is not None
            and not self.out
            and not self.acks.holds
            and not self.closing
            and not self.write_paused
        ):
            self._write(data)
            self.sent += 1
        else:
            self.send(data)

    def flush(self) -> None:
        if self.push_due:
            self.before_flush()
        self.dirty = False
        out = self.out
        acks = self.acks
        count = acks.released - self.sent if acks.holds else len(out)
        if count <= 0:
            if self.closing and not out and self.transport is not None:
                self.transport.close()  # closing with nothing left to say
            return
        transport = self.transport
        if transport is None or self._is_closing():
            transport = None  # gone: drop what was meant for it
            count = len(out)
        elif count == 1:
            self._write(out[0])
        else:
            self._write(b"".join(out[:count]))
        if count == len(out):
            out.clear()
        else:
            del out[:count]
        self.sent += count
        if transport is None:
            return
        if self.closing and not acks.holds:
            transport.close()
        elif self.write_paused and transport.get_write_buffer_size() > self.max_output:
            log.warning(
                "closing %s: it left over %d bytes of replies unread", self.peer_ip, self.max_output
            )
            self.closing = True
            transport.abort()

    def error(self, code: str, text: str) -> None:
        count_error("gearman_" + code)
        self.send(error(code, text))

    def close_after_flush(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.pause_reading()
        if not self.dirty:
            self.dirty = True
            self.server.runtime.mark_dirty(self.flush_later)


def _set_keepalive(sock: socket.socket, options: GearmanOptions) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, options.keepalive_idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, options.keepalive_interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, options.keepalive_count)
