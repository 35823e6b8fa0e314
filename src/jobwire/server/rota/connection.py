"""One Rota worker on the `/work` WebSocket: decode a frame, make the engine calls, encode.

The connection is the worker's `WorkerHandler`: the engine pushes jobs through `assign` (PUSH
dispatch, up to the credit the worker's `wants` leaves) and takes them back through `revoke`.
Outgoing messages go through one queue and one writer task, in order; an `error` that ends the
connection is followed by a close with the WebSocket code of `protocols.rota.errors.FATAL`.

Durability: what the server acknowledges is durable first, through the runtime's commit
barrier. The results of a heartbeat are acknowledged with an `ack` of its `seq` once they
are committed, and the assignment of a job with an attempt limit goes out once its attempt
is (so a crash cannot let it run more often than allowed). Messages queued after one that
waits for a commit wait behind it, so the worker sees them in order.

Liveness: any frame counts as a sign of life. A worker silent for `heartbeat_timeout` seconds
is gone: it is removed from the engine at once (its jobs go back to the queue with the attempt
counted) and the socket is closed with 1008. So is a worker whose connection drops, or that sent
something the server cannot trust (the close code says what). The other way, a worker that
registered with revision 2 gets a `beat` whenever the server has sent nothing for
`beat_interval` seconds, so it can tell a silent server from an idle one.

Lifecycle: an operator's `quiet`, `running` or `terminate` (`direct`) sets the engine's state of
the worker (a worker that is not running is assigned nothing) and is sent as a `state`
message. A terminating worker is closed (1000) once it holds no jobs and its results are
durable, so a worker that does not know `state` still ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import WSMsgType, web

from jobwire.engine import Engine
from jobwire.engine.errors import EngineError, JobNotHeld
from jobwire.engine.job import Job
from jobwire.engine.worker import Dispatch, WorkerSession, WorkerState
from jobwire.protocols.ojs.times import format_time
from jobwire.protocols.rota import (
    NO_VALUE,
    REVISION,
    Ack,
    Assignment,
    Beat,
    CloseCode,
    ErrorCode,
    ErrorMessage,
    Failure,
    Heartbeat,
    Registration,
    Result,
    Revoke,
    RotaError,
    ServerMessage,
    SetState,
    SpecRef,
    SpecsChanged,
    SpecVerdict,
    Status,
    Welcome,
    decode_worker_message,
    encode,
)
from jobwire.server.errors import count_error
from jobwire.server.limits import MessageRate
from jobwire.server.rota.render import job_copy, wants_logs

if TYPE_CHECKING:
    from jobwire.server.rota.service import RotaService

log = logging.getLogger("jobwire.rota")

WORKER_LOST = "worker lost"
HEARTBEAT_TIMEOUT = "heartbeat timeout"
TERMINATED = "worker terminated"
#: The first schema revision with `beat` and `state` (wire.REVISION).
BEATING_REVISION = 2


@dataclass(frozen=True, slots=True)
class _Close:
    code: int
    reason: str


def extend_leases(engine: Engine, session: WorkerSession) -> None:
    """Jobs with a lease (an OJS visibility timeout) live while their worker heartbeats.

    A lease is renewed for its full timeout once less than half of it is left, so a worker
    heartbeating every second adds one timer entry per job per half-timeout, not per beat.
    """
    now = engine.clock()
    for job in session.jobs.values():
        timeout = job.lease_timeout
        deadline = job.lease_deadline
        if timeout and deadline is not None and deadline - now < timeout / 2:
            engine.extend_lease(job, timeout)


#: The frames the message rate counts (not the close handshake, not errors).
_COUNTED = (WSMsgType.TEXT, WSMsgType.BINARY)


class RotaConnection:
    def __init__(self, service: RotaService, ws: web.WebSocketResponse[Any], request: web.Request):
        self.service = service
        self.engine = service.engine
        self.options = service.options
        self.ws = ws
        self.request = request
        self.peer = request.remote or "-"
        self.loop = asyncio.get_running_loop()
        self.session: WorkerSession | None = None
        self.specs: tuple[SpecRef, ...] = ()
        self.verdicts: tuple[SpecVerdict, ...] = ()
        self.wants = 0
        self.logs_for: set[str] = set()  # held jobs whose assignment asked for logs
        self.closing = False
        self._outbox: asyncio.Queue[bytes | _Close] = asyncio.Queue()
        self.runtime = service.runtime
        # Messages waiting behind a commit (`send_when_durable`), in order; `_waiting_from`
        # counts the messages ever held before `_waiting[0]`; `_holds`, the commits awaited.
        self._waiting: list[bytes] = []
        self._waiting_from = 0
        self._holds = 0
        self._heard = self.loop.time()
        self._said = self._heard  # when a message last went to the writer
        self._silence: asyncio.TimerHandle | None = None
        self._beat: asyncio.TimerHandle | None = None
        self._ending = False  # terminating: the close is scheduled
        self._abort: asyncio.TimerHandle | None = None
        limits = self.runtime.connections.limits
        #: Bytes queued for the worker and not yet written (server/limits.py's max_output).
        self._queued = 0
        self._max_queued = limits.max_output or (1 << 62)
        #: Messages per second this worker may send (None: no bound).
        self._rate = MessageRate(limits.ws_rate, self._heard) if limits.ws_rate else None

    @property
    def name(self) -> str:
        return self.session.id if self.session is not None else f"rota@{self.peer}"

    # ---------------------------------------------------------------- the socket

    async def run(self) -> None:
        """Serve the socket until it closes; the worker is removed from the engine by then."""
        writer = asyncio.create_task(self._write_loop(), name=f"rota writer {self.peer}")
        self._arm_silence()
        try:
            while not self.closing:
                msg = await self.ws.receive()
                rate = self._rate
                if rate is not None and msg.type in _COUNTED and not rate.allow(self.loop.time()):
                    self.fatal(
                        RotaError(
                            ErrorCode.RATE_LIMITED,
                            f"more than {int(rate.rate)} messages per second",
                        )
                    )
                    break
                if msg.type is WSMsgType.TEXT:
                    self.service.runtime.note_read()
                    self._on_frame(msg.data)
                elif msg.type is WSMsgType.BINARY:
                    self.fatal(RotaError(ErrorCode.BINARY_MESSAGE, "messages are JSON text frames"))
                elif msg.type is WSMsgType.ERROR:
                    # aiohttp has already closed the socket with the fitting code (1009 for a
                    # frame over the hard limit, 1002 for a broken frame, ...).
                    log.info("%s: %s", self.name, msg.data)
                    too_big = getattr(msg.data, "code", None) == CloseCode.MESSAGE_TOO_BIG
                    count_error("ws_message_too_big" if too_big else "ws_protocol_error")
                    break
                else:  # the worker closed, or we did
                    break
        except Exception:
            log.exception("%s: connection failed", self.name)
            self.fatal(RotaError(ErrorCode.INTERNAL_ERROR, "internal error"))
        finally:
            self.close(CloseCode.NORMAL, "bye", reason=WORKER_LOST)
            try:
                await writer
            except asyncio.CancelledError:
                writer.cancel()
                raise
            finally:
                if self._abort is not None:
                    self._abort.cancel()

    async def _write_loop(self) -> None:
        ws = self.ws
        while True:
            item = await self._outbox.get()
            try:
                if isinstance(item, _Close):
                    await ws.close(code=item.code, message=item.reason.encode()[:120])
                    return
                if not ws.closed:
                    await ws.send_frame(item, WSMsgType.TEXT)
                self._queued -= len(item)
            except Exception as exc:  # the peer is gone; run() notices through receive()
                log.debug("%s: write failed: %r", self.name, exc)
                if isinstance(item, _Close):
                    return

    def _put(self, item: bytes | _Close) -> None:
        self._said = self.loop.time()
        if not isinstance(item, _Close):
            self._queued += len(item)
        self._outbox.put_nowait(item)

    def send(self, message: ServerMessage) -> None:
        if self.closing:
            return
        if (
            self._outbox.qsize() + len(self._waiting) >= self.options.max_outbox
            or self._queued > self._max_queued
        ):
            self.fatal(RotaError(ErrorCode.SLOW_READER, "the worker does not read what it is sent"))
            return
        if self._holds:  # behind a message that waits for a commit
            self._waiting.append(encode(message))
        else:
            self._put(encode(message))

    def send_when_durable(
        self, message: ServerMessage, failed: ServerMessage | None = None, *, in_order: bool = True
    ) -> None:
        """Send `message` once everything written so far is durable (the commit barrier);
        if that commit fails, send `failed` instead (None: send `message` anyway). In order:
        what is sent after it waits behind it; else it goes out on its own when committed
        (an `ack`, which nothing else depends on, so it delays no assignment)."""
        if self.closing:
            return
        if not in_order:
            self.runtime.after_durable(
                lambda ok: self.send(message if ok or failed is None else failed)
            )
            return
        self._holds += 1
        self.send(message)
        index = self._waiting_from + len(self._waiting) - 1  # where `message` is held

        def committed(ok: bool) -> None:
            if not ok and failed is not None and index >= self._waiting_from:
                self._waiting[index - self._waiting_from] = encode(failed)
            self._release(index + 1)

        self.runtime.after_durable(committed)

    def _release(self, end: int) -> None:
        """A commit awaited is done: send what was held up to position `end` (everything,
        once no commit is awaited)."""
        self._holds -= 1
        count = len(self._waiting) if not self._holds else end - self._waiting_from
        if count <= 0:
            return
        for data in self._waiting[:count]:
            self._put(data)
        del self._waiting[:count]
        self._waiting_from += count

    def close(self, code: int, text: str, *, reason: str) -> None:
        """Leave the engine (`reason` goes on the jobs requeued) and close the socket."""
        if self.closing:
            return
        self.closing = True
        self._leave(reason)
        self._put(_Close(code, text))
        # A peer that reads nothing can stall the close handshake: cut the TCP connection.
        self._abort = self.loop.call_later(self.options.close_timeout, self._abort_transport)

    def fatal(self, error: RotaError) -> None:
        """Tell the worker why, then close with the error's code."""
        if self.closing:
            return
        log.info("%s: closing: %s", self.name, error)
        count_error("ws_" + error.code)
        self._put(encode(ErrorMessage(error.code, error.message, True, error.job, error.seq)))
        code = error.close_code or CloseCode.POLICY_VIOLATION
        timeout = error.code is ErrorCode.HEARTBEAT_TIMEOUT
        self.close(code, str(error.code), reason=HEARTBEAT_TIMEOUT if timeout else WORKER_LOST)

    def _abort_transport(self) -> None:
        transport = self.request.transport
        if transport is not None:
            transport.abort()

    def _leave(self, reason: str) -> None:
        if self._silence is not None:
            self._silence.cancel()
            self._silence = None
        if self._beat is not None:
            self._beat.cancel()
            self._beat = None
        session = self.session
        if session is not None and session.state is not WorkerState.TERMINATED:
            self.engine.remove_worker(session, reason)
            self.service.connections.pop(session.id, None)
        self.logs_for.clear()

    # ---------------------------------------------------------------- liveness

    def _arm_silence(self) -> None:
        when = self._heard + self.options.heartbeat_timeout
        self._silence = self.loop.call_at(when, self._check_silence)

    def _check_silence(self) -> None:
        self._silence = None
        if self.closing:
            return
        timeout = self.options.heartbeat_timeout
        if self.loop.time() - self._heard >= timeout:
            self.fatal(RotaError(ErrorCode.HEARTBEAT_TIMEOUT, f"no message for {timeout:g}s"))
        else:
            self._arm_silence()

    def _arm_beat(self) -> None:
        self._beat = self.loop.call_at(self._said + self.options.beat_interval, self._check_beat)

    def _check_beat(self) -> None:
        """Say something when nothing was said for `beat_interval`: the worker knows we live."""
        self._beat = None
        if self.closing:
            return
        if self.loop.time() - self._said >= self.options.beat_interval:
            self.send(Beat())
            self._said = self.loop.time()  # a beat held behind a commit counts as said
        self._arm_beat()

    # ---------------------------------------------------------------- lifecycle

    def direct(self, state: WorkerState) -> None:
        """An operator's `running`, `quiet` or `terminate`: the engine stops (or resumes)
        assigning to the worker, and the worker is told."""
        session = self.session
        assert session is not None
        self.send(SetState(state.value))  # first: a resumed worker may be assigned at once
        self.engine.set_worker_state(session, state)
        log.info("%s: directed to %s", session.id, state.value)
        if state is WorkerState.RUNNING:
            self.request_work()
        self._end_if_done()

    def _end_if_done(self) -> None:
        """A terminating worker holding no jobs is closed once its results are durable (the
        `ack`s queued before go out first)."""
        session = self.session
        if (
            self._ending
            or session is None
            or session.state is not WorkerState.TERMINATE
            or session.jobs
        ):
            return
        self._ending = True
        self.runtime.after_durable(
            lambda ok: self.close(CloseCode.NORMAL, "terminated", reason=TERMINATED)
        )

    # ---------------------------------------------------------------- worker -> server

    def _on_frame(self, data: bytes | str) -> None:
        self._heard = self.loop.time()
        try:
            heartbeat = decode_worker_message(data, max_size=self.options.max_message)
            self._heartbeat(heartbeat)
        except RotaError as exc:
            if exc.fatal:
                self.fatal(exc)
            else:
                count_error("ws_" + exc.code)
                self.send(ErrorMessage(exc.code, exc.message, False, exc.job, exc.seq))

    def _refuse(self, code: ErrorCode, message: str, job: str | None, seq: int | None) -> None:
        """A part of a heartbeat the server ignores; the rest still counts."""
        count_error("ws_" + code)
        self.send(ErrorMessage(code, message, False, job, seq))

    def _heartbeat(self, hb: Heartbeat) -> None:
        session = self.session
        if session is None:
            if hb.register is None:
                raise RotaError(
                    ErrorCode.NOT_REGISTERED,
                    "the first heartbeat must carry a register part",
                    seq=hb.seq,
                )
            session = self._register(hb.register)
        elif hb.register is not None:
            self._refuse(
                ErrorCode.ALREADY_REGISTERED,
                "this connection is registered; reconnect to register again",
                None,
                hb.seq,
            )
        self.engine.touch(session)
        session.info["last_heartbeat"] = time.time()
        if hb.status is not None:
            self._status(session, hb.status, hb.seq)
        applied = 0
        for result in hb.results:
            applied += self._result(session, result, hb.seq)
        if applied and hb.seq is not None:
            refused = ErrorMessage(
                ErrorCode.STORE_UNAVAILABLE,
                "the results could not be made durable; they may run again",
                False,
                None,
                hb.seq,
            )
            self.send_when_durable(Ack(hb.seq), refused, in_order=False)
        if hb.wants is not None:
            self.wants = hb.wants
        extend_leases(self.engine, session)
        self.request_work()
        if applied:
            self._end_if_done()

    def _register(self, reg: Registration) -> WorkerSession:
        service = self.service
        session = WorkerSession(
            service.next_worker_id(), self, protocol="rota", dispatch=Dispatch.PUSH, capacity=0
        )
        session.name = reg.hostname or self.peer
        session.queues = frozenset(reg.queues) if reg.queues else None
        session.info.update(
            hostname=reg.hostname,
            os=reg.os,
            pid=reg.pid,
            peer=self.peer,
            connected_at=time.time(),
        )
        self.session = session
        self.specs = reg.specs
        beats = reg.revision >= BEATING_REVISION
        self.engine.add_worker(session)
        service.connections[session.id] = self
        self.verdicts = self._apply_specs(session)
        self.send(
            Welcome(
                session.id,
                self.options.heartbeat_timeout,
                self.options.max_message,
                self.verdicts,
                REVISION,
                self.options.beat_interval if beats else None,
            )
        )
        if beats:
            self._arm_beat()
        log.info("%s registered from %s (%s)", session.id, self.peer, reg.hostname)
        return session

    def _apply_specs(self, session: WorkerSession) -> tuple[SpecVerdict, ...]:
        """Make the session's abilities the specs whose checksum matches the registry's."""
        registry = self.service.specs
        verdicts = tuple(registry.verdict(ref) for ref in self.specs)
        accepted = {v.name for v in verdicts if v.accepted}
        for name in list(session.abilities):
            if name not in accepted:
                self.engine.remove_ability(session, name)
        for name in sorted(accepted):
            if name not in session.abilities:
                self.engine.add_ability(session, name)
        return verdicts

    def specs_changed(self) -> None:
        """The registry changed: re-judge this worker's specs and tell it if its verdicts moved."""
        session = self.session
        if session is None or self.closing:
            return
        verdicts = self._apply_specs(session)
        if verdicts != self.verdicts:
            self.verdicts = verdicts
            self.send(SpecsChanged(verdicts))
        self.request_work()

    def _held(self, session: WorkerSession, job_id: str, seq: int | None) -> Job | None:
        try:
            return self.engine.held_job(session, job_id)
        except JobNotHeld as exc:
            self._refuse(
                ErrorCode.JOB_NOT_HELD,
                f"job {job_id} is not held by this worker: it is {exc.holder}",
                job_id,
                seq,
            )
        return None

    def _status(self, session: WorkerSession, status: Status, seq: int | None) -> None:
        if status.cpu is not None:
            session.info["cpu"] = status.cpu
        if status.ram is not None:
            session.info["ram"] = status.ram
        engine = self.engine
        for progress in status.progress:
            job = self._held(session, progress.job, seq)
            if job is not None:
                engine.progress(job, progress.current, progress.total)
        for batch in status.logs:
            job = self._held(session, batch.job, seq)
            if job is None:
                continue
            if job.id not in self.logs_for:
                self._refuse(
                    ErrorCode.LOGS_NOT_REQUESTED,
                    f"the assignment of job {job.id} did not ask for logs; dropped",
                    job.id,
                    seq,
                )
                continue
            self.service.logs.append(job.id, batch.lines, worker=session.id, attempt=job.attempts)
        for alert in status.alerts:
            self.service.alerts.add(
                alert.level, alert.message, job=alert.job, worker=session.id, hostname=session.name
            )

    def _result(self, session: WorkerSession, result: Result, seq: int | None) -> bool:
        """Apply a result; False if it was refused (an `error` says why)."""
        job = self._held(session, result.job, seq)
        if job is None:
            return False
        self.logs_for.discard(job.id)
        engine = self.engine
        try:
            if isinstance(result, Failure):
                error: dict[str, Any] = {
                    "type": result.code,
                    "code": result.code,
                    "message": result.message or result.code,
                    "attempt": job.attempts,
                    "occurred_at": format_time(time.time()),
                }
                if result.details is not None:
                    error["details"] = result.details
                # Clients that asked for failure details (Gearman's exceptions) get the text.
                detail = f"{result.code}: {result.message}".encode()
                engine.fail(job, error, detail=detail, retry=result.retryable)
                job.error = error
            else:
                engine.complete(job, result.result)
                if result.value is not NO_VALUE:
                    if job.ext is None:
                        job.ext = {}
                    job.ext["result"] = result.value
        except EngineError as exc:  # not expected for a held job; never fatal to the socket
            self._refuse(ErrorCode.JOB_NOT_HELD, str(exc), job.id, seq)
            return False
        return True

    def request_work(self) -> None:
        """Credit = what the worker wants to hold minus what it holds: never more than asked."""
        session = self.session
        if session is None or self.closing:
            return
        session.capacity = self.wants
        self.engine.request_work(session, max(0, self.wants - len(session.jobs)))

    # ---------------------------------------------------------------- WorkerHandler

    def wake(self) -> None:  # PUSH workers are never woken
        pass

    def assign(self, job: Job) -> None:
        logs = wants_logs(job, self.options.logs)
        if logs:
            self.logs_for.add(job.id)
        assignment = Assignment(job_copy(job), logs)
        if job.max_attempts is not None and job.background:
            # An attempt limit must count the attempts a crash cut short: the job goes out
            # once its attempt is durable. Without a limit the count is only informative.
            self.send_when_durable(assignment)
        else:
            self.send(assignment)

    def revoke(self, job: Job, reason: str) -> None:
        self.logs_for.discard(job.id)
        self.send(Revoke(job.id, reason))
        if self.session is not None and self.session.state is WorkerState.TERMINATE:
            self.loop.call_soon(self._end_if_done)  # once the engine has let go of the job

    # ---------------------------------------------------------------- views

    def json(self) -> dict[str, Any]:
        session = self.session
        assert session is not None
        info = session.info
        return {
            "id": session.id,
            "hostname": info.get("hostname"),
            "os": info.get("os"),
            "pid": info.get("pid"),
            "peer": self.peer,
            "queues": sorted(session.queues) if session.queues is not None else None,
            "specs": [
                {"name": v.name, "checksum": v.checksum, "accepted": v.accepted, "reason": v.reason}
                for v in self.verdicts
            ],
            "state": session.state.value,
            "wants": self.wants,
            "jobs": sorted(session.jobs),
            "cpu": info.get("cpu"),
            "ram": info.get("ram"),
            "connected_at": format_time(info["connected_at"]),
            "last_heartbeat": format_time(info.get("last_heartbeat", info["connected_at"])),
        }
