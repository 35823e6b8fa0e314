"""Majordomo clients: `MdpClient` (blocking, Lazy Pirate) and `AsyncMdpClient` (asyncio).

Both resend a request that gets no reply within `timeout` on a *new* socket (LINGER 0, so
nothing of the old one lingers), at most `retries` attempts in all, as the ZeroMQ Guide's
`lpclient`/`mdcliapi` count them, and then raise `ServerUnavailable`. A resent request is a
new request to the broker: a request whose reply was only slow may run more than once
(at least once, not exactly once). A job that runs longer than `timeout` is resent too,
so give long jobs a long `timeout` (or `None`: wait for ever, never resend).

Once a 0.2 PARTIAL has arrived the request is known to run: a later silence raises
`ServerUnavailable` instead of resending, so partial replies are never repeated.

An error reply from jobwire ([`\\x00jobwire:error`, status, text]: 404 no worker served the
service in time, 500 the job failed, 410 it was cancelled) raises `ServiceError`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from typing import Any

import zmq.asyncio

import zmq
from jobwire.protocols.zmq import mdp, services
from jobwire.protocols.zmq.mdp import MdpError, Version
from jobwire.sdk.errors import JobwireError, ServerUnavailable, ServiceError
from jobwire.sdk.zmq.common import (
    DEFAULT_ENDPOINT,
    as_name,
    body_of,
    raise_for_error,
    status_code,
    version_of,
)

OnPartial = Callable[[list[bytes]], None]


class BadReply(JobwireError):
    """The broker's answer is not a valid Majordomo reply to the request."""


class _NoReply(Exception):
    """Nothing arrived within the timeout."""


def _check(reply: mdp.Reply, version: Version, service: bytes) -> None:
    if reply.version is not version or reply.service != service:
        raise BadReply(
            f"a reply for {reply.service!r} (MDP {reply.version.value}) "
            f"to a request for {service!r} (MDP {version.value})"
        )


def _decode(frames: list[bytes]) -> mdp.Reply:
    try:
        return mdp.decode_reply(frames)
    except MdpError as exc:
        raise BadReply(str(exc)) from None


def _gave_up(service: bytes, attempts: int, timeout: float | None, partial: bool) -> Exception:
    name = service.decode("utf-8", "replace")
    if partial:
        return ServerUnavailable(f"{name}: the replies stopped after a partial one")
    return ServerUnavailable(f"{name}: no reply in {attempts} attempt(s) of {timeout}s")


def _mmi_answer(service: bytes, body: list[bytes]) -> bool:
    code = status_code(body[0]) if body else 0
    if code == 200:
        return True
    if code == 404:
        return False
    raise ServiceError(service.decode(), code, "unexpected MMI answer")


class MdpClient:
    """A blocking Majordomo client (Lazy Pirate).

        with MdpClient("tcp://127.0.0.1:5555") as client:
            frames = client.request("echo", b"hello")        # -> [b"hello"]
            client.mmi_service("echo")                        # -> True

    MDP 0.1 (default) talks through a REQ socket, as RFC 7 recommends; 0.2 through a DEALER
    (RFC 18 requires it), where `on_partial` gets each PARTIAL's frames before the FINAL
    is returned. Not thread-safe (ZeroMQ sockets are not): one client per thread.
    """

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        *,
        version: int | Version = Version.V1,
        timeout: float | None = 2.5,
        retries: int = 3,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        if retries < 1:
            raise ValueError("retries counts attempts: at least 1")
        self.endpoint = endpoint
        self.version = version_of(version)
        self.timeout = timeout
        self.retries = retries
        self._context = context if context is not None else zmq.Context.instance()
        self._sock: zmq.Socket[bytes] | None = None
        #: Sockets opened so far (one more after each timeout).
        self.sockets_opened = 0

    def __enter__(self) -> MdpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._discard()

    def _socket(self) -> zmq.Socket[bytes]:
        if self._sock is None:
            sock = self._context.socket(zmq.REQ if self.version is Version.V1 else zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.endpoint)
            self._sock = sock
            self.sockets_opened += 1
        return self._sock

    def _discard(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    def request(
        self, service: str | bytes, *frames: Any, on_partial: OnPartial | None = None
    ) -> list[bytes]:
        """Send a request (each frame by the payload rule) and return the reply's frames."""
        name = as_name(service)
        version = self.version
        wire = mdp.request(version, name, body_of(frames))
        if version is Version.V1:
            wire = wire[1:]  # REQ adds the empty frame
        attempts = 0
        while True:
            attempts += 1
            sock = self._socket()
            partial = [False]
            done = False
            try:
                sock.send_multipart(wire)
                body = self._await(sock, name, on_partial, partial)
                done = True
            except _NoReply:
                if partial[0] or attempts >= self.retries:
                    raise _gave_up(name, attempts, self.timeout, partial[0]) from None
                continue
            finally:
                if not done:  # timed out, interrupted, a bad reply: the socket is spent
                    self._discard()
            raise_for_error(name, body)
            return body

    def _await(
        self,
        sock: zmq.Socket[bytes],
        service: bytes,
        on_partial: OnPartial | None,
        partial: list[bool],
    ) -> list[bytes]:
        timeout = None if self.timeout is None else int(self.timeout * 1000)
        while True:
            if not sock.poll(timeout):
                raise _NoReply
            frames = sock.recv_multipart()
            if self.version is Version.V1:
                frames.insert(0, b"")  # REQ strips it
            reply = _decode(frames)
            _check(reply, self.version, service)
            if reply.final:
                return list(reply.body)
            partial[0] = True
            if on_partial is not None:
                on_partial(list(reply.body))

    def mmi_service(self, name: str | bytes) -> bool:
        """RFC 8 `mmi.service`: does a worker serve `name` now?"""
        return _mmi_answer(services.MMI_SERVICE, self.request(services.MMI_SERVICE, name))

    def services(self) -> list[str]:
        """jobwire's `mmi.services`: the names that have a worker now."""
        body = self.request(services.MMI_SERVICES, b"")
        if not body or status_code(body[0]) != 200:
            code = status_code(body[0]) if body else 0
            raise ServiceError("mmi.services", code, "not supported by this broker")
        return [name.decode("utf-8", "replace") for name in body[1:]]


class AsyncMdpClient:
    """An asyncio Majordomo client with many requests in flight (`zmq.asyncio`).

        async with AsyncMdpClient("tcp://127.0.0.1:5555", concurrency=64) as client:
            frames = await client.request("echo", b"hello")
            async for reply in client.stream("tokens", b"prompt"):   # PARTIALs, then FINAL
                print(reply.final, reply.body)

    MDP 0.2 (default; 0.1 also works) through DEALER sockets. A Majordomo reply carries no
    request id, so replies are matched to requests by socket: each request in flight has a
    DEALER of its own, taken from a pool of up to `concurrency` sockets (more requests wait
    for a free one). A socket goes back to the pool only after its request's FINAL, so no
    late reply can reach the next request; one that timed out or was abandoned is closed.
    """

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        *,
        version: int | Version = Version.V2,
        concurrency: int = 64,
        timeout: float | None = 2.5,
        retries: int = 3,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if retries < 1:
            raise ValueError("retries counts attempts: at least 1")
        self.endpoint = endpoint
        self.version = version_of(version)
        self.concurrency = concurrency
        self.timeout = timeout
        self.retries = retries
        self._context = context if context is not None else zmq.asyncio.Context.instance()
        self._idle: list[zmq.asyncio.Socket] = []
        self._slots = asyncio.Semaphore(concurrency)
        self._closed = False
        #: Sockets opened so far (the pool grows to `concurrency`, plus one per timeout).
        self.sockets_opened = 0

    async def __aenter__(self) -> AsyncMdpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the idle sockets; those of requests still in flight close as they end."""
        self._closed = True
        while self._idle:
            self._idle.pop().close(linger=0)

    def _socket(self) -> zmq.asyncio.Socket:
        if self._idle:
            return self._idle.pop()
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        self.sockets_opened += 1
        return sock

    def _release(self, sock: zmq.asyncio.Socket, clean: bool) -> None:
        if clean and not self._closed:
            self._idle.append(sock)
        else:
            sock.close(linger=0)

    async def request(
        self, service: str | bytes, *frames: Any, on_partial: OnPartial | None = None
    ) -> list[bytes]:
        """Send a request and return the FINAL's frames; `on_partial` gets each PARTIAL's."""
        async with contextlib.aclosing(self.stream(service, *frames)) as replies:
            async for reply in replies:
                if reply.final:
                    return list(reply.body)
                if on_partial is not None:
                    on_partial(list(reply.body))
        raise AssertionError("a stream ends with its FINAL")  # pragma: no cover

    async def stream(self, service: str | bytes, *frames: Any) -> AsyncGenerator[mdp.Reply, None]:
        """The replies to a request: each PARTIAL (0.2), then the FINAL (`reply.final`).

        An error reply raises `ServiceError` instead of being yielded."""
        if self._closed:
            raise RuntimeError("the client is closed")
        name = as_name(service)
        version = self.version
        wire = mdp.request(version, name, body_of(frames))
        timeout = None if self.timeout is None else int(self.timeout * 1000)
        async with self._slots:
            attempts = 0
            while True:
                attempts += 1
                sock = self._socket()
                clean = False
                partial = False
                try:
                    await sock.send_multipart(wire)
                    while True:
                        if not await sock.poll(timeout):
                            raise _NoReply
                        reply = _decode(await sock.recv_multipart())
                        _check(reply, version, name)
                        if reply.final:
                            clean = True  # nothing more comes on this socket
                            raise_for_error(name, reply.body)
                            yield reply
                            return
                        partial = True
                        yield reply
                except _NoReply:
                    if partial or attempts >= self.retries:
                        raise _gave_up(name, attempts, self.timeout, partial) from None
                finally:
                    self._release(sock, clean)

    async def mmi_service(self, name: str | bytes) -> bool:
        """RFC 8 `mmi.service`: does a worker serve `name` now?"""
        body = await self.request(services.MMI_SERVICE, name)
        return _mmi_answer(services.MMI_SERVICE, body)
