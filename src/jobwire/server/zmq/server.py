"""The ZeroMQ listener: Majordomo 0.1/0.2 with MMI and Titanic on one ROUTER, and an
optional Paranoid Pirate queue on two more, all on the server's event loop and engine."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass

from zmq.auth.thread import ThreadAuthenticator

import zmq
from jobwire.ports import key_value_store
from jobwire.server.auth import CLIENT, WORKER, Authenticator
from jobwire.server.runtime import Runtime
from jobwire.server.zmq.curve import CurveOptions, RoleCheck, start_authenticator
from jobwire.server.zmq.freelance import FreelanceServer
from jobwire.server.zmq.majordomo import MajordomoBroker
from jobwire.server.zmq.monitor import ConnectionMonitor
from jobwire.server.zmq.pirate import PirateQueue
from jobwire.server.zmq.sockets import Handler, RouterSocket
from jobwire.server.zmq.titanic import Titanic
from jobwire.server.zmq.wmp import WmpManager

log = logging.getLogger("jobwire.zmq")


#: Milliseconds a stopping server's sockets may take to send what is still queued.
CLOSE_LINGER_MS = 1000


@dataclass(slots=True)
class ZmqOptions:
    #: tcp://ADDRESS:PORT of the Majordomo ROUTER; None: no ZeroMQ listener.
    endpoint: str | None = "tcp://127.0.0.1:5555"
    #: Seconds between heartbeats (MDP), and heartbeats missed before a worker is dead.
    heartbeat: float = 2.5
    liveness: int = 3
    #: Seconds a request for a service nobody serves waits before its error reply.
    request_timeout: float = 60.0
    #: Larger messages close the sender's connection (ZMQ_MAXMSGSIZE).
    max_message: int = 64 * 1024 * 1024
    #: The Paranoid Pirate queue's endpoints (None: off), heartbeat and function.
    ppp_frontend: str | None = None
    ppp_backend: str | None = None
    ppp_heartbeat: float = 1.0
    ppp_function: str = "ppp"
    #: The Freelance ROUTER's bind endpoint (None: off) and its identity, the public
    #: endpoint clients connect to (None: the bind endpoint).
    freelance_bind: str | None = None
    freelance_endpoint: str | None = None
    #: The WMP manager's ROUTER (None: off), the heartbeat a worker that announces none is
    #: held to, the default lease of a job (seconds), and its identity (None: host:endpoint).
    wmp_bind: str | None = None
    wmp_heartbeat: float = 2.5
    wmp_lease: float = 300.0
    wmp_identity: str | None = None
    #: --zmq-curve-secret: CURVE on every endpoint (`curve.CurveOptions`); None: off.
    curve: CurveOptions | None = None
    #: --auth: the principals whose CURVE keys name their roles (needs `curve`).
    auth: Authenticator | None = None


class ZmqServer:
    def __init__(self, runtime: Runtime, options: ZmqOptions) -> None:
        self.runtime = runtime
        self.options = options
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.titanic = Titanic(runtime, key_value_store(runtime.store))
        self.broker = MajordomoBroker(self)
        self.pirate = PirateQueue(self)
        self.freelance = FreelanceServer(runtime.engine)
        self.wmp = WmpManager(runtime.engine, options, wmp_identity(options))
        self.router: RouterSocket | None = None
        #: Open connections per bound ROUTER (`connections`).
        self.monitors: list[ConnectionMonitor] = []
        self._timers: list[asyncio.TimerHandle] = []
        self._authenticator: ThreadAuthenticator | None = None

    def _gated(self, handler: Handler) -> Handler:
        """The passive server of a Binary Star pair answers no ZeroMQ request
        (`Runtime.admit`); without a pair the handler runs as it is."""
        runtime = self.runtime
        if runtime.gate is None:
            return handler

        def gated(identity: bytes, frames: list[bytes]) -> None:
            if runtime.admit():
                handler(identity, frames)

        return gated

    def start(self) -> None:
        """Bind the sockets (raises zmq.ZMQError if an endpoint is taken) and start beating."""
        loop = self.runtime.loop
        options = self.options
        # Between two reads a batch may go to an idle disk (the durable store), as after
        # any read; but ZeroMQ reads do not start the loop's busy polling (`--busy-poll`):
        # libzmq's own I/O thread moves the bytes and wakes the loop, and a loop spinning
        # on a second CPU takes the time that thread needs. On 2 CPUs, polling cost the
        # Majordomo benchmark a third of its requests/s and did not shorten the serial
        # round trip (bench/PERFORMANCE.md).
        runtime = self.runtime
        note_read = runtime.store.commit_if_idle if runtime.durable_store else None
        curve = options.curve
        roles = None
        if curve is not None:
            self._authenticator = start_authenticator(self.context, curve)
            if options.auth is not None:
                roles = RoleCheck(options.auth, self.router_send)
        if options.endpoint:
            self.router = RouterSocket(
                self.context,
                loop,
                options.endpoint,
                self._gated(self.broker.handle),
                max_message=options.max_message,
                on_read=note_read,
                curve=curve,
                check=roles.majordomo if roles is not None else None,
            )
            self.broker.router = self.router
            self._monitor("majordomo", self.router)
            log.info("jobwire listening on %s (zeromq: majordomo, titanic)", self.router.endpoint)
            self._every(options.heartbeat, self.broker.tick)
        if options.ppp_frontend and options.ppp_backend:
            self.pirate.frontend = RouterSocket(
                self.context,
                loop,
                options.ppp_frontend,
                self._gated(self.pirate.client_message),
                max_message=options.max_message,
                on_read=note_read,
                curve=curve,
                check=roles.fixed(CLIENT, "pirate frontend") if roles is not None else None,
            )
            self.pirate.backend = RouterSocket(
                self.context,
                loop,
                options.ppp_backend,
                self._gated(self.pirate.worker_message),
                max_message=options.max_message,
                on_read=note_read,
                curve=curve,
                check=roles.fixed(WORKER, "pirate backend") if roles is not None else None,
            )
            self._monitor("ppp", self.pirate.frontend)
            self._monitor("ppp", self.pirate.backend)
            log.info(
                "jobwire listening on %s and %s (zeromq: paranoid pirate)",
                self.pirate.frontend.endpoint,
                self.pirate.backend.endpoint,
            )
            self._every(options.ppp_heartbeat, self.pirate.tick)
        if options.freelance_bind:
            identity = options.freelance_endpoint or options.freelance_bind
            self.freelance.socket = RouterSocket(
                self.context,
                loop,
                options.freelance_bind,
                self._gated(self.freelance.handle),
                max_message=options.max_message,
                identity=identity.encode(),
                on_read=note_read,
                curve=curve,
                check=roles.fixed(CLIENT, "freelance") if roles is not None else None,
            )
            self._monitor("freelance", self.freelance.socket)
            log.info(
                "jobwire listening on %s (zeromq: freelance, identity %s)",
                self.freelance.socket.endpoint,
                identity,
            )

        if options.wmp_bind:
            self.wmp.socket = RouterSocket(
                self.context,
                loop,
                options.wmp_bind,
                self._gated(self.wmp.handle),
                max_message=options.max_message,
                on_read=note_read,
                curve=curve,
                check=roles.wmp(self.wmp.refuse) if roles is not None else None,
            )
            self._monitor("wmp", self.wmp.socket)
            log.info("jobwire listening on %s (zeromq: wmp)", self.wmp.socket.endpoint)
            self._every(options.wmp_heartbeat, self.wmp.tick)

    def _monitor(self, listener: str, router: RouterSocket) -> None:
        self.monitors.append(ConnectionMonitor(listener, router.sock, self.runtime.loop))

    def connections(self) -> dict[str, int]:
        """Open connections by listener (majordomo, ppp, freelance, wmp): the metrics'."""
        counts: dict[str, int] = {}
        for monitor in self.monitors:
            counts[monitor.listener] = counts.get(monitor.listener, 0) + monitor.count
        return counts

    def _every(self, seconds: float, tick: Callable[[], None]) -> None:
        loop = self.runtime.loop
        index = len(self._timers)

        def fire() -> None:
            try:
                tick()
            except Exception:
                log.exception("zeromq heartbeat failed")
            self._timers[index] = loop.call_later(seconds, fire)

        self._timers.append(loop.call_later(seconds, fire))

    def router_send(self, identity: bytes, frames: list[bytes]) -> None:
        if self.router is not None:
            self.router.send(identity, frames)

    def close(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self.broker.close()
        self.pirate.close()
        self.wmp.close()
        sockets = (
            self.router,
            self.pirate.frontend,
            self.pirate.backend,
            self.freelance.socket,
            self.wmp.socket,
        )
        for monitor in self.monitors:
            monitor.close()
        for sock in sockets:
            if sock is not None:
                sock.close()
        if self._authenticator is not None:
            self._authenticator.stop()
        # Closes any socket left open too (one a failed start made before its bind failed),
        # which would make `term` wait forever; what is still unsent gets a moment to go.
        self.context.destroy(linger=CLOSE_LINGER_MS)


def wmp_identity(options: ZmqOptions) -> str:
    """The WMP manager's identity in TAKE and CANCEL: `--wmp-id`, else host and endpoint."""
    if options.wmp_identity:
        return options.wmp_identity
    return f"{socket.gethostname()}/{options.wmp_bind or '-'}"
