"""The WMP manager (jobwire's framing of RFC 14, docs/wmp.md) on the engine: its own ROUTER.

A worker is known by its routing path (the ROUTER identities of the devices it came
through and its own). Each of its slots is a `WorkerSession` of the WAKE shape, with room
for one job: READY puts the slot to sleep on the engine (a READY for a slot already waiting
is ignored), and the engine wakes as many sleeping slots as there are jobs (`--worker-wakeup`,
with its fallback for a woken slot that never asks), each woken slot getting WAKE; GIVE is
one `engine.grab`, answered TAKE with the job, or NO; DONE completes or fails the job,
STATUS reports progress (and renews the lease). The lease of a TAKE is the READY's `lease`
header or `--wmp-lease`; when it runs out, or an OJS/Gearman client cancels the job, the
engine revokes it and the worker gets CANCEL (an expired job goes back to the queue with
its attempt counted).

Roles: a slot with roles R serves, for each of its functions F, F itself and `F@r1+r2`
for every non-empty subset of R in sorted order; a job requiring roles is a job of such a
function. Jobs without roles cost nothing more: they are plain functions.

Liveness: a worker announces its heartbeat interval in READY (`heartbeat`, else
`--wmp-heartbeat`); any message counts, HEARTBEAT is answered HEARTBEAT, and a worker
silent for `liveness` intervals is forgotten (its jobs requeued).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from jobwire.engine import Dispatch, Engine, IllegalTransition, Job, Output
from jobwire.engine.worker import WorkerSession
from jobwire.protocols.zmq import wmp
from jobwire.protocols.zmq.frames import FRAME_SIZES, RESULT_FRAME_SIZES, join, split
from jobwire.protocols.zmq.wmp import Message, WmpError
from jobwire.server.errors import count_error

if TYPE_CHECKING:
    from jobwire.server.zmq.server import ZmqOptions
    from jobwire.server.zmq.sockets import RouterSocket

log = logging.getLogger("jobwire.zmq.wmp")

Path = tuple[bytes, ...]


class WmpSlot:
    """One slot of a worker: the engine's `WorkerHandler` for its session."""

    __slots__ = ("abilities", "name", "peer", "session")

    def __init__(self, peer: WmpPeer, name: str) -> None:
        self.peer = peer
        self.name = name
        self.abilities: tuple[tuple[str, ...], float] = ((), 0.0)
        self.session = WorkerSession(
            f"wmp:{b'/'.join(p.hex().encode() for p in peer.path).decode()}:{name}",
            self,
            protocol="wmp",
            dispatch=Dispatch.WAKE,
            capacity=1,
        )

    def wake(self) -> None:
        manager = self.peer.manager
        manager.send(self.peer.path, wmp.WAKE, {"slot": self.name, "manager": manager.identity})

    def assign(self, job: Job) -> None:  # WAKE workers grab
        pass

    def revoke(self, job: Job, reason: str) -> None:
        manager = self.peer.manager
        headers = {"job": job.id, "slot": self.name, "manager": manager.identity, "reason": reason}
        manager.send(self.peer.path, wmp.CANCEL, headers)


class WmpPeer:
    """A worker, by routing path."""

    __slots__ = ("expiry", "heartbeat", "manager", "path", "slots")

    def __init__(self, manager: WmpManager, path: Path) -> None:
        self.manager = manager
        self.path = path
        self.slots: dict[str, WmpSlot] = {}
        self.heartbeat = manager.options.wmp_heartbeat
        self.expiry = 0.0


class WmpManager:
    def __init__(self, engine: Engine, options: ZmqOptions, identity: str) -> None:
        self.engine = engine
        self.options = options
        self.identity = identity
        self.socket: RouterSocket | None = None
        self.peers: dict[Path, WmpPeer] = {}

    def send(
        self,
        path: Path,
        command: bytes,
        headers: Mapping[str, object] | None = None,
        payload: list[bytes] | tuple[bytes, ...] = (),
    ) -> None:
        if self.socket is not None and path:
            body = wmp.encode(command, headers, payload)
            self.socket.send(path[0], wmp.with_envelope(path[1:], body))

    # ---------------------------------------------------------------- messages

    def handle(self, identity: bytes, frames: list[bytes]) -> None:
        try:
            hops, body = wmp.split_envelope(frames)
        except WmpError as exc:
            log.info("dropped a message from %r: %s", identity[:32], exc)
            count_error("wmp_invalid")
            return
        path = (identity, *hops)
        try:
            message = wmp.decode(body)
            self._dispatch(path, message)
        except WmpError as exc:
            if not exc.answerable:
                log.info("dropped a message from %r: %s", identity[:32], exc)
                count_error("wmp_invalid")
                return
            log.info("invalid WMP message from %r: %s", identity[:32], exc)
            count_error("wmp_error")
            self.send(path, wmp.ERROR, {"reason": exc.reason})

    def refuse(self, identity: bytes, frames: list[bytes], reason: str) -> None:
        """Answer a message the role check refused ERROR `reason`, by WMP's error rule: a
        message that is not WMP at all is dropped, and nothing is acted on."""
        try:
            hops, body = wmp.split_envelope(frames)
            wmp.decode(body)
        except WmpError as exc:
            if not exc.answerable:
                return
        self.send((identity, *hops), wmp.ERROR, {"reason": reason})

    def _dispatch(self, path: Path, message: Message) -> None:
        command = message.command
        if command not in wmp.WORKER_COMMANDS:
            raise WmpError(f"{command.decode()} is not sent to a manager")
        peer = self.peers.get(path)
        if peer is not None:
            self._alive(peer)
        if command == wmp.READY:
            self._ready(path, peer, message)
        elif command == wmp.GIVE:
            self._give(path, peer, message)
        elif command == wmp.DONE:
            self._done(peer, message)
        elif command == wmp.STATUS:
            self._status(peer, message)
        elif command == wmp.HEARTBEAT:
            self.send(path, wmp.HEARTBEAT)
        elif peer is not None:  # DISCONNECT
            self._remove(peer, "worker disconnected")

    def _alive(self, peer: WmpPeer) -> None:
        peer.expiry = self.engine.clock() + peer.heartbeat * self.options.liveness

    def _ready(self, path: Path, peer: WmpPeer | None, message: Message) -> None:
        functions = message.items("functions")
        roles = message.items("roles")
        if not functions or not all(wmp.valid_name(name) for name in functions):
            raise WmpError("READY needs functions=NAME[,NAME...]")
        if len(roles) > wmp.MAX_ROLES or not all(wmp.valid_name(role) for role in roles):
            raise WmpError(f"READY takes at most {wmp.MAX_ROLES} roles, each a plain name")
        lease = message.number("lease", self.options.wmp_lease) or None
        heartbeat = message.number("heartbeat", self.options.wmp_heartbeat)
        engine = self.engine
        if peer is None:
            peer = self.peers[path] = WmpPeer(self, path)
        if heartbeat:
            peer.heartbeat = heartbeat
        self._alive(peer)
        name = message.get("slot", "0")
        slot = peer.slots.get(name)
        if slot is None:
            slot = peer.slots[name] = WmpSlot(peer, name)
            slot.session.name = message.get("name", "-")
            engine.add_worker(slot.session)
        session = slot.session
        if session.waiting and session in self._waiters(session):
            return  # remembered already: RFC 14 says ignore it
        for job in list(session.jobs.values()):  # the worker forgot the job it held
            with contextlib.suppress(IllegalTransition):
                engine.fail(job, "the worker sent READY for its slot", retry=True)
        wanted = (tuple(n for f in functions for n in wmp.role_functions(f, roles)), lease or 0.0)
        if wanted != slot.abilities:
            engine.reset_abilities(session)
            for function in wanted[0]:
                engine.add_ability(session, function, lease)
            slot.abilities = wanted
        if engine.sleep(session):
            slot.wake()

    def _waiters(self, session: WorkerSession) -> dict[WorkerSession, None]:
        name = next(iter(session.abilities), None)
        fn = self.engine.functions.get(name) if name is not None else None
        return fn.waiters if fn is not None else {}

    def _give(self, path: Path, peer: WmpPeer | None, message: Message) -> None:
        name = message.get("slot", "0")
        slot = peer.slots.get(name) if peer is not None else None
        headers: dict[str, object] = {"slot": name, "manager": self.identity}
        job = self.engine.grab(slot.session) if slot is not None else None
        if job is None:
            self.send(path, wmp.NO, headers)
            return
        headers.update(job=job.id, function=job.function, attempt=job.attempts)
        if job.lease_deadline is not None:
            headers["lease"] = round(job.lease_deadline - self.engine.clock(), 3)
        sizes = job.ext.get(FRAME_SIZES) if job.ext else None
        self.send(path, wmp.TAKE, headers, split(job.payload, sizes))

    def _held(self, peer: WmpPeer | None, message: Message) -> Job | None:
        """The job the message names, if this worker holds it (else it was taken back)."""
        job = self.engine.jobs.get(message.get("job"))
        if job is None or peer is None or job.worker is None:
            return None
        handler = job.worker.handler
        return job if isinstance(handler, WmpSlot) and handler.peer is peer else None

    def _done(self, peer: WmpPeer | None, message: Message) -> None:
        job = self._held(peer, message)
        if job is None:
            log.info("DONE for job %r it does not hold: dropped", message.get("job"))
            return
        engine = self.engine
        error = message.headers.get("error")
        if error is not None:
            retry = message.get("retry") in ("1", "true")
            detail = b"".join(message.payload) or None
            engine.fail(job, error, detail=detail, retry=retry)
            return
        payload, sizes = join(message.payload) if message.payload else (b"", None)
        if sizes:
            if job.ext is None:
                job.ext = {}
            job.ext[RESULT_FRAME_SIZES] = sizes
        engine.complete(job, payload)

    def _status(self, peer: WmpPeer | None, message: Message) -> None:
        job = self._held(peer, message)
        if job is None:
            return
        engine = self.engine
        progress = message.get("progress")
        if progress:
            done, sep, total = progress.partition("/")
            if not (sep and done.isdigit() and total.isdigit()):
                raise WmpError("progress is DONE/TOTAL")
            engine.progress(job, int(done), int(total))
        for frame in message.payload:
            engine.output(job, Output.DATA, frame)
        timeout = job.worker.abilities.get(job.function) if job.worker is not None else None
        if timeout:
            engine.extend_lease(job, timeout)

    # ---------------------------------------------------------------- liveness

    def _remove(self, peer: WmpPeer, reason: str) -> None:
        if self.peers.get(peer.path) is peer:
            del self.peers[peer.path]
        for slot in peer.slots.values():
            self.engine.remove_worker(slot.session, reason)

    def tick(self) -> None:
        now = self.engine.clock()
        for peer in list(self.peers.values()):
            if now > peer.expiry:
                log.info("WMP worker %r expired (no heartbeat)", peer.path)
                self._remove(peer, "heartbeat expired")

    def close(self) -> None:
        for peer in list(self.peers.values()):
            self.send(peer.path, wmp.DISCONNECT, {"manager": self.identity})
            self._remove(peer, "server stopping")
