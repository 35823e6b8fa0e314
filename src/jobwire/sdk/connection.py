"""One asyncio TCP connection to a Gearman server, on top of the sans-IO codec.

The connection frames bytes into packets and hands each one to its owner's callback; the
owner (a client session or a worker link) knows what the packets mean. The connection only
adds what every owner needs: a connect timeout and heartbeats.

Heartbeats follow the Paranoid Pirate pattern (ZeroMQ guide ch. 4) with ping-pong: any packet
from the server counts as a sign of life; after an interval of silence we send ECHO_REQ; after
`liveness` silent intervals in a row the server is declared dead and the connection aborted,
so a hung server or a silently dropped link is noticed instead of waited on forever. Liveness
is counted in timer ticks, not wall time, so a worker whose event loop was blocked for a while
loses one tick, not the connection.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

from jobwire.protocols.gearman import Decoder, Packet, PacketType, encode_request
from jobwire.sdk.errors import ServerUnavailable

log = logging.getLogger("jobwire.sdk")

DEFAULT_PORT = 4730
Address = tuple[str, int]

_PING = encode_request(PacketType.ECHO_REQ, b"")


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


class Connection(asyncio.Protocol):
    """A Gearman connection that passes every server packet to `on_packet`.

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
    ) -> None:
        self.address = address
        self.name = format_address(address)
        self._on_packet = on_packet
        self._decoder = Decoder(server_side=False)
        self._transport: asyncio.Transport | None = None
        self._heartbeat = heartbeat
        self._liveness_max = liveness
        self._liveness = liveness
        self._heard = False
        self._timer: asyncio.TimerHandle | None = None
        self.heard_anything = False
        self.error: BaseException | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @classmethod
    async def open(
        cls,
        address: Address,
        on_packet: Callable[[Packet], None],
        *,
        timeout: float,
        heartbeat: float | None = None,
        liveness: int = 3,
    ) -> Connection:
        """Connect within `timeout` seconds, or raise ServerUnavailable."""
        conn = cls(address, on_packet, heartbeat=heartbeat, liveness=liveness)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                await loop.create_connection(lambda: conn, *address)
        except (OSError, TimeoutError) as exc:
            raise ServerUnavailable(f"cannot connect to {conn.name}: {exc or 'timed out'}") from exc
        return conn

    @property
    def is_open(self) -> bool:
        return self._transport is not None and not self.closed.done()

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Requests are small and latency-bound; do not let Nagle hold them back.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._heartbeat:
            self._timer = asyncio.get_running_loop().call_later(self._heartbeat, self._tick)

    def data_received(self, data: bytes) -> None:
        self._heard = self.heard_anything = True
        for message in self._decoder.feed(data):
            if not isinstance(message, Packet):
                self.abort(ServerUnavailable(f"{self.name} sent bad data: {message}"))
                return
            if message.type == PacketType.ECHO_RES:
                continue  # a heartbeat answer; hearing it was the point
            try:
                self._on_packet(message)
            except ServerUnavailable as exc:  # the owner found the server talking nonsense
                log.warning("dropping the connection: %s", exc)
                self.abort(exc)
                return
            except Exception as exc:  # a bug in the owner: the session's state is unknown
                log.exception("handling %r from %s failed", message, self.name)
                self.abort(ServerUnavailable(f"internal error handling {message!r}: {exc}"))
                return
            if self.closed.done():
                return

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.error is None and exc is not None:
            self.error = exc
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
        self._timer = asyncio.get_running_loop().call_later(self._heartbeat, self._tick)

    # ------------------------------------------------------------ output and closing

    def send(self, data: bytes) -> None:
        """Queue bytes for the server; ServerUnavailable if the connection is gone."""
        if not self.is_open:
            raise ServerUnavailable(f"connection to {self.name} is closed: {self.error}")
        assert self._transport is not None
        self._transport.write(data)

    def abort(self, error: BaseException) -> None:
        """Drop the connection at once (the server is presumed dead); unsent data is lost."""
        if self.error is None:
            self.error = error
        if self._transport is not None:
            self._transport.abort()
        elif not self.closed.done():
            self.closed.set_result(None)

    async def close(self, timeout: float = 5.0) -> None:
        """Flush what was sent, then close."""
        if self._transport is not None and not self.closed.done():
            self._transport.close()
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.shield(self.closed)
            except TimeoutError:
                self._transport.abort()
