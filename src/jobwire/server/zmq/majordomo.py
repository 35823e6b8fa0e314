"""The Majordomo broker (MDP 0.1 and 0.2 on one ROUTER), with MMI, on the engine.

A service is an engine function. A client's REQUEST is a foreground job of that function;
its waiting client is a `Subscriber` that turns the job's end into a REPLY (0.1) or FINAL
(0.2), and its output into PARTIALs (0.2). A worker's READY makes it a PUSH worker session
with the service as its one ability and room for one job; the engine assigns it jobs of any
protocol, and its REPLY/FINAL completes them. So a Gearman, OJS or Rota worker can serve an
MDP client, and an MDP worker can run a job of any other protocol.

Liveness: any command counts as a heartbeat. Every `heartbeat` seconds the broker sends
HEARTBEAT to its idle workers and expires every worker, idle or busy, silent for `liveness`
intervals (the reference broker looks only at the front of its idle list, so a live worker
can shield a dead one, and never expires a busy one); a busy worker's job goes back to the
queue with its attempt counted. A request for a service nobody serves waits; if still no
worker serves it after `request_timeout` seconds, the client gets the error reply.

Error replies (documented in the README): a request that cannot be served gets a REPLY or
FINAL whose body is [`ERROR_MARK`, status, text]: status `404` (no worker served the
service in time), `500` (the job failed), `410` (it was cancelled). A worker fails a job the
same way: its FINAL with that body fails the job (MDP has no failure command).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from jobwire.engine import Dispatch, Engine, IllegalTransition, Job, JobState, Output
from jobwire.engine.errors import JobNotHeld, QueueFull
from jobwire.engine.job import ORIGIN_MAJORDOMO
from jobwire.engine.worker import WorkerSession
from jobwire.protocols.zmq import mdp, services
from jobwire.protocols.zmq.frames import FRAME_SIZES, RESULT_FRAME_SIZES, join, split
from jobwire.protocols.zmq.mdp import MdpError, Version
from jobwire.server.errors import count_error
from jobwire.server.zmq.sockets import RouterSocket

if TYPE_CHECKING:
    from jobwire.server.zmq.server import ZmqServer

log = logging.getLogger("jobwire.zmq")

#: The first body frame of an error reply: a NUL byte and a name, which no worker's
#: ordinary reply starts with by accident.
ERROR_MARK: Final = b"\x00jobwire:error"
NO_WORKER: Final = b"404"
FAILED: Final = b"500"
CANCELLED: Final = b"410"
#: Why an unserved request was expired (its job's error), to tell it from a failure.
NO_WORKER_REASON: Final = "no worker served the service in time"

_COMPLETED: Final = JobState.COMPLETED
_CANCELLED: Final = JobState.CANCELLED


def decode_name(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def error_body(status: bytes, text: str) -> list[bytes]:
    return [ERROR_MARK, status, text.encode()]


def final_body(job: Job, state: JobState, result: bytes | None, error: bytes | None) -> list[bytes]:
    """What a ZeroMQ client is answered when its job ends (every request-reply listener's
    rule): the result's frames, or the error body saying why not."""
    if state is _COMPLETED:
        return split(result or b"", job.ext.get(RESULT_FRAME_SIZES) if job.ext else None)
    if state is _CANCELLED:
        return error_body(CANCELLED, "the job was cancelled")
    if job.error == NO_WORKER_REASON:
        return error_body(NO_WORKER, NO_WORKER_REASON)
    text = error.decode("utf-8", "replace") if error is not None else str(job.error)
    return error_body(FAILED, text)


@dataclass(eq=False, slots=True, init=False)
class PendingRequest:
    """A client waiting for one request: the engine's `Subscriber` for its job."""

    broker: MajordomoBroker
    client: bytes  # the client's ROUTER identity
    version: Version
    service: bytes

    # Written out: compiled, the dataclass's generated `__init__` would run interpreted.
    def __init__(
        self, broker: MajordomoBroker, client: bytes, version: Version, service: bytes
    ) -> None:
        self.broker = broker
        self.client = client
        self.version = version
        self.service = service

    def job_progress(self, job: Job, done: int, total: int) -> None:
        if self.version is Version.V2:
            body = [b"progress", b"%d" % done, b"%d" % total]
            self.broker.send(self.client, mdp.reply(self.version, self.service, body, final=False))

    def job_output(self, job: Job, kind: Output, data: bytes) -> None:
        if self.version is Version.V2 and kind is Output.DATA:
            self.broker.send(
                self.client, mdp.reply(self.version, self.service, [data], final=False)
            )

    def job_finished(
        self, job: Job, state: JobState, result: bytes | None, error: bytes | None
    ) -> None:
        body = final_body(job, state, result, error)
        self.broker.send(self.client, mdp.reply(self.version, self.service, body))


class MdpWorker:
    """A Majordomo worker: the engine's `WorkerHandler` for its session."""

    __slots__ = ("broker", "expiry", "identity", "service", "session", "version")

    def __init__(
        self, broker: MajordomoBroker, identity: bytes, version: Version, service: bytes
    ) -> None:
        self.broker = broker
        self.identity = identity
        self.version = version
        self.service = service
        self.expiry = 0.0
        self.session = WorkerSession(
            f"mdp:{identity.hex()}", self, protocol="mdp", dispatch=Dispatch.PUSH, capacity=1
        )
        self.session.name = decode_name(service)

    def wake(self) -> None:  # PUSH workers are never woken
        pass

    def assign(self, job: Job) -> None:
        sizes = job.ext.get(FRAME_SIZES) if job.ext else None
        body = split(job.payload, sizes)
        self.broker.send(self.identity, mdp.worker_request(self.version, job.id.encode(), body))

    def revoke(self, job: Job, reason: str) -> None:
        """MDP cannot take a request back: the worker's late reply is dropped."""
        log.info("job %s taken from MDP worker %s: %s", job.id, self.session.id, reason)


class MajordomoBroker:
    def __init__(self, server: ZmqServer) -> None:
        self.server = server
        self.engine: Engine = server.runtime.engine
        self.options = server.options
        self.workers: dict[bytes, MdpWorker] = {}
        self.titanic = server.titanic
        self.clock = server.runtime.loop.time
        #: The ROUTER it answers on, once the server has bound it (`ZmqServer.start`).
        self.router: RouterSocket | None = None

    def send(self, identity: bytes, frames: list[bytes]) -> None:
        # Straight to the socket (both compiled): through the server's interpreted
        # `router_send` it cost about 1k instructions more per message.
        router = self.router
        if router is not None:
            router.send(identity, frames)

    def disconnect(self, identity: bytes, version: Version) -> None:
        """DISCONNECT a peer that broke the protocol (RFC 7: a message out of turn)."""
        count_error("mdp_disconnect")
        self.send(identity, mdp.disconnect(version))

    # ---------------------------------------------------------------- messages

    def handle(self, identity: bytes, frames: list[bytes]) -> None:
        try:
            message = mdp.decode(frames)
        except MdpError as exc:
            self._invalid(identity, str(exc))
            return
        if isinstance(message, mdp.Request):
            self._request(identity, message)
        elif isinstance(message, mdp.Ready):
            self._ready(identity, message)
        elif isinstance(message, mdp.WorkerReply):
            self._reply(identity, message)
        elif isinstance(message, mdp.Heartbeat):
            worker = self.workers.get(identity)
            if worker is None:
                self.disconnect(identity, message.version)
            else:
                self._alive(worker)
        else:  # Disconnect: the worker leaves; nothing more is sent to it
            worker = self.workers.get(identity)
            if worker is not None:
                self._remove(worker, "worker disconnected")

    def _invalid(self, identity: bytes, why: str) -> None:
        """RFC 7: drop an invalid message and treat its sender as invalid."""
        log.info("dropped an invalid message from %r: %s", identity[:32], why)
        count_error("mdp_invalid")
        worker = self.workers.get(identity)
        if worker is not None:
            self._remove(worker, "invalid message")

    # ---------------------------------------------------------------- clients

    def _request(self, identity: bytes, message: mdp.Request) -> None:
        service = message.service
        if service.startswith(services.MMI_PREFIX):
            self._mmi(identity, message)
            return
        if service in services.TITANIC_SERVICES:
            self.titanic.handle(message, lambda body: self._answer(identity, message, body))
            return
        payload, sizes = join(message.body)
        pending = PendingRequest(self, identity, message.version, service)
        name = decode_name(service)
        try:
            job, _ = self.engine.submit(
                name,
                payload,
                background=False,
                subscriber=pending,
                ext={FRAME_SIZES: sizes} if sizes else None,
                origin=ORIGIN_MAJORDOMO,
            )
        except QueueFull as exc:
            self._answer(identity, message, error_body(FAILED, str(exc)))
            return
        if not self._served(name):
            self.engine.timers.add(
                self.engine.clock() + self.options.request_timeout, self._unserved, job
            )

    def _answer(self, identity: bytes, message: mdp.Request, body: list[bytes]) -> None:
        self.send(identity, mdp.reply(message.version, message.service, body))

    def _served(self, name: str) -> bool:
        fn = self.engine.functions.get(name)
        return fn is not None and bool(fn.workers)

    def _unserved(self, job: Job, _when: float) -> None:
        """A request's time to find a worker is up: if it still waits and nobody serves its
        service, its client gets the error reply (a waiting job with a worker is served
        in turn)."""
        if job.state is JobState.AVAILABLE and not self._served(job.function):
            with contextlib.suppress(IllegalTransition):
                self.engine.expire(job, NO_WORKER_REASON)

    def _mmi(self, identity: bytes, message: mdp.Request) -> None:
        if message.service == services.MMI_SERVICE:
            name = decode_name(message.body[0])
            status = services.OK if self._served(name) else services.NOT_FOUND
            self._answer(identity, message, [status])
        elif message.service == services.MMI_SERVICES:
            names = sorted(fn.name for fn in self.engine.functions.values() if fn.workers)
            self._answer(identity, message, [services.OK, *(n.encode() for n in names)])
        else:
            self._answer(identity, message, [services.NOT_IMPLEMENTED])

    # ---------------------------------------------------------------- workers

    def _ready(self, identity: bytes, message: mdp.Ready) -> None:
        known = self.workers.get(identity)
        if known is not None:  # a second READY: valid but unexpected
            self.disconnect(identity, message.version)
            self._remove(known, "second READY")
            return
        if services.is_internal(message.service) or not message.service:
            self.disconnect(identity, message.version)
            return
        worker = MdpWorker(self, identity, message.version, message.service)
        self.workers[identity] = worker
        self._alive(worker)
        engine = self.engine
        engine.add_worker(worker.session)
        engine.add_ability(worker.session, decode_name(message.service))
        engine.request_work(worker.session, 1)

    def _reply(self, identity: bytes, message: mdp.WorkerReply) -> None:
        worker = self.workers.get(identity)
        if worker is None:
            self.disconnect(identity, message.version)
            return
        self._alive(worker)
        try:
            job = self.engine.held_job(worker.session, decode_name(message.client))
        except JobNotHeld as exc:
            # Not this worker's request (taken back meanwhile: lease expired, cancelled; or
            # never its own): dropped, nothing changes; MDP has no error reply to a worker.
            log.info("REPLY from %r dropped: %s", identity[:32], exc)
            if message.final and not worker.session.jobs:
                # It is free now: without new credit the engine would never send it more.
                self.engine.request_work(worker.session, 1)
            return
        engine = self.engine
        payload, sizes = join(message.body)
        if not message.final:
            engine.output(job, Output.DATA, payload)
            return
        body = message.body
        if body[0] == ERROR_MARK:
            # MDP has no failure command: a worker fails a job with the error reply's frames
            # ([mark, status, text]), so Gearman/OJS clients, retry policies and Titanic see a
            # failure, not a result.
            text = body[2] if len(body) > 2 else b"failed"
            engine.fail(job, text.decode("utf-8", "replace"), detail=text)
            engine.request_work(worker.session, 1)
            return
        if sizes:
            if job.ext is None:
                job.ext = {}
            job.ext[RESULT_FRAME_SIZES] = sizes
        engine.complete(job, payload)
        engine.request_work(worker.session, 1)

    def _alive(self, worker: MdpWorker) -> None:
        worker.expiry = self.clock() + self.options.heartbeat * self.options.liveness

    def _remove(self, worker: MdpWorker, reason: str) -> None:
        if self.workers.get(worker.identity) is worker:
            del self.workers[worker.identity]
        self.engine.remove_worker(worker.session, reason)

    def tick(self) -> None:
        """Every heartbeat interval: expire silent workers, idle or busy, and send
        HEARTBEAT to the idle ones."""
        now = self.clock()
        for worker in list(self.workers.values()):
            if now > worker.expiry:
                log.info("MDP worker %s expired (no heartbeat)", worker.session.id)
                self._remove(worker, "heartbeat expired")
            elif not worker.session.jobs:
                self.send(worker.identity, mdp.heartbeat(worker.version))

    def close(self) -> None:
        for worker in list(self.workers.values()):
            self.send(worker.identity, mdp.disconnect(worker.version))
            self._remove(worker, "server stopping")
