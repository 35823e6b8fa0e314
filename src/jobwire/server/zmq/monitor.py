"""Open ZeroMQ connections per listener, for `jobwire_connections{listener=...}`.

libzmq accepts and closes the TCP connections of a bound ROUTER itself, so the server
never sees them; its socket monitor reports them as events on a PAIR socket of their own.
Each `ConnectionMonitor` follows one ROUTER's monitor from the event loop (its descriptor
with `loop.add_reader`, drained until empty: like the ROUTER's, it is edge-triggered) and
keeps a count: +1 per EVENT_ACCEPTED, -1 per EVENT_DISCONNECTED, which libzmq reports for
every accepted connection that ends, whether the peer left, broke the protocol or sent a
message over the size limit. EVENT_CLOSED is not counted: libzmq reports it for the
listening socket and for connections this side made, never for an accepted one. The events
come once per connection, not per message, so the monitor costs the message path nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from zmq.utils.monitor import parse_monitor_message

import zmq

log = logging.getLogger("jobwire.zmq")

_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED


class ConnectionMonitor:
    """The open connections of one bound socket, from its monitor's events."""

    def __init__(
        self, listener: str, sock: zmq.Socket[bytes], loop: asyncio.AbstractEventLoop
    ) -> None:
        self.listener = listener
        self.count = 0
        self.closed = False
        self._sock = sock
        self._loop = loop
        self._pipe: zmq.Socket[bytes] = sock.get_monitor_socket(_EVENTS)
        self._fd = int(self._pipe.getsockopt(zmq.FD))
        loop.add_reader(self._fd, self._drain)
        loop.call_soon(self._drain)  # events may have come before we watched

    def _drain(self) -> None:
        if self.closed:
            return
        while True:
            try:
                frames = self._pipe.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError as exc:  # closing
                log.debug("monitor of %s: %s", self.listener, exc)
                return
            try:
                event = parse_monitor_message(frames)["event"]
            except (ValueError, KeyError, IndexError) as exc:
                log.debug("monitor of %s: unreadable event: %s", self.listener, exc)
                continue
            if event == zmq.EVENT_ACCEPTED:
                self.count += 1
            elif event == zmq.EVENT_DISCONNECTED and self.count > 0:
                self.count -= 1

    def close(self) -> None:
        """Stop following (before the ROUTER is closed)."""
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self._fd)
        with contextlib.suppress(zmq.ZMQError):  # the socket is already closing
            self._sock.disable_monitor()
        self._pipe.close(linger=0)
