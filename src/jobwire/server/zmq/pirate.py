"""A Paranoid Pirate queue (RFC 6) on the engine: two ROUTERs, requests as jobs.

Clients (Lazy Pirate REQ sockets, or DEALERs) send requests to the frontend; each request is
a foreground job of one configurable function, so a worker of any protocol can serve it.
Workers (DEALERs) connect to the backend and send READY; each is a PUSH worker session with
that function as its ability and room for one job at a time. The queue sends a worker
[job id, empty, body...] and takes [job id, empty, reply...] back, as ppqueue does with the
client's address. Both sides beat every `heartbeat` seconds; a worker silent for `liveness`
beats is dead and its job goes back to the queue with the attempt counted. As in the
reference queue, any message from an unknown worker registers it (a worker whose queue
restarted re-sends only heartbeats until it notices).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jobwire.engine import Dispatch, Engine, Job, JobState, Output
from jobwire.engine.errors import JobNotHeld, QueueFull
from jobwire.engine.job import ORIGIN_PIRATE
from jobwire.engine.worker import WorkerSession
from jobwire.protocols.zmq import ppp
from jobwire.protocols.zmq.frames import FRAME_SIZES, RESULT_FRAME_SIZES, join, split
from jobwire.protocols.zmq.ppp import PppError
from jobwire.server.errors import count_error
from jobwire.server.zmq.majordomo import FAILED, error_body, final_body

if TYPE_CHECKING:
    from jobwire.server.zmq.server import ZmqServer
    from jobwire.server.zmq.sockets import RouterSocket

log = logging.getLogger("jobwire.zmq")


@dataclass(eq=False, slots=True)
class PirateRequest:
    """A client waiting for one request: the engine's `Subscriber` for its job."""

    queue: PirateQueue
    client: bytes
    address: tuple[bytes, ...]

    def job_progress(self, job: Job, done: int, total: int) -> None:
        pass  # PPP has one reply per request

    def job_output(self, job: Job, kind: Output, data: bytes) -> None:
        pass

    def job_finished(
        self, job: Job, state: JobState, result: bytes | None, error: bytes | None
    ) -> None:
        body = final_body(job, state, result, error)
        self.queue.frontend_send(self.client, ppp.request(self.address, body))


class PirateWorker:
    """A PPP worker: the engine's `WorkerHandler` for its session."""

    __slots__ = ("expiry", "identity", "queue", "session")

    def __init__(self, queue: PirateQueue, identity: bytes) -> None:
        self.queue = queue
        self.identity = identity
        self.expiry = 0.0
        self.session = WorkerSession(
            f"ppp:{identity.hex()}", self, protocol="ppp", dispatch=Dispatch.PUSH, capacity=1
        )

    def wake(self) -> None:
        pass

    def assign(self, job: Job) -> None:
        sizes = job.ext.get(FRAME_SIZES) if job.ext else None
        self.queue.backend_send(
            self.identity, ppp.request([job.id.encode()], split(job.payload, sizes))
        )

    def revoke(self, job: Job, reason: str) -> None:
        log.info("job %s taken from PPP worker %s: %s", job.id, self.session.id, reason)


class PirateQueue:
    def __init__(self, server: ZmqServer) -> None:
        self.server = server
        self.engine: Engine = server.runtime.engine
        self.options = server.options
        self.function = server.options.ppp_function
        self.workers: dict[bytes, PirateWorker] = {}
        self.clock = server.runtime.loop.time
        self.frontend: RouterSocket | None = None
        self.backend: RouterSocket | None = None

    def frontend_send(self, identity: bytes, frames: list[bytes]) -> None:
        if self.frontend is not None:
            self.frontend.send(identity, frames)

    def backend_send(self, identity: bytes, frames: list[bytes]) -> None:
        if self.backend is not None:
            self.backend.send(identity, frames)

    def client_message(self, identity: bytes, frames: list[bytes]) -> None:
        try:
            request = ppp.decode_frontend(frames)
        except PppError as exc:
            log.info("dropped an invalid PPP request from %r: %s", identity[:32], exc)
            count_error("ppp_invalid")
            return
        payload, sizes = join(request.body)
        try:
            self.engine.submit(
                self.function,
                payload,
                background=False,
                subscriber=PirateRequest(self, identity, request.address),
                ext={FRAME_SIZES: sizes} if sizes else None,
                origin=ORIGIN_PIRATE,
            )
        except QueueFull as exc:
            self.frontend_send(identity, ppp.request(request.address, error_body(FAILED, str(exc))))

    def worker_message(self, identity: bytes, frames: list[bytes]) -> None:
        try:
            message = ppp.decode_backend(frames)
        except PppError as exc:
            log.info("dropped an invalid PPP message from %r: %s", identity[:32], exc)
            count_error("ppp_invalid")
            return
        worker = self.workers.get(identity)
        if worker is None:
            worker = self._register(identity)
        worker.expiry = self.clock() + self.options.ppp_heartbeat * self.options.liveness
        if isinstance(message, ppp.Reply):
            try:
                job = self.engine.held_job(
                    worker.session, message.address[-1].decode("utf-8", "replace")
                )
            except JobNotHeld as exc:  # taken back meanwhile, or never its own: dropped
                log.info("reply from %r dropped: %s", identity[:32], exc)
                if not worker.session.jobs:  # it is free now: ask for its next job
                    self.engine.request_work(worker.session, 1)
                return
            payload, sizes = join(message.body)
            if sizes:
                if job.ext is None:
                    job.ext = {}
                job.ext[RESULT_FRAME_SIZES] = sizes
            self.engine.complete(job, payload)
            self.engine.request_work(worker.session, 1)

    def _register(self, identity: bytes) -> PirateWorker:
        worker = PirateWorker(self, identity)
        self.workers[identity] = worker
        engine = self.engine
        engine.add_worker(worker.session)
        engine.add_ability(worker.session, self.function)
        engine.request_work(worker.session, 1)
        return worker

    def tick(self) -> None:
        """Every heartbeat interval: expire silent workers, beat to the idle ones."""
        now = self.clock()
        for worker in list(self.workers.values()):
            if now > worker.expiry:
                log.info("PPP worker %s expired (no heartbeat)", worker.session.id)
                del self.workers[worker.identity]
                self.engine.remove_worker(worker.session, "heartbeat expired")
            elif not worker.session.jobs:
                self.backend_send(worker.identity, [ppp.HEARTBEAT])

    def close(self) -> None:
        for worker in list(self.workers.values()):
            self.engine.remove_worker(worker.session, "server stopping")
        self.workers.clear()
