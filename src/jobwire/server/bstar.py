"""Binary Star on the server: a primary/backup pair, state published over PUB/SUB.

Each server binds a PUB socket (`--bstar-local`) and subscribes to its peer's
(`--bstar-remote`); every `heartbeat` seconds it publishes its state, and every state it
hears drives the state machine (`protocols.zmq.bstar`). Every listener asks the runtime's
gate before serving a client (`Runtime.admit`: a Gearman connection, an HTTP request or
WebSocket, a ZeroMQ message), which is the client vote: a passive server whose peer has
gone silent becomes active on the first client that asks. Dual actives or dual passives
stop the server with an error.

What failover means for the store: with the local SQLite store each server has its own
queue, and the backup starts from its own (as the Guide's pattern intends: no state is
replicated). A shared store (PostgreSQL, later) would reload the shared queue when the node
becomes active: `Runtime.on_active` is the hook for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import zmq
from jobwire.protocols.zmq.bstar import BinaryStar, SplitBrain, State, decode_state, encode_state
from jobwire.server.runtime import Runtime

log = logging.getLogger("jobwire.bstar")


class BinaryStarNode:
    def __init__(
        self,
        runtime: Runtime,
        *,
        primary: bool,
        local: str,
        remote: str,
        heartbeat: float = 1.0,
        on_fatal: Callable[[str], None],
    ) -> None:
        self.runtime = runtime
        self.loop: asyncio.AbstractEventLoop = runtime.loop
        self.fsm = BinaryStar(primary, self.loop.time(), heartbeat)
        self.local = local
        self.remote = remote
        self.heartbeat = heartbeat
        self.on_fatal = on_fatal
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.pub = self.context.socket(zmq.PUB)
        self.sub = self.context.socket(zmq.SUB)
        self._fd = 0
        self._timer: asyncio.TimerHandle | None = None
        self._reported = self.fsm.state

    def start(self) -> None:
        for sock in (self.pub, self.sub):
            sock.setsockopt(zmq.LINGER, 0)
        self.pub.bind(self.local)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(self.remote)
        self._fd = self.sub.getsockopt(zmq.FD)  # type: ignore[assignment]
        self.loop.add_reader(self._fd, self._readable)
        self.runtime.gate = self.admit
        self.runtime.role = lambda: self.fsm.state.name.lower()
        self._publish()
        log.info("binary star: %s, publishing on %s", self.fsm.state.name.lower(), self.local)

    def admit(self) -> bool:
        """The runtime's gate: serve this client? (It is a client vote.)"""
        serving = self.fsm.client_request(self.loop.time())
        self._note_change()
        return serving

    def _publish(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self.pub.send(encode_state(self.fsm.state), zmq.NOBLOCK)
        self._timer = self.loop.call_later(self.heartbeat, self._publish)
        self._readable()  # a send may consume the SUB socket's edge: look again

    def _readable(self) -> None:
        while True:
            try:
                raw = self.sub.recv(zmq.NOBLOCK)
            except zmq.ZMQError:
                return
            try:
                peer = decode_state(raw)
            except ValueError:
                log.warning("binary star: ignored %r from the peer", raw[:16])
                continue
            try:
                self.fsm.peer_state(peer, self.loop.time())
            except SplitBrain as exc:
                log.critical("binary star: %s; stopping", exc)
                self.on_fatal(str(exc))
                return
            self._note_change()

    def _note_change(self) -> None:
        state = self.fsm.state
        if state is self._reported:
            return
        self._reported = state
        log.warning("binary star: now %s", state.name.lower())
        if state is State.ACTIVE:
            for hook in list(self.runtime.on_active):
                try:
                    hook()
                except Exception:
                    log.exception("an on_active hook failed")

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._fd:
            self.loop.remove_reader(self._fd)
        self.pub.close(linger=0)
        self.sub.close(linger=0)
        self.context.term()
