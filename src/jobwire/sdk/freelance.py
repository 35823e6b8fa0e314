"""Freelance clients (RFC 10): brokerless reliability, the three models of the ZeroMQ Guide.

Each talks to Freelance servers directly: jobwire with `--freelance-port` (its requests
run as jobs of `service`, on a worker of any protocol), or any RFC 10 server whose body is
`[service, frames...]`. A request is `[control, service, frames...]`, the control frame a
sequence number; the server answers `[control, reply...]`.

- `FailoverClient` (the Guide's model 1, `flclient1`): a REQ socket per attempt, `timeout`
  1 s; one endpoint is tried `retries` (3) times, several endpoints each once, in order.
- `ShotgunClient` (model 2, `flclient2`): one DEALER connected to every server; each
  request `['', seq, service, frames...]` goes to every server, the first reply whose
  sequence matches wins, the others are dropped; a global `timeout` of 2.5 s.
- `FreelanceClient` (model 3, `flcliapi`, "complex and nasty"): a background agent thread
  with a ROUTER that addresses servers by their endpoint (their ROUTER identity). It pings
  idle servers every `ping_interval` (2 s), holds a server dead after `server_ttl` (6 s) of
  silence, sends each request to the first live server, resends it to the next one after
  `resend` (1 s) without an answer, and fails after the global `timeout` (3 s). Its poll
  timeout is tickless (the next thing due), so an idle agent wakes only to ping.

    with FreelanceClient(["tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555"]) as client:
        frames = client.request("echo", b"hello")                  # -> [b"hello"]

A resent request is a new job: a request whose reply was only slow may run more than once
(at least once), and the shotgun runs every request once per server. jobwire's error reply
([`\\x00jobwire:error`, status, text]: 404, 500 the job failed, 410 cancelled) raises
`ServiceError`, as with the Majordomo clients; no reply in time raises `ServerUnavailable`.
ZeroMQ sockets are not thread-safe: a `FailoverClient` or `ShotgunClient` is for one thread;
a `FreelanceClient`'s `request` may be called from several threads (one request at a time).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, Final

import zmq
from jobwire.protocols.zmq.freelance import PING, PONG
from jobwire.sdk.errors import ServerUnavailable
from jobwire.sdk.zmq.common import as_name, body_of, raise_for_error

__all__ = [
    "GLOBAL_TIMEOUT",
    "PING_INTERVAL",
    "SERVER_TTL",
    "FailoverClient",
    "FreelanceClient",
    "ShotgunClient",
]

Context = zmq.Context[zmq.Socket[bytes]]

#: The Guide's settings for the agent (flcliapi): seconds.
GLOBAL_TIMEOUT: Final = 3.0
PING_INTERVAL: Final = 2.0
SERVER_TTL: Final = 6.0
#: How often the agent pings a server it has not heard yet (its first ping may be sent
#: before the connection is up, and ROUTER drops what it cannot route).
FIRST_PING: Final = 0.05


def _endpoints(endpoints: str | Iterable[str]) -> list[str]:
    found = [endpoints] if isinstance(endpoints, str) else list(endpoints)
    if not all(isinstance(endpoint, str) and endpoint for endpoint in found):
        raise ValueError("endpoints are non-empty strings such as tcp://host:port")
    return found


def _reply(service: bytes, body: Sequence[bytes]) -> list[bytes]:
    body = list(body)
    raise_for_error(service, body)
    return body


class FailoverClient:
    """Simple retry and failover (the Guide's model 1): a new REQ socket per attempt.

    One endpoint: up to `retries` attempts of `timeout` seconds each. Several: each endpoint
    once, in order. Then `ServerUnavailable`.
    """

    def __init__(
        self,
        endpoints: str | Iterable[str],
        *,
        timeout: float = 1.0,
        retries: int = 3,
        context: Context | None = None,
    ) -> None:
        self.endpoints = _endpoints(endpoints)
        if not self.endpoints:
            raise ValueError("no endpoints given")
        if retries < 1:
            raise ValueError("retries counts attempts: at least 1")
        self.timeout = timeout
        self.retries = retries
        self._context = context if context is not None else zmq.Context.instance()
        self._sequence = itertools.count(1)

    def __enter__(self) -> FailoverClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing stays open between requests; here for symmetry."""

    def request(self, service: str | bytes, *frames: Any) -> list[bytes]:
        """Send a request (each frame by the payload rule) and return the reply's frames."""
        name = as_name(service)
        body = body_of(frames)
        tries = self.endpoints * self.retries if len(self.endpoints) == 1 else list(self.endpoints)
        for endpoint in tries:
            control = str(next(self._sequence)).encode()
            reply = self._try(endpoint, [control, name, *body], control)
            if reply is not None:
                return _reply(name, reply)
        raise ServerUnavailable(
            f"{name.decode('utf-8', 'replace')}: no reply in {len(tries)} attempt(s) "
            f"of {self.timeout}s"
        )

    def _try(self, endpoint: str, wire: list[bytes], control: bytes) -> list[bytes] | None:
        sock = self._context.socket(zmq.REQ)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
            sock.send_multipart(wire)
            end = time.monotonic() + self.timeout
            # REQ takes only the reply to its request; the control frame is checked anyway.
            if not sock.poll(max(0, int((end - time.monotonic()) * 1000))):
                return None
            reply = sock.recv_multipart()
            return reply[1:] if reply and reply[0] == control else None
        finally:
            sock.close(linger=0)


class ShotgunClient:
    """The brutal shotgun (the Guide's model 2): every request to every server at once.

    One DEALER connects to all `endpoints` (and to those given to `connect` later); a
    request `['', seq, service, frames...]` is sent once per server (DEALER spreads the
    copies round robin over its connections), the first reply carrying `seq` is returned
    and later ones are dropped. No reply within `timeout`: `ServerUnavailable`.
    """

    def __init__(
        self,
        endpoints: str | Iterable[str] = (),
        *,
        timeout: float = 2.5,
        context: Context | None = None,
    ) -> None:
        self.timeout = timeout
        self.endpoints: list[str] = []
        self._context = context if context is not None else zmq.Context.instance()
        self._sock: zmq.Socket[bytes] = self._context.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sequence = 0
        for endpoint in _endpoints(endpoints):
            self.connect(endpoint)

    def __enter__(self) -> ShotgunClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close(linger=0)

    def connect(self, endpoint: str) -> None:
        self._sock.connect(endpoint)
        self.endpoints.append(endpoint)

    def request(self, service: str | bytes, *frames: Any) -> list[bytes]:
        """Send the request to every server; the first matching reply's frames."""
        if not self.endpoints:
            raise ValueError("no endpoints: connect to a server first")
        name = as_name(service)
        self._sequence += 1
        control = str(self._sequence).encode()
        wire = [b"", control, name, *body_of(frames)]
        sock = self._sock
        for _ in self.endpoints:
            sock.send_multipart(wire)
        end = time.monotonic() + self.timeout
        while True:
            left = end - time.monotonic()
            if left <= 0 or not sock.poll(int(left * 1000) + 1):
                raise ServerUnavailable(
                    f"{name.decode('utf-8', 'replace')}: no reply from "
                    f"{len(self.endpoints)} server(s) within {self.timeout}s"
                )
            reply = sock.recv_multipart()
            # [b"", control, reply...]; an older request's late replies are dropped.
            if len(reply) >= 2 and reply[0] == b"" and reply[1] == control:
                return _reply(name, reply[2:])


# ---------------------------------------------------------------------------- the agent

_CONNECT: Final = b"CONNECT"
_REQUEST: Final = b"REQUEST"
_STOP: Final = b"STOP"
_OK: Final = b"OK"
_FAILED: Final = b"FAILED"


class _Server:
    """What the agent knows of one server (its endpoint is its identity)."""

    __slots__ = ("alive", "endpoint", "expires", "identity", "ping_at")

    def __init__(self, endpoint: str, now: float, ttl: float) -> None:
        self.endpoint = endpoint
        self.identity = endpoint.encode()
        self.alive = False  # answered within the TTL
        self.ping_at = now  # the next ping is due
        self.expires = now + ttl


class _Agent:
    """The background thread's state: a ROUTER to the servers, a PAIR pipe to the caller."""

    def __init__(
        self,
        context: Context,
        pipe_address: str,
        *,
        timeout: float,
        ping_interval: float,
        server_ttl: float,
        resend: float,
    ) -> None:
        self.timeout = timeout
        self.ping_interval = ping_interval
        self.server_ttl = server_ttl
        self.resend = resend
        self.pipe = context.socket(zmq.PAIR)
        self.pipe.setsockopt(zmq.LINGER, 0)
        self.pipe.connect(pipe_address)
        self.router = context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        # A message for a server that is not connected raises EHOSTUNREACH instead of
        # vanishing: the agent then tries the next server at once.
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.servers: dict[bytes, _Server] = {}
        self.order: list[_Server] = []  # in the order they were connected
        self.sequence = 0
        self.request: list[bytes] | None = None  # [control, service, frames...]
        self.expires = 0.0  # the request's global deadline
        self.resend_at = 0.0  # when the request goes to the next server
        self.tried: list[_Server] = []  # servers sent the request, in order
        self.stalled = False  # the request waits for a server to come alive

    # ---------------------------------------------------------------- the loop

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.pipe, zmq.POLLIN)
        poller.register(self.router, zmq.POLLIN)
        try:
            while True:
                due = self._next_due()
                wait = None if due is None else max(0, int((due - time.monotonic()) * 1000) + 1)
                events = dict(poller.poll(wait))
                if self.pipe in events and not self._command():
                    return
                if self.router in events:
                    self._replies()
                now = time.monotonic()
                self._expire(now)
                if self.request is not None:
                    self._dispatch(now)
                self._ping(now)
        finally:
            self.router.close(linger=0)
            self.pipe.close(linger=0)

    def _next_due(self) -> float | None:
        """Tickless: the next time anything is due (a ping, an expiry, a resend)."""
        times = [server.ping_at for server in self.order]
        times += [server.expires for server in self.order if server.alive]
        if self.request is not None:
            times += [self.expires, self.resend_at]
        return min(times) if times else None

    def _command(self) -> bool:
        """A message from the caller; False to stop."""
        message = self.pipe.recv_multipart()
        command = message[0]
        if command == _STOP:
            return False
        if command == _CONNECT:
            endpoint = message[1].decode()
            server = _Server(endpoint, time.monotonic(), self.server_ttl)
            if server.identity not in self.servers:
                self.router.connect(endpoint)
                self.servers[server.identity] = server
                self.order.append(server)
        elif command == _REQUEST:
            if self.request is not None:  # pragma: no cover - the caller holds a lock
                self.pipe.send_multipart([_FAILED, b"a request is already in flight"])
                return True
            self.sequence += 1
            self.request = [str(self.sequence).encode(), *message[1:]]
            now = time.monotonic()
            self.expires = now + self.timeout
            self.resend_at = now  # send at once
            self.tried = []
            self.stalled = False
        return True

    def _replies(self) -> None:
        while True:
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if not frames:  # pragma: no cover - a ROUTER always gives the identity
                continue
            server = self.servers.get(frames[0])
            if server is None:
                continue
            now = time.monotonic()
            if not server.alive and self.stalled:
                self.resend_at = now  # a waiting request can go now
                self.stalled = False
            server.alive = True
            server.ping_at = now + self.ping_interval
            server.expires = now + self.server_ttl
            body = frames[1:]
            if body == [PONG] or len(body) < 1:
                continue
            if self.request is not None and body[0] == self.request[0]:
                self.pipe.send_multipart([_OK, *body[1:]])
                self.request = None

    def _expire(self, now: float) -> None:
        for server in self.order:
            if server.alive and now >= server.expires:
                server.alive = False  # silent too long: dead until it answers again

    def _dispatch(self, now: float) -> None:
        assert self.request is not None
        if now >= self.expires:
            tried = ", ".join(server.endpoint for server in self.tried) or "no live server"
            self.pipe.send_multipart(
                [_FAILED, f"no reply within {self.timeout}s (sent to: {tried})".encode()]
            )
            self.request = None
            return
        if now < self.resend_at:
            return
        # The first live server not tried yet; once all have been, start over.
        for _ in range(2):
            for server in self.order:
                if server.alive and server not in self.tried and self._send(server):
                    self.tried.append(server)
                    self.resend_at = now + self.resend
                    return
            if not self.tried:
                break
            self.tried = []
        # No live server to send to: wait until one answers a ping (or the deadline).
        self.resend_at = self.expires
        self.stalled = True

    def _send(self, server: _Server) -> bool:
        assert self.request is not None
        try:
            self.router.send_multipart([server.identity, *self.request], zmq.NOBLOCK)
        except zmq.ZMQError:  # not connected (EHOSTUNREACH) or full: it is not live
            server.alive = False
            return False
        return True

    def _ping(self, now: float) -> None:
        for server in self.order:
            if now < server.ping_at:
                continue
            try:
                self.router.send_multipart([server.identity, PING], zmq.NOBLOCK)
                sent = True
            except zmq.ZMQError:
                sent = False
            # A server never heard, or whose ping could not go out, is asked again soon.
            quick = not sent or not server.alive
            server.ping_at = now + (FIRST_PING if quick else self.ping_interval)


class FreelanceClient:
    """The Guide's model 3: a background agent sends each request to the first live server.

    `endpoints` (and `connect`) name servers by the endpoint that is also their identity
    (jobwire's `--freelance-endpoint`, by default `tcp://ADDRESS:PORT` of
    `--freelance-port`). See the module docstring for the settings.
    """

    def __init__(
        self,
        endpoints: str | Iterable[str] = (),
        *,
        timeout: float = GLOBAL_TIMEOUT,
        ping_interval: float = PING_INTERVAL,
        server_ttl: float = SERVER_TTL,
        resend: float = 1.0,
        context: Context | None = None,
    ) -> None:
        self.timeout = timeout
        self.endpoints: list[str] = []
        self._context = context if context is not None else zmq.Context.instance()
        address = f"inproc://jobwire-freelance-{id(self):x}-{time.monotonic_ns():x}"
        self._pipe: zmq.Socket[bytes] = self._context.socket(zmq.PAIR)
        self._pipe.setsockopt(zmq.LINGER, 0)
        self._pipe.bind(address)
        agent = _Agent(
            self._context,
            address,
            timeout=timeout,
            ping_interval=ping_interval,
            server_ttl=server_ttl,
            resend=resend,
        )
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=agent.run, name="jobwire-freelance", daemon=True)
        self._thread.start()
        self._closed = False
        for endpoint in _endpoints(endpoints):
            self.connect(endpoint)

    def __enter__(self) -> FreelanceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the agent and close its sockets."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._pipe.send_multipart([_STOP])
            self._thread.join()
            self._pipe.close(linger=0)

    def connect(self, endpoint: str) -> None:
        """Add a server; the agent pings it until it answers, then sends it requests."""
        (endpoint,) = _endpoints(endpoint)
        with self._lock:
            self._check_open()
            self._pipe.send_multipart([_CONNECT, endpoint.encode()])
            self.endpoints.append(endpoint)

    def request(self, service: str | bytes, *frames: Any) -> list[bytes]:
        """Send a request (each frame by the payload rule) and return the reply's frames."""
        name = as_name(service)
        body = body_of(frames)
        with self._lock:
            self._check_open()
            self._pipe.send_multipart([_REQUEST, name, *body])
            answer = self._pipe.recv_multipart()  # the agent always answers, by its deadline
        if answer[0] == _FAILED:
            reason = answer[1].decode("utf-8", "replace") if len(answer) > 1 else ""
            raise ServerUnavailable(f"{name.decode('utf-8', 'replace')}: {reason}")
        return _reply(name, answer[1:])

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the client is closed")
