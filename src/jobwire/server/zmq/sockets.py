"""A ZeroMQ ROUTER socket on the server's event loop, without futures.

pyzmq's `zmq.asyncio` makes a future per receive; the leanest integration (the one pyzmq's
maintainer suggests, and the faster one here: bench/zmq_integration.py) watches the
socket's file descriptor with `loop.add_reader` and drains it with non-blocking receives.
The descriptor is edge-triggered: it signals when messages *become* readable, so every
wake-up drains until EAGAIN, and since a send may consume that signal, the socket is
checked again at the end of any loop turn that sent something, unless the send came from a
handler inside the drain (which receives again after each handler anyway).

Frames go through pyzmq's backend `Socket.recv`/`send` directly, with int flags: its
`recv_multipart`/`send_multipart` cost several times more per frame (bench/PERFORMANCE.md,
ZeroMQ round 2), because they build `SNDMORE | flags` as an enum per frame and look the
`RCVMORE` option up as an enum per frame. A frame received without copying carries its
`more` flag, which saves that option call; its bytes are copied out at once. Before each
receive, `zmq_poll` with no timeout says whether a message waits: a receive that finds none
raises `zmq.Again`, whose construction (pyzmq builds its message in Python) costs eight
times the poll, and every wake-up would end in one.

Where `jobwire._zmqframes` is built (C, `jobwire.server.zmq.wholemessages`), a whole
message goes in or out in one call instead: no Python object per frame, no GIL release per
frame, and a receive that finds nothing returns None, so the poll goes too. The role-checked
path (CURVE with --auth) stays on pyzmq, which reads the sender's User-Id property.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from zmq.backend import Socket as _BackendSocket
from zmq.backend import zmq_poll

import zmq
from jobwire.server.zmq.wholemessages import RecvMessage, SendMessage, recv_message, send_message

if TYPE_CHECKING:
    from jobwire.server.zmq.curve import Check, CurveOptions

log = logging.getLogger("jobwire.zmq")

#: Messages handled per wake-up before other callbacks get the loop (fairness).
BATCH = 512

Handler = Callable[[bytes, list[bytes]], None]

_NOBLOCK: Final[int] = zmq.NOBLOCK.value
_MORE: Final[int] = zmq.NOBLOCK.value | zmq.SNDMORE.value
_POLLIN: Final[int] = zmq.POLLIN.value
_recv: Final = _BackendSocket.recv
_send: Final = _BackendSocket.send
_poll: Final = zmq_poll


class RouterSocket:
    """One bound ROUTER; `handler(identity, frames)` for every message received."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        loop: asyncio.AbstractEventLoop,
        endpoint: str,
        handler: Handler,
        *,
        max_message: int,
        identity: bytes | None = None,
        on_read: Callable[[], None] | None = None,
        curve: CurveOptions | None = None,
        check: Check | None = None,
    ) -> None:
        self.loop = loop
        self.handler = handler
        self.on_read = on_read
        #: With CURVE and --auth: each message's sender key (its ZAP User-Id) is checked.
        self.check = check
        sock = context.socket(zmq.ROUTER)
        if curve is not None:
            from jobwire.server.zmq.curve import make_curve_server

            make_curve_server(sock, curve)
        sock.setsockopt(zmq.LINGER, 0)
        # A message larger than this closes the sender's connection (libzmq's rule).
        sock.setsockopt(zmq.MAXMSGSIZE, max_message)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        if identity is not None:
            sock.setsockopt(zmq.IDENTITY, identity)
        sock.bind(endpoint)
        self.sock = sock
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        # int(): pyzmq types the option as int | bytes | str (the build may lack pyzmq too).
        self._fd = int(sock.getsockopt(zmq.FD))
        #: Whole-message calls (None: pyzmq's per-frame calls), kept on the socket with
        #: libzmq's socket as pyzmq gives it (`underlying`, a Python int): as a compiled
        #: int it would be boxed again on every call, and a module global is a dict lookup.
        self._recv_whole: RecvMessage | None = recv_message
        self._send_whole: SendMessage | None = send_message
        self._handle: Any = sock.underlying if recv_message is not None else None
        self._poll_items: list[tuple[zmq.Socket[bytes], int]] = [(sock, _POLLIN)]
        self._check_due = False
        #: True while `_readable` drains: a send from a handler needs no check of its own.
        self._reading = False
        self.closed = False
        loop.add_reader(self._fd, self._readable)
        loop.call_soon(self._readable)  # messages may have arrived before we watched

    def _readable(self) -> None:
        self._check_due = False
        if self.closed:
            return
        # Each drain loop below receives again after every handler, until a receive finds
        # nothing; that receive (or the poll before it) takes libzmq's pending commands
        # as any send does. So what a handler's send may have taken off the descriptor is
        # seen by the loop itself, and such sends schedule no check (`send`).
        self._reading = True
        try:
            if self.check is not None:
                self._read_checked()
            elif self._recv_whole is not None:
                self._read_whole()
            else:
                self._read_frames()
        finally:
            self._reading = False

    def _read_frames(self) -> None:
        """`_readable` with pyzmq's per-frame calls."""
        sock = self.sock
        items = self._poll_items
        for _ in range(BATCH):
            try:
                if not _poll(items, 0):
                    return
                frame = _recv(sock, _NOBLOCK, False)
                identity = frame.bytes
                frames: list[bytes] = []
                while frame.more:
                    frame = _recv(sock, _NOBLOCK, False)
                    frames.append(frame.bytes)
            except zmq.Again:
                return
            except zmq.ZMQError as exc:  # the socket is closing
                log.debug("receive failed on %s: %s", self.endpoint, exc)
                return
            if self.on_read is not None:
                self.on_read()
            try:
                self.handler(identity, frames)
            except Exception:  # one bad message must not stop the socket
                log.exception("handling a message on %s failed", self.endpoint)
        self._schedule_check()  # more may be waiting: go on after other callbacks

    def _read_whole(self) -> None:
        """`_readable` with one call per message (`jobwire._zmqframes`)."""
        receive = self._recv_whole
        assert receive is not None
        handle = self._handle
        for _ in range(BATCH):
            try:
                message = receive(handle)
            except OSError as exc:  # the socket is closing
                log.debug("receive failed on %s: %s", self.endpoint, exc)
                return
            if message is None:
                return
            if self.on_read is not None:
                self.on_read()
            try:
                self.handler(message[0], message[1])
            except Exception:  # one bad message must not stop the socket
                log.exception("handling a message on %s failed", self.endpoint)
        self._schedule_check()  # more may be waiting: go on after other callbacks

    def _read_checked(self) -> None:
        """`_readable` with a role check: frames as zmq.Frame, to read the sender's key."""
        check = self.check
        assert check is not None
        for _ in range(BATCH):
            try:
                parts = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            except zmq.ZMQError as exc:
                log.debug("receive failed on %s: %s", self.endpoint, exc)
                return
            if self.on_read is not None:
                self.on_read()
            if len(parts) < 1:
                continue
            user_id = str(parts[0].get("User-Id") or "")
            frames = [part.bytes for part in parts]
            try:
                if check(frames[0], frames[1:], user_id):
                    self.handler(frames[0], frames[1:])
            except Exception:
                log.exception("handling a message on %s failed", self.endpoint)
        self._schedule_check()

    def send(self, identity: bytes, frames: list[bytes]) -> None:
        """Send to a peer; dropped if the peer is gone or not reading (ROUTER's rule)."""
        if self.closed:
            return
        send_whole = self._send_whole
        if send_whole is not None:
            try:
                send_whole(self._handle, identity, frames)
            except OSError as exc:
                log.debug("dropped a message to %r: %s", identity[:32], exc)
            if not self._reading:
                self._schedule_check()
            return
        sock = self.sock
        last = len(frames) - 1
        try:
            if last < 0:
                _send(sock, identity, _NOBLOCK)
            else:
                _send(sock, identity, _MORE)
                for i in range(last):
                    _send(sock, frames[i], _MORE)
                _send(sock, frames[last], _NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("dropped a message to %r: %s", identity[:32], exc)
        if not self._reading:
            self._schedule_check()

    def _schedule_check(self) -> None:
        if not self._check_due:
            self._check_due = True
            self.loop.call_soon(self._readable)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.remove_reader(self._fd)
        self.sock.close(linger=0)
