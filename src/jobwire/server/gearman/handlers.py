"""The Gearman requests: each is decoded (by the `Scanner`), makes one engine call, and
its reply is encoded (`protocols.gearman.replies`).

A connection is a client (it may wait on foreground jobs) and a worker (it may hold jobs)
at once, as in gearmand. The engine talks back through the subscriber events
(`job_progress`, `job_output`, `job_finished`: a job this client waits on) and `wake`
(work for this worker).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Final

from jobwire.engine import (
    PRIORITY_HIGH,
    PRIORITY_LOW,
    PRIORITY_NORMAL,
    Dispatch,
    Job,
    JobState,
    Output,
    QueueFull,
    WorkerSession,
)
from jobwire.engine.job import ORIGIN_GEARMAN
from jobwire.protocols.gearman.decoder import AdminCommand, ProtocolError
from jobwire.protocols.gearman.packets import NO_JOB, NOOP, Packet
from jobwire.protocols.gearman.packets import PacketType as T
from jobwire.protocols.gearman.replies import (
    echo_res,
    job_assign,
    job_assign_all,
    job_assign_uniq,
    option_res,
    status_res,
    status_res_unique,
    work_result,
    work_status,
)
from jobwire.protocols.gearman.replies import error as error_reply
from jobwire.protocols.gearman.replies import work_fail as work_fail_reply
from jobwire.protocols.gearman.scanner import MAX_UNIQUE, handle_number
from jobwire.protocols.gearman.schedule import next_run, parse_field
from jobwire.server.errors import count_error
from jobwire.server.gearman.admin import admin_reply
from jobwire.server.gearman.transport import Transport

if TYPE_CHECKING:
    from jobwire.server.gearman.server import GearmanServer

log = logging.getLogger("jobwire.gearman")

# gearmand's JOB_NOT_FOUND texts differ by packet; clients may match on them.
NOT_HELD: Final = "Job given in work result not found"
NOT_ON_SERVER: Final = "Job does not exist on server"
EXCEPTION_NOT_FOUND: Final = "An exception was received for a job that does not exist"

MAX_CLIENT_ID: Final = 127
#: gearmand's least CAN_DO_TIMEOUT (libgearman-server/connection.cc raises shorter ones).
MIN_TIMEOUT_MS: Final = 1000

# Enum member lookups cost ~0.1 us each in Python 3.11; the per-packet paths use these.
_WORK_COMPLETE: Final = int(T.WORK_COMPLETE)
_WORK_DATA: Final = int(T.WORK_DATA)
_WORK_STATUS: Final = int(T.WORK_STATUS)
_WORK_WARNING: Final = int(T.WORK_WARNING)
_WORK_EXCEPTION: Final = int(T.WORK_EXCEPTION)
_GRAB_JOB: Final = int(T.GRAB_JOB)
_GRAB_JOB_ALL: Final = int(T.GRAB_JOB_ALL)
_ACTIVE: Final = JobState.ACTIVE
_COMPLETED: Final = JobState.COMPLETED
_DISCARDED: Final = JobState.DISCARDED
_PENDING: Final = JobState.PENDING
_OUTPUT_DATA: Final = Output.DATA


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


Handler = Callable[["GearmanConnection", tuple[bytes, ...]], None]


class GearmanConnection(Transport):
    """One client or worker connection: the `Sink` of its scanner, and the engine's
    `Subscriber` and `WorkerHandler` for it."""

    def __init__(self, server: GearmanServer) -> None:
        super().__init__(server)
        self.created = server.created
        self.client_id = "-"
        self.exceptions = server.options.exceptions
        self.worker: WorkerSession | None = None
        self.waiting: dict[Job, None] = {}  # foreground jobs this client waits on
        # OPTION_REQ grab-waits: a GRAB that finds no job waits for one instead of NO_JOB.
        self.grab_waits = False
        # The packet types of the GRABs waiting. A list, not a deque: it holds a few
        # entries, and compiled, a list's truth is native, a deque's a call.
        self.held_grabs: list[int] = []
        # An operator asked the worker to terminate: close once it holds no job.
        self.terminating = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        runtime = self.server.runtime
        if runtime.gate is not None and not runtime.admit():
            # The passive server of a Binary Star pair: refused, so clients fail over. What
            # the client sent meanwhile is dropped (`data_received` while closing).
            self.closing = True
            transport.close()
            return
        table = runtime.connections
        refused = table.admit(self.peer_ip)
        if refused is not None:
            # Over a connection bound (server/limits.py): told why, then closed.
            log.warning("refused a connection from %s: %s", self.peer_ip, refused)
            self.closing = True
            count_error("gearman_SERVER_BUSY")
            self._write(error_reply("SERVER_BUSY", refused))
            transport.close()
            return
        self.admitted = True
        self.idle = table.guard(runtime.loop, self.idle_timeout)
        self.conn_id = self.server.connection_made(self)
        if self.server.auth is not None:
            self.server.guard(self, transport)

    def idle_timeout(self) -> None:
        """Silent (or unauthenticated) for the idle timeout: told, then closed."""
        self.idle = None
        if not self.closing:
            log.info("closing %s: it sent nothing within the idle timeout", self.peer_ip)
            self.error("IDLE_TIMEOUT", "nothing received within the idle timeout")
            self.close_after_flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.connection_lost(self)
        engine = self.engine
        if self.worker is not None:
            engine.remove_worker(self.worker)
            self.worker = None
        for job in list(self.waiting):
            engine.unsubscribe(job, self)
        self.waiting.clear()
        super().connection_lost(exc)

    # ------------------------------------------------------------ sink: the scanner's calls

    def submit_plain(
        self, function: bytes, unique: bytes, payload: bytes, priority: int, background: bool
    ) -> None:
        """A submit without options (the hot path)."""
        if self.server.limiter is not None and self.rate_limited():
            return
        now = self.now
        if not now:
            now = self.now = self.engine.clock()
        try:
            job, created = self.engine.enqueue(
                self.server.name(function),
                payload,
                priority,
                background,
                None if background else self,
                _decode(unique) if len(unique) else None,
                now,
                ORIGIN_GEARMAN,
            )
        except QueueFull as exc:
            self.error("QUEUE_ERROR", str(exc))
            return
        self._job_created(job, created, background)

    def rate_limited(self) -> bool:
        """--rate-limit: whether this submission is over its principal's (or, without
        --auth, its peer address's) rate; if so it is answered ERROR RATE_LIMITED."""
        limiter = self.server.limiter
        if limiter is None:
            return False
        key = self.peer_ip if self.principal == "-" else self.principal  # as over HTTP
        wait = limiter.take(key)
        if not wait:
            return False
        self.error("RATE_LIMITED", f"over --rate-limit: retry in {wait:.3f} s")
        return True

    def work_complete(self, number: int, handle: bytes, result: bytes) -> None:
        job = self.held(number, handle, NOT_HELD)
        if job is not None:
            self.engine.complete(job, result)
            if self.terminating:
                self._terminate_if_idle()

    def grab(self, kind: int) -> None:
        worker = self.session()
        job = self.engine.grab(worker)
        if job is None:
            if self.grab_waits and worker.abilities:
                self.held_grabs.append(kind)
                self._wait_for_work(worker)
            else:
                self.send_now(NO_JOB)
            return
        self._assign(job, kind)
        if self.held_grabs:  # grabbing took the worker off the engine's waiting list
            self._wait_for_work(worker)

    def pre_sleep(self) -> None:
        if self.engine.sleep(self.session()):
            self.send_now(NOOP)

    def packet(self, packet: Packet) -> None:
        handler = HANDLERS.get(packet.type)
        if handler is None:  # a request type with no handler: ALL_YOURS, UNUSED
            self.error("INVALID_COMMAND", "Command not expected")
            return
        handler(self, packet.args)

    def admin(self, command: AdminCommand) -> None:
        cluster = self.server.runtime.cluster
        if cluster is not None and command.name == "status":  # every node's jobs
            from jobwire.server.gearman.cluster_status import answer_admin_status

            answer_admin_status(self, cluster, self.engine)
            return
        self.send(admin_reply(self.server, command))

    def protocol_error(self, error: ProtocolError) -> None:
        self.error(error.code, error.text)
        if error.fatal:
            self.close_after_flush()

    # ------------------------------------------------------------ engine callbacks

    # The subscriber events of a job this client waits on: the one place where the engine's
    # events become WORK_* packets.

    def job_progress(self, job: Job, done: int, total: int) -> None:
        """WORK_STATUS."""
        self.send(work_status(job.id.encode(), b"%d" % done, b"%d" % total))

    def job_output(self, job: Job, kind: Output, data: bytes) -> None:
        """WORK_DATA or WORK_WARNING."""
        ptype = _WORK_DATA if kind is _OUTPUT_DATA else _WORK_WARNING
        self.send(work_result(ptype, job.id.encode(), data))

    def job_finished(
        self, job: Job, state: JobState, result: bytes | None, error: bytes | None
    ) -> None:
        """WORK_COMPLETE; WORK_EXCEPTION with the worker's detail for a client that asked
        for exceptions; WORK_FAIL otherwise (a failure without detail, a cancel)."""
        handle = job.id.encode()
        if state is _COMPLETED:
            self.send(work_result(_WORK_COMPLETE, handle, result if result is not None else b""))
        elif state is _DISCARDED and error is not None and self.exceptions:
            self.send(work_result(_WORK_EXCEPTION, handle, error))
        else:
            self.send(work_fail_reply(handle))
        # Not `pop` (a method call once compiled), `in` and `del` (two look-ups) or
        # contextlib.suppress (a context manager).
        try:  # noqa: SIM105
            del self.waiting[job]
        except KeyError:
            pass

    def wake(self) -> None:
        """WorkerHandler: work is waiting."""
        if not self.held_grabs:
            self.send_now(NOOP)
            return
        # Hand the job to a waiting GRAB, after the engine call that woke us has finished.
        self.push_due = True
        if not self.dirty:
            self.dirty = True
            self.server.runtime.mark_dirty(self.flush_later)

    def assign(self, job: Job) -> None:  # pragma: no cover - Gearman workers pull
        raise AssertionError("Gearman workers are never pushed jobs")

    def revoke(self, job: Job, reason: str) -> None:
        """WorkerHandler: the job was taken back; a late result will get JOB_NOT_FOUND."""
        log.info("job %s taken from %s: %s", job.id, self.peer_ip, reason)

    # ------------------------------------------------------------ held GRABs (grab-waits)

    def before_flush(self) -> None:
        """Answer the held GRABs now that work may be there (`wake`)."""
        self.push_due = False
        worker = self.worker
        if worker is None or self.closing:
            return
        acks = self.acks
        count_before = acks.count
        held = self.held_grabs
        while held:
            job = self.engine.grab(worker)
            if job is None:
                break
            self._assign(job, held.pop(0))
        if held:
            self._wait_for_work(worker)
        if acks.count != count_before:
            acks.hold(self.sent, self.sent + len(self.out))

    def _wait_for_work(self, worker: WorkerSession) -> None:
        """GRABs are held: be woken (`wake`) when a job this worker can do is queued."""
        if self.engine.sleep(worker):  # one is there already
            self.push_due = True

    def _release_held_grabs(self) -> None:
        """The worker can take no job any more (no abilities left): answer its GRABs."""
        while self.held_grabs:
            self.held_grabs.pop(0)
            self.send(NO_JOB)

    # ------------------------------------------------------------ helpers

    def _job_created(self, job: Job, created: bool, background: bool) -> None:
        """Answer a submit: a foreground client now waits on the job; a background job's
        JOB_CREATED waits for the store (`acks`), and so does a foreground one's while a
        cluster holds the job until it has settled its unique key (it may name another)."""
        reply = self.created.reply(job.number, job.id)
        if not background:
            self.waiting[job] = None
            if job.state is _PENDING:
                self.acks.job_created(reply, created)
        elif self.durable:
            self.acks.job_created(reply, created)
        self.send(reply)

    def _assign(self, job: Job, kind: int) -> None:
        if job.max_attempts is not None and self.durable and job.background:
            # A retry limit must count the attempts a crash cut short: the job goes out
            # once its attempt is on disk. Without a limit the count is only informative,
            # and the assignment does not wait for the commit that records it.
            self.acks.needs_commit()
        handle = job.id.encode()
        function = self.server.raw_name(job.function)
        if kind == _GRAB_JOB:
            self.send(job_assign(handle, function, job.payload))
            return
        unique = _encode(job.unique or "")
        if kind == _GRAB_JOB_ALL and job.reducer is not None:
            self.send(job_assign_all(handle, function, unique, _encode(job.reducer), job.payload))
        else:
            self.send(job_assign_uniq(handle, function, unique, job.payload))

    def session(self) -> WorkerSession:
        worker = self.worker
        if worker is None:
            worker = self.worker = WorkerSession(
                f"gearman:{self.conn_id}", self, protocol="gearman", dispatch=Dispatch.WAKE
            )
            worker.name = self.client_id
            self.engine.add_worker(worker)
        return worker

    def held(self, number: int, handle: bytes, not_found: str) -> Job | None:
        """The job this connection holds under the handle, or None after an ERROR.

        `number` is N for a handle `PREFIX:N` (`handle_number`; `handle` may then be b"").
        Such a job is found by its number, and then by the job's id, whose hash the id
        keeps: decoding the handle made a string to hash every time."""
        worker = self.worker
        if worker is None:
            self.error("JOB_NOT_FOUND", not_found)
            return None
        if number:
            job = self.engine.jobs.numbered(number)
            if job is not None and worker.jobs.get(job.id) is job:
                return job
            if not len(handle):
                handle = self.server.id_prefix + str(number).encode()
        # A client chose the id, or this worker holds no such job.
        job = worker.jobs.get(_decode(handle))
        if job is None:
            self.error("JOB_NOT_FOUND", not_found)
        return job

    def held_by_handle(self, handle: bytes, not_found: str = NOT_HELD) -> Job | None:
        """`held` for a handle as sent."""
        number = handle_number(handle, 0, len(handle), self.server.id_prefix)
        return self.held(number, handle, not_found)

    # ------------------------------------------------------------ client packets

    def submit(
        self,
        args: tuple[bytes, ...],
        priority: int,
        background: bool,
        *,
        run_at: float | None = None,
        reducer: bytes | None = None,
    ) -> None:
        if self.server.limiter is not None and self.rate_limited():
            return
        raw_function, raw_unique, payload = args[0], args[1], args[-1]
        if len(raw_unique) > MAX_UNIQUE:
            self.error("ARGUMENT_TOO_LARGE", "Unique value too large")
            return
        try:
            job, created = self.engine.submit(
                self.server.name(raw_function),
                payload,
                unique=_decode(raw_unique) if raw_unique else None,
                priority=priority,
                background=background,
                subscriber=None if background else self,
                run_at=run_at,
                reducer=_decode(reducer) if reducer else None,
                origin=ORIGIN_GEARMAN,
            )
        except QueueFull as exc:
            self.error("QUEUE_ERROR", str(exc))
            return
        self._job_created(job, created, background)

    def submit_epoch(self, args: tuple[bytes, ...]) -> None:
        raw_epoch = args[2]
        if not raw_epoch.isdigit():
            self.error("INVALID_ARGUMENT", "Epoch must be a decimal number of seconds")
            return
        self.submit(args, PRIORITY_NORMAL, True, run_at=float(int(raw_epoch)))

    def submit_sched(self, args: tuple[bytes, ...]) -> None:
        """Run at the next minute matching the crontab-like fields (gearmand refuses this)."""
        try:
            fields = [
                parse_field(name, raw)
                for name, raw in zip(
                    ("minute", "hour", "mday", "month", "wday"), args[2:7], strict=True
                )
            ]
            when = next_run(self.engine.clock(), *fields)
        except ValueError as exc:
            self.error("INVALID_ARGUMENT", str(exc))
            return
        self.submit(args, PRIORITY_NORMAL, True, run_at=when)

    def get_status(self, args: tuple[bytes, ...]) -> None:
        job = self.engine.jobs.get(_decode(args[0]))
        if job is None:
            cluster = self.server.runtime.cluster
            if cluster is not None:  # another node may hold it
                from jobwire.server.gearman.cluster_status import answer_status

                answer_status(self, cluster, args[0])
                return
        known, running, numerator, denominator = _status_fields(job)
        self.send(status_res(args[0], known, running, numerator, denominator))

    def get_status_unique(self, args: tuple[bytes, ...]) -> None:
        unique = _decode(args[0])
        job = None
        if unique:
            uniques = self.engine.uniques
            for name in self.engine.functions:
                job = uniques.get((name, unique))
                if job is not None:
                    break
        known, running, numerator, denominator = _status_fields(job)
        clients = str(len(job.subscribers or ())) if job is not None else "0"
        self.send(
            status_res_unique(args[0], known, running, numerator, denominator, clients.encode())
        )

    def option(self, args: tuple[bytes, ...]) -> None:
        if args[0] == b"exceptions":
            self.exceptions = True
            self.send(option_res(args[0]))
        elif args[0] == b"grab-waits":
            self.grab_waits = True
            self.send(option_res(args[0]))
        else:
            self.error("UNKNOWN_OPTION", "Server does not recognize given option")

    def set_client_id(self, args: tuple[bytes, ...]) -> None:
        self.client_id = _decode(args[0][:MAX_CLIENT_ID]) or "-"
        if self.worker is not None:
            self.worker.name = self.client_id

    # ------------------------------------------------------------ worker packets

    def can_do(self, args: tuple[bytes, ...]) -> None:
        self.engine.add_ability(self.session(), self.server.name(args[0]))

    def can_do_timeout(self, args: tuple[bytes, ...]) -> None:
        """As gearmand: the timeout is in milliseconds, at least MIN_TIMEOUT_MS; 0 or a
        negative number sets none. A job held past it is requeued with its attempt counted
        (clients get WORK_FAIL once --job-retries are spent) and the worker's late result
        gets JOB_NOT_FOUND."""
        raw_timeout = args[1]
        if not raw_timeout.removeprefix(b"-").isdigit():
            self.error("INVALID_ARGUMENT", "Timeout must be a decimal number of milliseconds")
            return
        timeout_ms = int(raw_timeout)
        timeout = max(timeout_ms, MIN_TIMEOUT_MS) / 1000 if timeout_ms > 0 else None
        self.engine.add_ability(self.session(), self.server.name(args[0]), timeout)

    def cant_do(self, args: tuple[bytes, ...]) -> None:
        if self.worker is not None:
            self.engine.remove_ability(self.worker, self.server.name(args[0]))
            if not self.worker.abilities:
                self._release_held_grabs()

    def reset_abilities(self, args: tuple[bytes, ...]) -> None:
        if self.worker is not None:
            self.engine.reset_abilities(self.worker)
            self._release_held_grabs()

    def work_status(self, args: tuple[bytes, ...]) -> None:
        job = self.held_by_handle(args[0])
        if job is None:
            return
        if not (args[1].isdigit() and args[2].isdigit()):
            # gearmand forwards junk and reports 0/0; tell the worker instead.
            self.error("INVALID_ARGUMENT", "WORK_STATUS needs decimal numerator and denominator")
            return
        self.engine.progress(job, int(args[1]), int(args[2]))

    def work_output(self, args: tuple[bytes, ...], kind: Output) -> None:
        job = self.held_by_handle(args[0], NOT_ON_SERVER)
        if job is not None:
            self.engine.output(job, kind, args[1])

    def work_fail(self, args: tuple[bytes, ...]) -> None:
        job = self.held_by_handle(args[0])
        if job is not None:
            self.engine.fail(job, "WORK_FAIL")  # no detail: clients get WORK_FAIL
            if self.terminating:
                self._terminate_if_idle()

    def work_exception(self, args: tuple[bytes, ...]) -> None:
        job = self.held_by_handle(args[0], EXCEPTION_NOT_FOUND)
        if job is not None:
            self.engine.fail(job, args[1], detail=args[1])
            if self.terminating:
                self._terminate_if_idle()

    def terminate_when_idle(self) -> None:
        """An operator's `terminate`: the engine gives the worker nothing new (its state);
        the connection closes once the jobs it holds are done."""
        self.terminating = True
        self._terminate_if_idle()

    def _terminate_if_idle(self) -> None:
        worker = self.worker
        if worker is None or not worker.jobs:
            self.close_after_flush()


def _status_fields(job: Job | None) -> tuple[bytes, bytes, bytes, bytes]:
    if job is None or job.state.terminal:
        return b"0", b"0", b"0", b"0"
    running = b"1" if job.state is _ACTIVE else b"0"
    done, total = job.progress or (0, 0)
    return b"1", running, b"%d" % done, b"%d" % total


def _submitter(priority: int, background: bool) -> Handler:
    return partial(GearmanConnection.submit, priority=priority, background=background)


def _reducer(background: bool) -> Handler:
    # libgearman's layout: FUNCTION, UNIQUE, REDUCER, AGGREGATOR (always empty), DATA.
    return lambda conn, args: conn.submit(args, PRIORITY_NORMAL, background, reducer=args[2])


#: The requests the scanner passes on as a `Packet` (`GearmanConnection.packet`): the plain
#: submits come here only with a unique id over `MAX_UNIQUE`.
HANDLERS: dict[int, Handler] = {
    T.SUBMIT_JOB: _submitter(PRIORITY_NORMAL, False),
    T.SUBMIT_JOB_BG: _submitter(PRIORITY_NORMAL, True),
    T.SUBMIT_JOB_HIGH: _submitter(PRIORITY_HIGH, False),
    T.SUBMIT_JOB_HIGH_BG: _submitter(PRIORITY_HIGH, True),
    T.SUBMIT_JOB_LOW: _submitter(PRIORITY_LOW, False),
    T.SUBMIT_JOB_LOW_BG: _submitter(PRIORITY_LOW, True),
    T.SUBMIT_JOB_EPOCH: GearmanConnection.submit_epoch,
    T.SUBMIT_JOB_SCHED: GearmanConnection.submit_sched,
    T.SUBMIT_REDUCE_JOB: _reducer(False),
    T.SUBMIT_REDUCE_JOB_BACKGROUND: _reducer(True),
    T.GET_STATUS: GearmanConnection.get_status,
    T.GET_STATUS_UNIQUE: GearmanConnection.get_status_unique,
    T.ECHO_REQ: lambda conn, args: conn.send(echo_res(args[0])),
    T.OPTION_REQ: GearmanConnection.option,
    T.SET_CLIENT_ID: GearmanConnection.set_client_id,
    T.CAN_DO: GearmanConnection.can_do,
    T.CAN_DO_TIMEOUT: GearmanConnection.can_do_timeout,
    T.CANT_DO: GearmanConnection.cant_do,
    T.RESET_ABILITIES: GearmanConnection.reset_abilities,
    T.WORK_STATUS: GearmanConnection.work_status,
    T.WORK_DATA: partial(GearmanConnection.work_output, kind=Output.DATA),
    T.WORK_WARNING: partial(GearmanConnection.work_output, kind=Output.WARNING),
    T.WORK_FAIL: GearmanConnection.work_fail,
    T.WORK_EXCEPTION: GearmanConnection.work_exception,
}
