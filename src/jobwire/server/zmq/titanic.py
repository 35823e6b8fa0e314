"""Titanic (RFC 9) inside the broker, on the durable store.

`titanic.request` [service, body...] stores the request as a background job of `service`
whose id is a fresh 32-hex uuid, and answers [200, uuid] once the job is durable (the
runtime's commit barrier). When the job ends, its reply is kept in the store's key-value
records (namespace `titanic`), written in the same commit as the job's removal, until
`titanic.close`; so a reply survives a restart, and a request not yet answered comes back
with the jobs. `titanic.reply` [uuid] answers [200, reply...], [300] while the job waits or
runs, or [400] for a uuid it does not know; a job that failed for good answers [500, text].
`titanic.close` [uuid] forgets both and answers [200], also for an unknown uuid. Replies
are answered once durable too, so a 200 never announces something a crash could undo.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import uuid
from collections.abc import Callable
from typing import Final

from jobwire.engine import Engine, IllegalTransition, Job, JobState
from jobwire.engine.errors import QueueFull
from jobwire.engine.job import ORIGIN_TITANIC
from jobwire.ports import KeyValueStore
from jobwire.protocols.zmq import mdp, services
from jobwire.protocols.zmq.frames import FRAME_SIZES, RESULT_FRAME_SIZES, join, split
from jobwire.server.runtime import Runtime

log = logging.getLogger("jobwire.zmq")

NAMESPACE: Final = "titanic"
#: Marks a job as a Titanic request in its protocol attributes.
TITANIC: Final = "titanic"

Respond = Callable[[list[bytes]], None]


def encode_reply(frames: list[bytes]) -> bytes:
    """A stored reply: each frame as a 4-byte big-endian size and its bytes."""
    return b"".join(struct.pack(">I", len(frame)) + frame for frame in frames)


def decode_reply(raw: bytes) -> list[bytes]:
    frames = []
    at = 0
    while at + 4 <= len(raw):
        (size,) = struct.unpack_from(">I", raw, at)
        frames.append(raw[at + 4 : at + 4 + size])
        at += 4 + size
    return frames


class Titanic:
    def __init__(self, runtime: Runtime, kv: KeyValueStore | None) -> None:
        self.runtime = runtime
        self.engine: Engine = runtime.engine
        self.kv = kv
        # uuid -> the stored reply ([status, body...]); kept in memory and in the store.
        self.replies: dict[str, bytes] = dict(kv.kv_load(NAMESPACE)) if kv is not None else {}
        self.engine.finish_observers.append(self._finished)

    def handle(self, message: mdp.Request, respond: Respond) -> None:
        service, body = message.service, message.body
        if service == services.TITANIC_REQUEST:
            self._request(body, respond)
        elif service == services.TITANIC_REPLY:
            self._reply(body, respond)
        else:
            self._close(body, respond)

    def _request(self, body: tuple[bytes, ...], respond: Respond) -> None:
        if len(body) < 2 or not body[0] or services.is_internal(body[0]):
            respond([services.ERROR, b"titanic.request takes a service and a body"])
            return
        payload, sizes = join(body[1:])
        ext: dict[str, object] = {TITANIC: True}
        if sizes:
            ext[FRAME_SIZES] = sizes
        job_id = uuid.uuid4().hex
        try:
            self.engine.submit(
                body[0].decode("utf-8", "surrogateescape"),
                payload,
                background=True,
                job_id=job_id,
                ext=ext,
                origin=ORIGIN_TITANIC,
            )
        except QueueFull:
            respond([services.ERROR, b"the queue is full"])
            return
        reply = [services.OK, job_id.encode()]
        self.runtime.after_durable(lambda ok: respond(reply if ok else [services.ERROR]))

    def _reply(self, body: tuple[bytes, ...], respond: Respond) -> None:
        key = body[0].decode("ascii", "replace") if body else ""
        if not services.is_uuid(body[0] if body else b""):
            respond([services.UNKNOWN])
            return
        stored = self.replies.get(key)
        if stored is not None:
            answer = decode_reply(stored)
        else:
            job = self.engine.jobs.get(key)
            pending = job is not None and not job.state.terminal
            answer = [services.PENDING if pending else services.UNKNOWN]
        self.runtime.after_durable(lambda ok: respond(answer if ok else [services.ERROR]))

    def _close(self, body: tuple[bytes, ...], respond: Respond) -> None:
        key = body[0].decode("ascii", "replace") if body else ""
        if self.replies.pop(key, None) is not None and self.kv is not None:
            self.kv.kv_put(NAMESPACE, key, None)
        job = self.engine.jobs.get(key)
        if job is not None and job.ext is not None and job.ext.get(TITANIC):
            if not job.state.terminal:
                with contextlib.suppress(IllegalTransition):
                    self.engine.cancel(job)
            self.engine.forget(job)
        self.runtime.after_durable(lambda ok: respond([services.OK] if ok else [services.ERROR]))

    def _finished(self, event: str, job: Job) -> None:
        """`Engine.finish_observers`: keep a Titanic request's reply until it is closed."""
        ext = job.ext
        if ext is None or not ext.get(TITANIC):
            return
        if job.state is JobState.COMPLETED:
            frames = [services.OK, *split(job.result or b"", ext.get(RESULT_FRAME_SIZES))]
        elif job.state is JobState.CANCELLED:
            return  # closed (or cancelled by an operator): nothing to keep
        else:
            frames = [services.ERROR, str(job.error).encode()]
        stored = encode_reply(frames)
        self.replies[job.id] = stored
        if self.kv is not None:
            self.kv.kv_put(NAMESPACE, job.id, stored)

    def reset(self) -> None:
        if self.kv is not None:
            for key in self.replies:
                self.kv.kv_put(NAMESPACE, key, None)
        self.replies.clear()
