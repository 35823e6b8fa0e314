"""Bounds on what one client can take from the server, shared by the TCP listeners.

Connections are counted in total and per source address across the Gearman and HTTP
listeners (a WebSocket is an HTTP connection); one over either bound is refused with a clear
error and closed. A connection that sends nothing (or, with authentication on, never
authenticates) within `idle_timeout` is closed. A peer that leaves more than `max_output`
bytes of replies unread is closed while the others are served. HTTP requests have header
and body read timeouts and header size and count limits (aiohttp's own settings where it has
them); a WebSocket has a message rate per connection.

The listeners keep the checks off their hot paths: admission and the idle timer run once
per connection, the output cap only while a peer's writes are paused.

Authentication (issue 37 part A) hooks in through `ConnectionTable.settle_on_data`: set it
False and a connection stays unsettled, and is closed after `idle_timeout`, until the
listener calls `IdleGuard.settle()` for it (after its credentials were accepted).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

log = logging.getLogger("jobwire.limits")

MiB: Final = 1024 * 1024


@dataclass(slots=True)
class Limits:
    """The `serve` flags of the same names (README "Limits"); 0 turns a bound off."""

    #: Open connections on the Gearman and HTTP ports together.
    max_connections: int = 10_000
    #: Open connections from one source address.
    max_connections_per_ip: int = 1_000
    #: Seconds a connection may stay without sending anything (or, with authentication on,
    #: without authenticating) before it is closed.
    idle_timeout: float = 60.0
    #: Bytes of replies a peer may leave unread (Gearman, WebSocket) before it is closed.
    max_output: int = 64 * MiB
    #: Seconds an HTTP request's header may take to arrive, from its first byte.
    http_header_timeout: float = 10.0
    #: Seconds an HTTP request's body may take to arrive.
    http_body_timeout: float = 30.0
    #: Longest HTTP request line or header field, in bytes (aiohttp's max_line_size and
    #: max_field_size).
    http_max_header_size: int = 8190
    #: Most header fields in one HTTP request (aiohttp's max_headers).
    http_max_headers: int = 128
    #: WebSocket messages per second one connection may send (a burst of as many is
    #: allowed); over it the socket is closed with 1008.
    ws_rate: int = 1000


class IdleGuard:
    """Closes its connection unless `settle()` is called within the timeout."""

    __slots__ = ("handle",)

    def __init__(
        self, loop: asyncio.AbstractEventLoop, timeout: float, close: Callable[[], None]
    ) -> None:
        self.handle: asyncio.TimerHandle | None = (
            loop.call_later(timeout, close) if timeout > 0 else None
        )

    def settle(self) -> None:
        handle = self.handle
        if handle is not None:
            handle.cancel()
            self.handle = None

    @property
    def settled(self) -> bool:
        return self.handle is None


class ConnectionTable:
    """Open connections of every TCP listener, in total and per source address."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.total = 0
        self.per_address: dict[str, int] = {}
        #: False when authentication is on: a connection's bytes do not settle it, its
        #: authentication does (the listener calls `IdleGuard.settle`).
        self.settle_on_data = True
        self.refused = 0  # connections refused since start

    def admit(self, address: str) -> str | None:
        """Count a new connection from `address`; or the reason it is refused (not counted)."""
        limits = self.limits
        if limits.max_connections and self.total >= limits.max_connections:
            self.refused += 1
            return f"too many connections (at most {limits.max_connections})"
        count = self.per_address.get(address, 0)
        if limits.max_connections_per_ip and count >= limits.max_connections_per_ip:
            self.refused += 1
            return (
                f"too many connections from {address} "
                f"(at most {limits.max_connections_per_ip} per address)"
            )
        self.total += 1
        self.per_address[address] = count + 1
        return None

    def release(self, address: str) -> None:
        """A connection `admit` counted has closed."""
        self.total -= 1
        count = self.per_address.get(address, 0) - 1
        if count > 0:
            self.per_address[address] = count
        else:
            self.per_address.pop(address, None)

    def guard(self, loop: asyncio.AbstractEventLoop, close: Callable[[], None]) -> IdleGuard | None:
        """The idle timer of a new connection, or None when idle connections may stay."""
        timeout = self.limits.idle_timeout
        return IdleGuard(loop, timeout, close) if timeout > 0 else None


class MessageRate:
    """A token bucket: `rate` messages per second, bursts of up to `rate`."""

    __slots__ = ("last", "rate", "tokens")

    def __init__(self, rate: int, now: float) -> None:
        self.rate = float(rate)
        self.tokens = float(rate)
        self.last = now

    def allow(self, now: float) -> bool:
        tokens = min(self.rate, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if tokens < 1.0:
            self.tokens = tokens
            return False
        self.tokens = tokens - 1.0
        return True
