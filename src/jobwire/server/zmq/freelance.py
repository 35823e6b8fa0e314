"""A Freelance server (RFC 10) on the engine: its own ROUTER, whose identity is the public
endpoint clients connect to, so ROUTER clients can address it by name. `PING` is answered
`PONG`; a request [control, service, body...] runs as a foreground job of `service` (on a
worker of any protocol) and is answered [control, reply...]; a request that fails is
answered with the Majordomo error body ([`\\x00jobwire:error`, status, text])."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jobwire.engine import Engine, Job, JobState, Output
from jobwire.engine.errors import QueueFull
from jobwire.engine.job import ORIGIN_FREELANCE
from jobwire.protocols.zmq import freelance
from jobwire.protocols.zmq.frames import FRAME_SIZES, join
from jobwire.server.errors import count_error
from jobwire.server.zmq.majordomo import FAILED, error_body, final_body

if TYPE_CHECKING:
    from jobwire.server.zmq.sockets import RouterSocket

log = logging.getLogger("jobwire.zmq")


@dataclass(eq=False, slots=True)
class FreelanceRequest:
    """A client waiting for one request: the engine's `Subscriber` for its job."""

    server: FreelanceServer
    client: bytes
    request: freelance.Request

    def job_progress(self, job: Job, done: int, total: int) -> None:
        pass  # one reply per request

    def job_output(self, job: Job, kind: Output, data: bytes) -> None:
        pass

    def job_finished(
        self, job: Job, state: JobState, result: bytes | None, error: bytes | None
    ) -> None:
        self.server.send(
            self.client, freelance.reply(self.request, final_body(job, state, result, error))
        )


class FreelanceServer:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.socket: RouterSocket | None = None

    def send(self, identity: bytes, frames: list[bytes]) -> None:
        if self.socket is not None:
            self.socket.send(identity, frames)

    def handle(self, identity: bytes, frames: list[bytes]) -> None:
        try:
            message = freelance.decode(frames)
        except freelance.FreelanceError as exc:
            log.info("dropped an invalid Freelance message from %r: %s", identity[:32], exc)
            count_error("freelance_invalid")
            return
        if isinstance(message, freelance.Ping):
            self.send(identity, freelance.pong(message))
            return
        payload, sizes = join(message.body)
        try:
            self.engine.submit(
                message.service.decode("utf-8", "surrogateescape"),
                payload,
                background=False,
                subscriber=FreelanceRequest(self, identity, message),
                ext={FRAME_SIZES: sizes} if sizes else None,
                origin=ORIGIN_FREELANCE,
            )
        except QueueFull as exc:
            self.send(identity, freelance.reply(message, error_body(FAILED, str(exc))))
