"""One asyncio TCP connection to a Gearman server, on top of the sans-IO codec.

The connection frames bytes into packets and hands each one to its owner's callback; the
owner (a client session or a worker link) knows what the packets mean. The connection only
adds what every owner needs: a connect timeout, heartbeats, and output coalesced into one write
per read or loop turn (a syscall costs more than the Python that handles a packet).

Heartbeats follow the Paranoid Pirate pattern (ZeroMQ guide ch. 4) with ping-pong: any packet
from the server counts as a sign of life; after an interval of silence we send ECHO_REQ; after
`liveness` silent intervals in a row the server is declared dead and the connection aborted,
so a hung server or a silently dropped link is noticed instead of waited on forever. Liveness
is counted in timer ticks, not wall time, so a worker whose event loop was blocked for a while
loses one tick, not the connection.

Busy polling (`busy_poll`, for clients): a process asleep in epoll_wait is woken by the kernel
when a reply arrives, and on a virtual machine waking an idle vCPU takes tens of microseconds,
as long as the rest of a no-op job's round trip. So while its owner waits for a reply, the
connection keeps the loop polling without blocking for `busy_poll` seconds after each read or
write, yielding the CPU (sched_yield) on each pass so that a worker on the same core still runs
at once. The server does the same after its reads (`jobwire.server.runtime`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any, Final, cast

from mypy_extensions import mypyc_attr

from jobwire.protocols.gearman import Decoder, Packet, PacketType, encode_request
from jobwire.protocols.gearman.decoder import Message
from jobwire.sdk.errors import AuthenticationFailed, ServerUnavailable

log = logging.getLogger("jobwire.sdk")

DEFAULT_PORT = 4730
Address = tuple[str, int]

_PING = encode_request(PacketType.ECHO_REQ, b"")
_ECHO_RES: Final = 17  # an int constant, compared natively (compiled) with each packet's type
assert int(PacketType.ECHO_RES) == _ECHO_RES


def parse_address(text: str) -> Address:
    """`host`, `host:port` or `[v6-host]:port`; the port defaults to 4730."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":")
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, ""
    if not host:
        raise ValueError(f"no host in server address {text!r}")
    try:
        return host, int(port) if port else DEFAULT_PORT
    except ValueError:
        raise ValueError(f"bad port in server address {text!r}") from None


def format_address(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


#: Bytes read at most per read call; one buffer per connection, reused for every read.
READ_BUFFER = 256 * 1024
#: Lets another process on this CPU run while we poll (not on Windows, which has no such call).
_yield_cpu: Callable[[], None] = getattr(os, "sched_yield", lambda: None)


def _not_waiting() -> bool:
    return False


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled; tests subclass it
class Connection(asyncio.BufferedProtocol):
    """A Gearman connection that passes every server packet to `on_packet`.

    Reads go into one buffer per connection (no allocation per read); every packet of a read is
    handled before `after_read` is called once. Output comes two ways: `send` queues bytes and
    flushes them all in one write at the end of the current read (or on the next loop turn, if
    not called from a read), so a worker answers a read's jobs and asks for more in one write;
    `write` sends at once, for requests a caller waits on. `send_batched` is `send` that also
    writes as soon as `batch` messages are queued: a worker that finishes a whole wave of jobs
    in one turn then hands the server the first results while it finishes the rest, instead
    of the two taking turns (each idle while the other works on the same wave).

    `closed` resolves (never with an exception) when the connection is gone; `error` then says
    why (None for a close we asked for).
    """

    def __init__(
        self,
        address: Address,
        on_packet: Callable[[Packet], None],
        *,
        heartbeat: float | None = None,
        liveness: int = 3,
        after_read: Callable[[], None] | None = None,
        batch: int | None = None,
        busy_poll: float = 0.0,
    ) -> None:
        self.address = address
        self._batch = batch or 1 << 62
        self.name = format_address(address)
        self.on_packet = on_packet  # the owner's handler; it may hand over to another
        self._after_read = after_read
        self._decoder = Decoder(server_side=False)
        self._buffer = memoryview(bytearray(READ_BUFFER))
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._out: list[bytes] = []
        self._reading = False
        self._flush_due = False
        self._heartbeat = heartbeat
        self._liveness_max = liveness
        self._liveness = liveness
        self._heard = False
        self._timer: asyncio.TimerHandle | None = None
        self.heard_anything = False
        self.error: BaseException | None = None
        self.closed: asyncio.Future[None] = self._loop.create_future()
        #: Connected and `closed` not resolved yet: an attribute, not a property, because
        #: every packet sent checks it.
        self.is_open = False
        self._busy_poll = busy_poll
        #: The owner waits for a reply: while this says so, the connection busy-polls.
        self.waiting: Callable[[], bool] = _not_waiting
        self.polling = False  # a `_poll` callback is queued
        self._poll_until = 0.0  # the `time.monotonic()` at which polling stops
        self._poll_on: Callable[[], None] = self._poll  # bound once, queued on every pass

    @classmethod
    async def open(
        cls,
        address: Address,
        on_packet: Callable[[Packet], None],
        *,
        timeout: float,
        heartbeat: float | None = None,
        liveness: int = 3,
        after_read: Callable[[], None] | None = None,
        batch: int | None = None,
        busy_poll: float = 0.0,
        tls: ssl.SSLContext | None = None,
        token: str | None = None,
    ) -> Connection:
        """Connect within `timeout` seconds, or raise ServerUnavailable. `tls`: over TLS
        (the server's name checked as the context says). `token`: authenticate first with
        OPTION_REQ auth:TOKEN (AuthenticationFailed when refused)."""
        conn = cls(
            address,
            on_packet,
            heartbeat=heartbeat,
            liveness=liveness,
            after_read=after_read,
            batch=batch,
            busy_poll=busy_poll,
        )
        try:
            async with asyncio.timeout(timeout):
                if tls is None:
                    await conn._loop.create_connection(lambda: conn, *address)
                else:
                    await conn._loop.create_connection(
                        lambda: conn, *address, ssl=tls, server_hostname=address[0]
                    )
                if token is not None:
                    await conn._authenticate(token)
        except ssl.SSLError as exc:
            conn.abort(AuthenticationFailed(f"TLS with {conn.name} failed: {exc}"))
            raise AuthenticationFailed(f"TLS with {conn.name} failed: {exc}") from exc
        except (OSError, TimeoutError) as exc:
            conn.abort(ServerUnavailable(f"cannot connect to {conn.name}"))
            raise ServerUnavailable(f"cannot connect to {conn.name}: {exc or 'timed out'}") from exc
        return conn

    async def _authenticate(self, token: str) -> None:
        """OPTION_REQ auth:TOKEN, then wait for OPTION_RES (jobwire's extension)."""
        owner = self.on_packet
        answer: asyncio.Future[Packet] = self._loop.create_future()

        def reply(packet: Packet) -> None:
            if not answer.done():
                answer.set_result(packet)

        self.on_packet = reply
        try:
            self.write(encode_request(PacketType.OPTION_REQ, b"auth:" + token.encode()))
            waiters: list[asyncio.Future[Any]] = [answer, self.closed]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.on_packet = owner
        if not answer.done():
            raise AuthenticationFailed(f"{self.name} closed the connection during authentication")
        packet = answer.result()
        if packet.type != PacketType.OPTION_RES:
            detail = b" ".join(packet.args).decode("utf-8", "replace")
            self.abort(AuthenticationFailed(f"{self.name} refused the token: {detail}"))
            raise AuthenticationFailed(f"{self.name} refused the token: {detail}")

    # ------------------------------------------------------------ asyncio.BufferedProtocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not an isinstance check: uvloop's transports do not subclass asyncio.Transport.
        self._transport = cast(asyncio.Transport, transport)
        self.is_open = not self.closed.done()
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Requests are small and latency-bound; do not let Nagle hold them back.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._heartbeat:
            self._timer = self._loop.call_later(self._heartbeat, self._tick)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        # Every packet of the read, then `after_read` once; one function, as this runs once
        # per read (and a call costs as much as the rest of the handling of a small read).
        self._heard = self.heard_anything = True
        self._reading = True
        message: Message | None = None
        try:
            on_packet = self.on_packet
            for message in self._decoder.feed(self._buffer[:nbytes].tobytes()):
                if not isinstance(message, Packet):
                    self.abort(ServerUnavailable(f"{self.name} sent bad data: {message}"))
                    return
                if message.type == _ECHO_RES:
                    continue  # a heartbeat answer; hearing it was the point
                on_packet(message)
                if self.closed.done():
                    return
            if self._after_read is not None:
                message = None
                self._after_read()
        except ServerUnavailable as exc:  # the owner found the server talking nonsense
            log.warning("dropping the connection: %s", exc)
            self.abort(exc)
        except Exception as exc:  # a bug in the owner: the session's state is unknown
            what = repr(message) if message is not None else "a read"
            log.exception("handling %s from %s failed", what, self.name)
            self.abort(ServerUnavailable(f"internal error handling {what}: {exc}"))
        finally:
            self._reading = False
            if self._out:
                self._write_out()
            if self._busy_poll:
                self._poll_a_while()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.error is None and exc is not None:
            self.error = exc
        self._out.clear()
        self.is_open = False
        if not self.closed.done():
            self.closed.set_result(None)

    def eof_received(self) -> bool | None:
        if self.error is None:
            self.error = ServerUnavailable(f"{self.name} closed the connection")
        return None  # let asyncio close the transport

    # ------------------------------------------------------------ heartbeats

    def _tick(self) -> None:
        if self._heard:
            self._heard = False
            self._liveness = self._liveness_max
        else:
            self._liveness -= 1
            if self._liveness <= 0:
                log.warning("%s did not answer heartbeats; dropping the connection", self.name)
                self.abort(ServerUnavailable(f"{self.name} stopped answering heartbeats"))
                return
            self.send(_PING)
        assert self._heartbeat is not None
        self._timer = self._loop.call_later(self._heartbeat, self._tick)

    # ------------------------------------------------------------ output and closing

    def send(self, data: bytes) -> None:
        """Queue bytes for the server, written with everything else queued in this loop turn;
        ServerUnavailable if the connection is gone."""
        if not self.is_open:
            raise ServerUnavailable(f"connection to {self.name} is closed: {self.error}")
        self._out.append(data)
        if not self._reading:
            self.flush_later()

    def send_batched(self, data: bytes) -> None:
        """`send`, writing at once if `batch` messages are queued."""
        if not self.is_open:
            raise ServerUnavailable(f"connection to {self.name} is closed: {self.error}")
        out = self._out
        out.append(data)
        if len(out) >= self._batch:
            self._write_out()
        elif not self._reading and not self._flush_due:  # `flush_later`, inlined
            self._flush_due = True
            self._loop.call_soon(self.flush)

    def flush_later(self) -> None:
        """Flush on the next loop turn, after the callbacks already scheduled (say, the first
        steps of the tasks a read just started), so what they send goes out in one write."""
        if not self._flush_due:
            self._flush_due = True
            self._loop.call_soon(self.flush)

    def write(self, data: bytes) -> None:
        """Write bytes now (after anything queued); ServerUnavailable if the connection is gone."""
        if not self.is_open:
            raise ServerUnavailable(f"connection to {self.name} is closed: {self.error}")
        assert self._transport is not None
        if self._out:
            self._out.append(data)
            data = b"".join(self._out)
            self._out.clear()
        self._transport.write(data)
        if self._busy_poll:
            self._poll_a_while()

    def flush(self) -> None:
        """Write what `send` queued, in one write."""
        self._flush_due = False
        self._write_out()

    def _write_out(self) -> None:
        out = self._out
        if not out or not self.is_open:
            return
        assert self._transport is not None
        self._transport.write(out[0] if len(out) == 1 else b"".join(out))
        out.clear()

    # ------------------------------------------------------------ busy polling

    def _poll_a_while(self) -> None:
        """After a read or a write: poll for `busy_poll` seconds more, if the owner waits."""
        self._poll_until = time.monotonic() + self._busy_poll
        if not self.polling:
            self.polling = True
            self._loop.call_soon(self._poll_on)

    def _poll(self) -> None:
        """Once per loop turn while polling: a callback ready to run makes the loop poll for
        I/O without blocking."""
        if self.is_open and self.waiting() and time.monotonic() < self._poll_until:
            _yield_cpu()
            self._loop.call_soon(self._poll_on)
        else:
            self.polling = False

    def abort(self, error: BaseException) -> None:
        """Drop the connection at once (the server is presumed dead); unsent data is lost."""
        if self.error is None:
            self.error = error
        self._out.clear()
        if self._transport is not None:
            self._transport.abort()
        elif not self.closed.done():
            self.is_open = False
            self.closed.set_result(None)

    async def close(self, timeout: float = 5.0) -> None:
        """Flush what was sent, then close."""
        if self._transport is not None and not self.closed.done():
            self.flush()
            self._transport.close()
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.shield(self.closed)
            except TimeoutError:
                self._transport.abort()
