"""The Gearman listener: decode packets, call the engine, encode replies.

One `GearmanConnection` per TCP connection. Every complete packet in a read is handled
before anything is written, and each connection writes at most once per loop turn. A
connection is a client (it may wait on foreground jobs) and a worker (it may hold jobs)
at once, as in gearmand.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, cast

from mypy_extensions import i64

from jobwire import __version__
from jobwire.engine import (
    PRIORITY_HIGH,
    PRIORITY_LOW,
    PRIORITY_NORMAL,
    Dispatch,
    Engine,
    IllegalTransition,
    Job,
    JobState,
    Output,
    QueueFull,
    WorkerSession,
)
from jobwire.engine.schedule import next_run, parse_field
from jobwire.protocols.gearman import admin
from jobwire.protocols.gearman.decoder import AdminCommand, Decoder, ProtocolError
from jobwire.protocols.gearman.packets import HEADER_SIZE, NO_JOB, NOOP, Packet, encode, header
from jobwire.protocols.gearman.packets import PacketType as T
from jobwire.server.runtime import Runtime

log = logging.getLogger("jobwire.gearman")

# gearmand's JOB_NOT_FOUND texts differ by packet; clients may match on them.
NOT_HELD: Final = "Job given in work result not found"
NOT_ON_SERVER: Final = "Job does not exist on server"
EXCEPTION_NOT_FOUND: Final = "An exception was received for a job that does not exist"

MAX_UNIQUE: Final = 64
MAX_CLIENT_ID: Final = 127
#: Output a peer leaves unread beyond this is a peer we stop serving.
MAX_PENDING_OUTPUT: Final = 256 * 1024 * 1024
#: Replaces the JOB_CREATED of a background job whose store commit failed.
# Enum member lookups cost ~0.1 us each in Python 3.11; the per-packet paths use these.
_ERROR: Final = int(T.ERROR)
_WORK_COMPLETE: Final = int(T.WORK_COMPLETE)
_WORK_DATA: Final = int(T.WORK_DATA)
_WORK_STATUS: Final = int(T.WORK_STATUS)
_WORK_WARNING: Final = int(T.WORK_WARNING)
_WORK_EXCEPTION: Final = int(T.WORK_EXCEPTION)
_WORK_FAIL: Final = int(T.WORK_FAIL)
_JOB_CREATED: Final = int(T.JOB_CREATED)
_STATUS_RES: Final = int(T.STATUS_RES)
_STATUS_RES_UNIQUE: Final = int(T.STATUS_RES_UNIQUE)
_OPTION_RES: Final = int(T.OPTION_RES)
_GRAB_JOB: Final = int(T.GRAB_JOB)
_GRAB_JOB_ALL: Final = int(T.GRAB_JOB_ALL)
_GRAB_JOB_UNIQ: Final = int(T.GRAB_JOB_UNIQ)
_JOB_ASSIGN: Final = int(T.JOB_ASSIGN)
_JOB_ASSIGN_ALL: Final = int(T.JOB_ASSIGN_ALL)
_JOB_ASSIGN_UNIQ: Final = int(T.JOB_ASSIGN_UNIQ)
_ECHO_RES: Final = int(T.ECHO_RES)
_COMPLETED: Final = JobState.COMPLETED
_DISCARDED: Final = JobState.DISCARDED
_OUTPUT_DATA: Final = Output.DATA
_ACTIVE: Final = JobState.ACTIVE

NOT_STORED: Final = encode(_ERROR, b"QUEUE_ERROR", b"Job could not be stored")

_PRE_SLEEP: Final = int(T.PRE_SLEEP)
_PLAIN_SUBMITS: Final[dict[int, tuple[int, bool]]] = {
    T.SUBMIT_JOB: (PRIORITY_NORMAL, False),
    T.SUBMIT_JOB_BG: (PRIORITY_NORMAL, True),
    T.SUBMIT_JOB_HIGH: (PRIORITY_HIGH, False),
    T.SUBMIT_JOB_HIGH_BG: (PRIORITY_HIGH, True),
    T.SUBMIT_JOB_LOW: (PRIORITY_LOW, False),
    T.SUBMIT_JOB_LOW_BG: (PRIORITY_LOW, True),
}
#: SUBMIT_JOB* packets without extra fields: (priority, background) at the index of their
#: packet type, None at the others. Compiled, indexing a list is native; a dict lookup by
#: integer hashes and compares objects.
_PLAIN_SUBMIT_BY_TYPE: Final[list[tuple[int, bool] | None]] = [
    _PLAIN_SUBMITS.get(ptype) for ptype in range(max(_PLAIN_SUBMITS) + 1)
]
#: JOB_CREATED headers by handle length, for handles up to 63 bytes (all of ours).
_JOB_CREATED_HEADS: Final = [encode(_JOB_CREATED, bytes(size))[:HEADER_SIZE] for size in range(64)]
#: b"000" to b"999": the last three digits of a handle the engine numbered.
_LAST_DIGITS: Final = [b"%03d" % low for low in range(1000)]


# The hot path reads headers and finds separators with these instead of struct and split:
# compiled, indexing bytes is a native operation, and no intermediate objects are made.
# Their `i64` locals are machine integers (no overflow checks, no boxing); they take and
# return `int`, as slicing with an `i64` index would take mypyc's generic path.
def _request_head(data: bytes, pos: int) -> int:
    """The header at data[pos:pos + 12] as `type << 32 | size`, or -1 if it is not a
    request's or its type is out of range (the decoder then reports it)."""
    at: i64 = pos
    if data[at] != 0 or data[at + 1] != 82 or data[at + 2] != 69 or data[at + 3] != 81:
        return -1  # not b"\0REQ"
    if data[at + 4] or data[at + 5]:
        return -1  # a type over 65535: none exists
    ptype: i64 = (data[at + 6] << 8) | data[at + 7]
    b0: i64 = data[at + 8]
    b1: i64 = data[at + 9]
    b2: i64 = data[at + 10]
    b3: i64 = data[at + 11]
    return (ptype << 32) | (b0 << 24) | (b1 << 16) | (b2 << 8) | b3


def _find_nul(data: bytes, pos: int, stop: int) -> int:
    """The index of the first NUL byte in data[pos:stop], or -1."""
    at: i64 = pos
    end: i64 = stop
    while at < end:
        if data[at] == 0:
            return at
        at += 1
    return -1


@dataclass(slots=True)
class GearmanOptions:
    exceptions: bool = False  # forward WORK_EXCEPTION to every client (gearmand --exceptions)
    max_packet: int = 64 * 1024 * 1024
    keepalive: bool = False
    keepalive_idle: int = 30
    keepalive_interval: int = 10
    keepalive_count: int = 5
    verbose: str = "ERROR"


_NUL: Final = b"\0"


def _reply(ptype: int, handle: bytes, data: bytes) -> bytes:
    """A packet of a handle and data (WORK_COMPLETE and the like): `encode` without its
    tuple of fields. Compiled, concatenating costs less than a join of so few parts."""
    return header(ptype, len(handle) + 1 + len(data)) + handle + _NUL + data


def _closed() -> bool:
    return True


def _drop(data: bytes) -> None:
    pass


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


class GearmanServer:
    """Listener state shared by its connections."""

    def __init__(self, runtime: Runtime, options: GearmanOptions) -> None:
        self.runtime = runtime
        self.engine: Engine = runtime.engine
        self.options = options
        self.connections: dict[int, GearmanConnection] = {}
        self._next_conn_id = 0
        self._names: dict[bytes, str] = {}
        self._last_raw = b""  # the last name decoded, and what it decoded to
        self._last_name = ""
        self._raw_names: dict[str, bytes] = {}  # names encoded (`raw_name`)
        self._last_encoded = ""  # the last name encoded, and what it encoded to
        self._last_encoded_raw = b""
        self._id_prefix = _encode(self.engine.jobs.prefix)  # of the ids the engine numbers
        # JOB_CREATED of the jobs of one block of a thousand numbers (`created_reply`): the
        # block, and their replies' common start.
        self._created_block = 0
        self._created_start = b""

    def name(self, raw: bytes) -> str:
        """Function names repeat on every packet; decode each once."""
        if raw == self._last_raw:  # a run of one function: compare, no hashing
            return self._last_name
        name = self._names.get(raw)
        if name is None:
            if len(self._names) > 65536:
                self._names.clear()
            name = self._names[raw] = _decode(raw)
        self._last_raw = raw
        self._last_name = name
        return name

    def raw_name(self, name: str) -> bytes:
        """A function name as sent to workers, encoded once. A job's name is most often the
        very string `name()` made, so an identity check finds it."""
        if name is self._last_encoded:
            return self._last_encoded_raw
        raw = self._raw_names.get(name)
        if raw is None:
            if len(self._raw_names) > 65536:
                self._raw_names.clear()
            raw = self._raw_names[name] = _encode(name)
        self._last_encoded = name
        self._last_encoded_raw = raw
        return raw

    def created_reply(self, job: Job) -> bytes:
        """JOB_CREATED for `job`.

        The engine numbers ids `PREFIX:N` (`Engine.next_handle`), so those of a block of a
        thousand numbers from 1000 on differ only in their last three digits, and so do
        their replies: the common start is made once per block. Encoding each handle and
        joining it to its header cost twice as many instructions.
        """
        number = job.number
        if number >= 1000 and number // 1000 == self._created_block:
            return self._created_start + _LAST_DIGITS[number % 1000]
        handle = job.id.encode()
        size = len(handle)
        if size >= len(_JOB_CREATED_HEADS):
            return encode(_JOB_CREATED, handle)
        if number >= 1000:  # the first of its block: keep the start for the others
            self._created_block = number // 1000
            self._created_start = _JOB_CREATED_HEADS[size] + handle[:-3]
        return _JOB_CREATED_HEADS[size] + handle

    def handle_number(self, data: bytes, begin: int, stop: int) -> int:
        """N if data[begin:stop] is `PREFIX:N` as the engine writes its ids, else 0 (read in
        place: the hot path finds a result's handle without slicing it out)."""
        prefix = self._id_prefix
        first: i64 = begin
        start: i64 = first + len(prefix)  # where the digits begin
        end: i64 = stop
        if end <= start or end - start > 18 or data[start] == 48:  # no digits, too many, "0…"
            return 0
        number: i64 = 0
        at = start
        while at < end:
            digit: i64 = data[at] - 48
            if digit < 0 or digit > 9:
                return 0
            number = number * 10 + digit
            at += 1
        at = first
        while at < start:
            if data[at] != prefix[at - first]:
                return 0
            at += 1
        return number

    def connection_made(self, conn: GearmanConnection) -> int:
        self._next_conn_id += 1
        self.connections[self._next_conn_id] = conn
        return self._next_conn_id

    def connection_lost(self, conn: GearmanConnection) -> None:
        self.connections.pop(conn.conn_id, None)

    def protocol_factory(self) -> GearmanConnection:
        return GearmanConnection(self)


Handler = Callable[["GearmanConnection", tuple[bytes, ...]], None]


class _Hold:
    """Output held until a store commit: everything queued before `end`, and the
    JOB_CREATED replies it holds, to retract if the commit fails: those of new jobs
    (`created`), and of submits that joined a job that already existed (`joined`, None
    if there are none, as is most often the case).

    The replies themselves are kept, not their positions: a failed commit finds them in
    the output by identity and their jobs by handle, so acknowledging a job costs one
    append."""

    __slots__ = ("created", "end", "joined")

    def __init__(self, end: int, created: list[bytes], joined: list[bytes] | None) -> None:
        self.end = end
        self.created = created
        self.joined = joined


class GearmanConnection(asyncio.Protocol):
    """One client or worker connection."""

    def __init__(self, server: GearmanServer) -> None:
        self.server = server
        self.engine = server.engine
        self.decoder = Decoder(max_packet=server.options.max_packet)
        self.transport: asyncio.Transport | None = None
        # The transport's `write` and `is_closing`, bound once: compiled, calling a method
        # by name looks it up in the transport's type on every call.
        self._write: Callable[[bytes], None] = _drop
        self._is_closing: Callable[[], bool] = _closed
        #: `flush`, bound once, for the runtime to call at the end of a loop turn.
        self.flush_later: Callable[[], None] = self.flush
        self.out: list[bytes] = []
        self.dirty = False
        # Output held until the store commits, so JOB_CREATED means durable. Positions count
        # every entry ever queued on `out`; `sent` is the position of out[0].
        self.sent = 0
        # Each batch awaiting its commit. Lists, here and for held_grabs, not deques: they
        # hold a few entries, and compiled, a list's truth is native, a deque's a call.
        self.holds: list[_Hold] = []
        self.released = 0  # while holding, output before this position may go out
        # JOB_CREATED replies of the current read, which its hold takes over (see `_Hold`)
        self.created_acks: list[bytes] = []
        self.joined_acks: list[bytes] = []
        self.durable = server.runtime.durable_store
        # Replies queued so far that may only go out once the store has what they announce.
        self.durable_replies = 0
        self.closing = False
        self.write_paused = False  # the transport's buffer is over its high-water mark
        self.conn_id = 0
        self.fd = -1
        self.peer_ip = "-"
        self.client_id = "-"
        self.exceptions = server.options.exceptions
        self.worker: WorkerSession | None = None
        self.waiting: dict[Job, None] = {}  # foreground jobs this client waits on
        # OPTION_REQ grab-waits: a GRAB that finds no job waits for one instead of NO_JOB.
        self.grab_waits = False
        self.held_grabs: list[int] = []  # the packet types of the GRABs waiting
        self.push_due = False  # a held GRAB may be answered: do it before the next flush
        # In `data_received`: a commit reported meanwhile (`Store.poll`) must not flush the
        # replies of the read, which are not held yet.
        self.reading = False

    # ------------------------------------------------------------ transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self._write = self.transport.write
        self._is_closing = self.transport.is_closing
        self.conn_id = self.server.connection_made(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self.fd = sock.fileno()
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self.server.options.keepalive:
                    _set_keepalive(sock, self.server.options)
            except OSError:
                pass
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and peer:
            self.peer_ip = str(peer[0])

    #: Handle the common packets in `_run_hot`; False sends everything through the decoder
    #: (the reference behaviour the hot path must match: see tests/server/test_hot_path.py).
    hot_path = True

    def data_received(self, data: bytes) -> None:
        self.server.runtime.note_read()
        decoder = self.decoder
        if decoder.buffered:
            if decoder.short_of(len(data)):  # the buffered packet is still incomplete
                decoder.feed(data)
                return
            data = decoder.take_buffered() + data
        durable_before = self.durable_replies
        was_dirty = self.dirty
        self.dirty = True  # sends below need not mark the connection: done once at the end
        self.reading = True
        try:
            if self.hot_path and not decoder.failed:
                done = self._run_hot(data)
                if done:
                    data = data[done:]
            if len(data):  # compiled, len() is native where the truth of bytes is a call
                self._run_messages(data)
        finally:
            self.reading = False
        if self.durable_replies != durable_before:
            self._hold_until_committed()
        if not was_dirty:
            runtime = self.server.runtime
            if runtime.idle_turn and not self.holds:
                # Nothing else waits for the end of the turn: the replies go now, a loop
                # pass sooner (on a serial round trip, the worker's JOB_ASSIGN).
                self.flush()
            else:
                # Written at the end of the loop turn, with whatever other reads of this turn
                # add (a client's JOB_CREATED together with results of its jobs), and after
                # the events this read made for other connections, which a job waits for.
                runtime.mark_dirty(self.flush_later)

    def _hold_until_committed(self) -> None:
        """Acknowledge only what is durable: hold the output queued so far until commit."""
        if not self.holds and self.released < self.sent:
            # A commit polled for during the read may have released more than was sent.
            self.released = self.sent
        joined = self.joined_acks
        if joined:
            self.joined_acks = []
        hold = _Hold(self.sent + len(self.out), self.created_acks, joined or None)
        self.created_acks = []
        self.holds.append(hold)
        self.server.runtime.after_durable(lambda ok: self._release(hold, ok))

    def _run_hot(self, data: bytes) -> int:
        """Handle the complete packets at the front of `data`; return the bytes consumed.

        The common packets (plain submits with or without a unique id, grab, complete,
        sleep) are handled here without building messages; any other complete packet goes
        through the decoder on its own. A text line, a partial or oversized packet or a bad
        magic stops the run: the decoder takes the rest, so framing errors are handled in one
        place.
        """
        pos = 0
        end = len(data)
        max_packet = self.decoder.max_packet
        now = 0.0  # the time of this read's submits: read once, at the first
        # A durable store's commits are polled for every 16 packets: a read of many submits
        # runs for tens of microseconds, and other clients' acknowledgements need not wait.
        poll = self.server.runtime.poll_commits if self.durable else None
        count = 0
        while end - pos >= 12:
            count += 1
            if poll is not None and not count & 15:
                poll()
            head = _request_head(data, pos)
            if head < 0:
                break
            size = head & 0xFFFFFFFF
            start = pos + 12
            stop = start + size
            if stop > end or size > max_packet:
                break
            ptype = head >> 32
            try:
                if ptype == _WORK_COMPLETE:
                    nul = _find_nul(data, start, stop)
                    if nul >= 0:
                        job = self.held_in(data, start, nul)
                        if job is not None:
                            self.engine.complete(job, data[nul + 1 : stop])
                        pos = stop
                        continue
                elif ptype in (_GRAB_JOB, _GRAB_JOB_UNIQ):
                    self.grab((), ptype)
                    pos = stop
                    continue
                elif ptype == _PRE_SLEEP:
                    self.pre_sleep(())
                    pos = stop
                    continue
                else:
                    table = _PLAIN_SUBMIT_BY_TYPE
                    plain = table[ptype] if ptype < len(table) else None
                    if plain is not None:
                        # The fields are function, unique id, payload: find the two NULs
                        # instead of splitting, which would copy the packet body once more.
                        nul = _find_nul(data, start, stop)
                        nul2 = _find_nul(data, nul + 1, stop) if nul >= 0 else -1
                        if nul2 >= 0 and nul2 - nul - 1 <= MAX_UNIQUE:
                            # No *plain: a starred call is a slow generic call once compiled.
                            priority, background = plain
                            if not now:
                                now = self.engine.clock()
                            self.submit_plain(
                                data[start:nul],
                                data[nul + 1 : nul2],
                                data[nul2 + 1 : stop],
                                priority,
                                background,
                                now,
                            )
                            pos = stop
                            continue
            except Exception:  # one bad request must not take the connection down
                log.exception("handling packet type %d failed", ptype)
                self.error("SERVER_ERROR", "Internal error handling the request")
                pos = stop
                continue
            # Any other packet, or a malformed common one: the general way, on its own.
            self._run_messages(data[pos:stop])
            if self.decoder.failed:  # an unknown packet type: nothing after it is read
                return end
            pos = stop
        return pos

    def _run_messages(self, data: bytes) -> None:
        """Decode `data` into messages and handle each (every packet type, errors, admin)."""
        for message in self.decoder.feed(data):
            if type(message) is Packet:
                handler = HANDLERS.get(message.type)
                if handler is None:  # a request type with no handler: ALL_YOURS, UNUSED
                    self.error("INVALID_COMMAND", "Command not expected")
                    continue
                try:
                    handler(self, message.args)
                except Exception:  # one bad request must not take the connection down
                    log.exception("handling %r failed", message)
                    self.error("SERVER_ERROR", "Internal error handling the request")
            elif type(message) is AdminCommand:
                self.admin(message)
            else:
                assert isinstance(message, ProtocolError)
                self.error(message.code, message.text)
                if message.fatal:
                    self.close_after_flush()
                    break

    def _release(self, hold: _Hold, ok: bool) -> None:
        """The batch `hold` holds is durable, or (not ok) its commit failed."""
        del self.holds[0]  # commits finish in order
        self.released = hold.end
        if not ok:
            self._retract(hold)
        if not self.reading:  # else the read's end flushes
            self.flush()

    def _retract(self, hold: _Hold) -> None:
        """The clients must not believe the jobs were accepted, and they must not run."""
        replies = hold.created + hold.joined if hold.joined else hold.created
        retracted = {id(reply) for reply in replies}
        out = self.out
        for index in range(min(hold.end - self.sent, len(out))):  # those not yet sent
            if id(out[index]) in retracted:
                out[index] = NOT_STORED
        # The engine has retracted the new jobs of the failed commit (`Engine.retract`).

    def pause_writing(self) -> None:
        # The peer reads slower than we answer: stop reading its requests until it catches up.
        self.write_paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.transport is not None and not self.closing:
            self.transport.resume_reading()

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
        self.sent += len(self.out)
        self.out.clear()
        # The bound methods hold the transport, which holds this protocol.
        self._write, self._is_closing = _drop, _closed

    # ------------------------------------------------------------ output

    def send(self, data: bytes) -> None:
        self.out.append(data)
        if not self.dirty:
            self.dirty = True
            self.server.runtime.mark_dirty(self.flush_later)

    def send_now(self, data: bytes) -> None:
        """Write at once, ahead of this turn's batch: for NOOP and NO_JOB.

        They go out at most once each time a worker runs dry, so writing them alone costs
        no batching under load, and it takes a write off the critical path of the next job
        (the worker sleeps, or is woken, before the other replies of this turn are written).
        """
        transport = self.transport
        if (
            transport is not None
            and not self.out
            and not self.holds
            and not self.closing
            and not self.write_paused
        ):
            self._write(data)
            self.sent += 1
        else:
            self.send(data)

    def flush(self) -> None:
        if self.push_due:
            self._answer_held_grabs()
        self.dirty = False
        out = self.out
        count = self.released - self.sent if self.holds else len(out)
        if count <= 0:
            return
        transport = self.transport
        if transport is None or self._is_closing():
            transport = None  # gone: drop what was meant for it
            count = len(out)
        elif count == 1:
            self._write(out[0])
        else:
            self._write(b"".join(out[:count]))
        if count == len(out):
            out.clear()
        else:
            del out[:count]
        self.sent += count
        if transport is None:
            return
        if self.closing and not self.holds:
            transport.close()
        elif self.write_paused and transport.get_write_buffer_size() > MAX_PENDING_OUTPUT:
            log.warning("closing %s: it does not read its replies", self.peer_ip)
            transport.abort()

    def error(self, code: str, text: str) -> None:
        self.send(encode(_ERROR, code.encode(), text.encode()))

    def close_after_flush(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.pause_reading()
        if not self.dirty:
            self.dirty = True
            self.server.runtime.mark_dirty(self.flush_later)

    # ------------------------------------------------------------ engine callbacks

    def job_progress(self, job: Job, done: int, total: int) -> None:
        """Subscriber: WORK_STATUS."""
        self.send(encode(_WORK_STATUS, job.id.encode(), b"%d" % done, b"%d" % total))

    def job_output(self, job: Job, kind: Output, data: bytes) -> None:
        """Subscriber: WORK_DATA or WORK_WARNING."""
        ptype = _WORK_DATA if kind is _OUTPUT_DATA else _WORK_WARNING
        self.send(_reply(ptype, job.id.encode(), data))

    def job_finished(
        self, job: Job, state: JobState, result: bytes | None, error: bytes | None
    ) -> None:
        """Subscriber: WORK_COMPLETE; WORK_EXCEPTION with the worker's detail for a client
        that asked for exceptions; WORK_FAIL otherwise (a failure, a cancel)."""
        handle = job.id.encode()
        if state is _COMPLETED:
            self.send(_reply(_WORK_COMPLETE, handle, result if result is not None else b""))
        elif state is _DISCARDED and error is not None and self.exceptions:
            self.send(_reply(_WORK_EXCEPTION, handle, error))
        else:
            self.send(encode(_WORK_FAIL, handle))
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

    def _answer_held_grabs(self) -> None:
        self.push_due = False
        worker = self.worker
        if worker is None or self.closing:
            return
        durable_before = self.durable_replies
        held = self.held_grabs
        while held:
            job = self.engine.grab(worker)
            if job is None:
                break
            self._assign(job, held.pop(0))
        if held:
            self._wait_for_work(worker)
        if self.durable_replies != durable_before:
            self._hold_until_committed()

    def _wait_for_work(self, worker: WorkerSession) -> None:
        """GRABs are held: be woken (`wake`) when a job this worker can do is queued."""
        if self.engine.sleep(worker):  # one is there already
            self.push_due = True

    def _release_held_grabs(self) -> None:
        """The worker can take no job any more (no abilities left): answer its GRABs."""
        while self.held_grabs:
            self.held_grabs.pop(0)
            self.send(NO_JOB)

    def assign(self, job: Job) -> None:  # pragma: no cover - Gearman workers pull
        raise AssertionError("Gearman workers are never pushed jobs")

    def revoke(self, job: Job, reason: str) -> None:
        """WorkerHandler: the job was taken back; a late result will get JOB_NOT_FOUND."""
        log.info("job %s taken from %s: %s", job.id, self.peer_ip, reason)

    # ------------------------------------------------------------ worker helpers

    def session(self) -> WorkerSession:
        worker = self.worker
        if worker is None:
            worker = self.worker = WorkerSession(
                f"gearman:{self.conn_id}", self, protocol="gearman", dispatch=Dispatch.WAKE
            )
            worker.name = self.client_id
            self.engine.add_worker(worker)
        return worker

    def held(self, raw_handle: bytes, not_found: str = NOT_HELD) -> Job | None:
        """The job this connection holds under the handle, or None after an ERROR."""
        return self.held_in(raw_handle, 0, len(raw_handle), not_found)

    def held_in(self, data: bytes, begin: int, stop: int, not_found: str = NOT_HELD) -> Job | None:
        """`held` for the handle data[begin:stop]."""
        worker = self.worker
        if worker is None:
            self.error("JOB_NOT_FOUND", not_found)
            return None
        # A handle the engine numbered is found by its number, and then by the job's id,
        # whose hash the id keeps: decoding the handle made a string to hash every time.
        number = self.server.handle_number(data, begin, stop)
        if number:
            job = self.engine.jobs.numbered(number)
            if job is not None and worker.jobs.get(job.id) is job:
                return job
        # A client chose the id, or this worker holds no such job.
        job = worker.jobs.get(_decode(data[begin:stop]))
        if job is None:
            self.error("JOB_NOT_FOUND", not_found)
        return job

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
            )
        except QueueFull as exc:
            self.error("QUEUE_ERROR", str(exc))
            return
        self._job_created(job, created, background)

    def submit_plain(
        self,
        raw_function: bytes,
        raw_unique: bytes,
        payload: bytes,
        priority: int,
        background: bool,
        now: float,
    ) -> None:
        """`submit` without options (the hot path); the caller checked the unique id's size."""
        try:
            job, created = self.engine.enqueue(
                self.server.name(raw_function),
                payload,
                priority,
                background,
                None if background else self,
                _decode(raw_unique) if len(raw_unique) else None,
                now,
            )
        except QueueFull as exc:
            self.error("QUEUE_ERROR", str(exc))
            return
        self._job_created(job, created, background)

    def _job_created(self, job: Job, created: bool, background: bool) -> None:
        """Answer a submit: a foreground client now waits on the job; a background job's
        JOB_CREATED waits for the store (see `_release`)."""
        reply = self.server.created_reply(job)
        if not background:
            self.waiting[job] = None
        elif self.durable:
            if created:
                self.created_acks.append(reply)
            else:
                self.joined_acks.append(reply)
            self.durable_replies += 1
        self.send(reply)

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
        known, running, numerator, denominator = _status_fields(job)
        self.send(encode(_STATUS_RES, args[0], known, running, numerator, denominator))

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
            encode(
                _STATUS_RES_UNIQUE,
                args[0],
                known,
                running,
                numerator,
                denominator,
                clients.encode(),
            )
        )

    def option(self, args: tuple[bytes, ...]) -> None:
        if args[0] == b"exceptions":
            self.exceptions = True
            self.send(encode(_OPTION_RES, args[0]))
        elif args[0] == b"grab-waits":
            self.grab_waits = True
            self.send(encode(_OPTION_RES, args[0]))
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
        raw_timeout = args[1]
        if not raw_timeout.isdigit():
            self.error("INVALID_ARGUMENT", "Timeout must be a decimal number of milliseconds")
            return
        timeout_ms = int(raw_timeout)
        self.engine.add_ability(
            self.session(), self.server.name(args[0]), timeout_ms / 1000 if timeout_ms else None
        )

    def cant_do(self, args: tuple[bytes, ...]) -> None:
        if self.worker is not None:
            self.engine.remove_ability(self.worker, self.server.name(args[0]))
            if not self.worker.abilities:
                self._release_held_grabs()

    def reset_abilities(self, args: tuple[bytes, ...]) -> None:
        if self.worker is not None:
            self.engine.reset_abilities(self.worker)
            self._release_held_grabs()

    def pre_sleep(self, args: tuple[bytes, ...]) -> None:
        if self.engine.sleep(self.session()):
            self.send_now(NOOP)

    def grab(self, args: tuple[bytes, ...], kind: int) -> None:
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

    def _assign(self, job: Job, kind: int) -> None:
        if job.max_attempts is not None and self.durable and job.background:
            # A retry limit must count the attempts a crash cut short: the job goes out
            # once its attempt is on disk. Without a limit the count is only informative,
            # and the assignment does not wait for the commit that records it.
            self.durable_replies += 1
        handle = job.id.encode()
        function = self.server.raw_name(job.function)
        if kind == _GRAB_JOB:
            payload = job.payload
            size = len(handle) + len(function) + len(payload) + 2
            self.send(header(_JOB_ASSIGN, size) + handle + _NUL + function + _NUL + payload)
            return
        unique = _encode(job.unique or "")
        if kind == _GRAB_JOB_ALL and job.reducer is not None:
            self.send(
                encode(_JOB_ASSIGN_ALL, handle, function, unique, _encode(job.reducer), job.payload)
            )
        else:
            self.send(encode(_JOB_ASSIGN_UNIQ, handle, function, unique, job.payload))

    def work_status(self, args: tuple[bytes, ...]) -> None:
        job = self.held(args[0])
        if job is None:
            return
        if not (args[1].isdigit() and args[2].isdigit()):
            # gearmand forwards junk and reports 0/0; tell the worker instead.
            self.error("INVALID_ARGUMENT", "WORK_STATUS needs decimal numerator and denominator")
            return
        self.engine.progress(job, int(args[1]), int(args[2]))

    def work_output(self, args: tuple[bytes, ...], kind: Output) -> None:
        job = self.held(args[0], NOT_ON_SERVER)
        if job is not None:
            self.engine.output(job, kind, args[1])

    def work_complete(self, args: tuple[bytes, ...]) -> None:
        job = self.held(args[0])
        if job is not None:
            self.engine.complete(job, args[1])

    def work_fail(self, args: tuple[bytes, ...]) -> None:
        job = self.held(args[0])
        if job is not None:
            self.engine.fail(job, "WORK_FAIL")  # no detail: clients get WORK_FAIL

    def work_exception(self, args: tuple[bytes, ...]) -> None:
        job = self.held(args[0], EXCEPTION_NOT_FOUND)
        if job is not None:
            self.engine.fail(job, args[1], detail=args[1])

    # ------------------------------------------------------------ admin text protocol

    def admin(self, command: AdminCommand) -> None:
        self.send(admin_reply(self.server, command))


def _status_fields(job: Job | None) -> tuple[bytes, bytes, bytes, bytes]:
    if job is None or job.state.terminal:
        return b"0", b"0", b"0", b"0"
    running = b"1" if job.state is _ACTIVE else b"0"
    done, total = job.progress or (0, 0)
    return b"1", running, b"%d" % done, b"%d" % total


def _band_counts(fn: Any) -> tuple[int, int, int]:
    high = normal = low = 0
    for lane in fn.lanes.values():
        h, n, lo = lane.count_by_level()
        high, normal, low = high + h, normal + n, low + lo
    return high, normal, low


def admin_reply(server: GearmanServer, command: AdminCommand) -> bytes:
    """The whole reply to one admin line (sent in one write)."""
    engine = server.engine
    args = command.args
    name = command.name
    if name == "status":
        return admin.status(
            (fn.name, fn.total, fn.running, len(fn.workers)) for fn in engine.functions.values()
        )
    if name == "prioritystatus":
        return admin.priority_status(
            (fn.name, *_band_counts(fn), len(fn.workers)) for fn in engine.functions.values()
        )
    if name == "workers":
        return admin.workers(
            (conn.fd, conn.peer_ip, conn.client_id, conn.worker.abilities if conn.worker else ())
            for conn in server.connections.values()
        )
    if name == "show" and len(args) > 1:
        what = " ".join(arg.lower() for arg in args[1:])
        if what == "jobs":
            # PERSISTED is 1 for background jobs, as gearmand shows even without a queue store.
            return admin.show_jobs(
                (
                    job.id,
                    max(job.attempts - (job.state is _ACTIVE), 0),
                    0,
                    int(job.background),
                )
                for job in engine.jobs.values()
                if not job.state.terminal
            )
        if what == "unique jobs":
            return admin.show_unique_jobs(
                job.unique or "" for job in engine.jobs.values() if not job.state.terminal
            )
        return admin.UNKNOWN_SHOW
    if name == "cancel" and len(args) >= 3 and args[1].lower() == "job":
        job = engine.jobs.get(args[2])
        if job is None or job.state.terminal:
            return admin.UNKNOWN_JOB
        engine.cancel(job)
        return admin.OK
    if name in ("create", "drop") and len(args) == 2 and args[1].lower() == "function":
        return admin.incomplete(args[0])  # gearmand echoes the word as typed
    if name == "create" and len(args) >= 3 and args[1].lower() == "function":
        engine.function(args[2])
        return admin.OK
    if name == "drop" and len(args) >= 3 and args[1].lower() == "function":
        try:
            engine.drop_function(args[2])
        except KeyError:
            return admin.DROP_UNKNOWN
        except IllegalTransition:
            return admin.DROP_BUSY
        return admin.OK
    if name == "maxqueue":
        return _maxqueue(engine, args)
    if name == "getpid":
        return admin.ok_value(str(os.getpid()))
    if name == "verbose":
        return admin.ok_value(server.options.verbose)
    if name == "version":
        return admin.ok_value(__version__)
    return admin.unknown_command(args[0] if args else "")


def _maxqueue(engine: Engine, args: list[str]) -> bytes:
    if len(args) < 2:
        return admin.incomplete("maxqueue")
    values: list[int] = []
    for raw in args[2:5]:
        try:
            values.append(int(raw))
        except ValueError:
            values.append(0)
    if not values:
        high = normal = low = 0
    elif len(values) < 3:
        high = normal = low = values[0]
    else:
        high, normal, low = values
    engine.set_max_queue(args[1], high, normal, low)
    return admin.OK_MAXQUEUE


def _set_keepalive(sock: socket.socket, options: GearmanOptions) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, options.keepalive_idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, options.keepalive_interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, options.keepalive_count)


def _submitter(priority: int, background: bool) -> Handler:
    return partial(GearmanConnection.submit, priority=priority, background=background)


def _reducer(background: bool) -> Handler:
    # libgearman's layout: FUNCTION, UNIQUE, REDUCER, AGGREGATOR (always empty), DATA.
    return lambda conn, args: conn.submit(args, PRIORITY_NORMAL, background, reducer=args[2])


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
    T.ECHO_REQ: lambda conn, args: conn.send(encode(_ECHO_RES, args[0])),
    T.OPTION_REQ: GearmanConnection.option,
    T.SET_CLIENT_ID: GearmanConnection.set_client_id,
    T.CAN_DO: GearmanConnection.can_do,
    T.CAN_DO_TIMEOUT: GearmanConnection.can_do_timeout,
    T.CANT_DO: GearmanConnection.cant_do,
    T.RESET_ABILITIES: GearmanConnection.reset_abilities,
    T.PRE_SLEEP: GearmanConnection.pre_sleep,
    T.GRAB_JOB: partial(GearmanConnection.grab, kind=_GRAB_JOB),
    T.GRAB_JOB_UNIQ: partial(GearmanConnection.grab, kind=_GRAB_JOB_UNIQ),
    T.GRAB_JOB_ALL: partial(GearmanConnection.grab, kind=_GRAB_JOB_ALL),
    T.WORK_STATUS: GearmanConnection.work_status,
    T.WORK_DATA: partial(GearmanConnection.work_output, kind=Output.DATA),
    T.WORK_WARNING: partial(GearmanConnection.work_output, kind=Output.WARNING),
    T.WORK_COMPLETE: GearmanConnection.work_complete,
    T.WORK_FAIL: GearmanConnection.work_fail,
    T.WORK_EXCEPTION: GearmanConnection.work_exception,
}
