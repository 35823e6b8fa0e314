"""The redo log: what makes a batch of job changes durable before SQLite has it.

Acknowledging a job needs only the batch's changes on disk, not a database update: the
store appends each batch as one frame to a log file, on the event loop thread (a write to
the page cache), and a syncer process (`jobwire.store.syncproc`) fdatasyncs the file. One
sync is outstanding at a time; the frames written while it runs are covered by the next
one, so under load one fdatasync carries many loop turns. While the syncer works, the log
tells it the newest batch written through a shared number, so it goes from one sync to the
next without waiting to be asked, and the loop, busy with a client's read, takes the
syncer's answers from shared memory before their message arrives (`poll`; see
`jobwire.store.syncproc`). SQLite is written later,
in large checkpoints that leave the log behind. A job created and finished between two
checkpoints never reaches SQLite at all.

Files: `<db>-redo-<generation>`, one per generation. The store starts a new generation
when it checkpoints; a checkpoint records in SQLite the last generation it covers, and the
files up to it are deleted. On open, the frames of later generations are read back.

Zero-filled files: an fdatasync after an append must also commit the file's new size
through the file system's journal; one after overwriting blocks that are already written
needs no metadata at all. On this project's test machine that took a sync under load from
130-145 us to 21-27 us (p50). So, when syncing, a thread zero-fills a spare file
(`<db>.redo-spare`, `preallocate` bytes, fsynced) ahead of need, and the next generation
starts as that file, renamed; the store starts one early when the current file has run out
of zeros (`wants_new_file`). Without a spare ready, a new file is simply appended to.

A frame is `length (u32) | crc32 (u32) | body`. The valid prefix of a file is every frame
up to the first one that is short, fails its checksum or has length 0 (the zeros past the
last frame): only a crash during a write leaves any other tail, and no frame of it was
acknowledged (a frame counts once its sync returned). After a failed write or sync the file
is cut back to its last good frame, so a frame that was reported as failed never comes back
at the next start, and a later frame never follows garbage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import os
import socket
import struct
import subprocess
import sys
import threading
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple, Protocol

from jobwire.store import syncproc

log = logging.getLogger("jobwire.store")

_HEADER = struct.Struct("<II")
_REQUEST, _ANSWER = syncproc.REQUEST, syncproc.ANSWER

#: `on_written(number, error)`: batches up to `number` are durable (error None) or failed.
Written = Callable[[int, "str | None"], None]


class SyncerLink(Protocol):
    """The log's end of a syncer: `_Syncer`, or a test's stand-in."""

    def ask(self, number: int, generation: int) -> None:
        """Sync the file of `generation` up to batch `number`; an answer follows."""

    def publish(self, number: int) -> None:
        """Batch `number` is written to the file being synced."""

    def poll(self) -> None:
        """Report the latest successful answer now if its message is not yet read."""

    def stop(self) -> None: ...


#: Starts a syncer for a log on its loop; OSError if it cannot.
StartSyncer = Callable[["RedoLog", asyncio.AbstractEventLoop], SyncerLink]


def frame(body: bytes) -> bytes:
    return _HEADER.pack(len(body), zlib.crc32(body)) + body


def read_frames(path: Path) -> Iterator[bytes]:
    """The bodies of the valid prefix of a log file."""
    with path.open("rb") as file:
        data = file.read()
    offset, end = 0, len(data)
    while offset + _HEADER.size <= end:
        length, crc = _HEADER.unpack_from(data, offset)
        if length == 0:  # the zeros of a zero-filled file
            break
        start = offset + _HEADER.size
        body = data[start : start + length]
        if len(body) < length or zlib.crc32(body) != crc:
            break
        yield body
        offset = start + length
    if data.count(0, offset) < end - offset:
        log.warning("%s: %d bytes after the last whole frame ignored", path, end - offset)


class _Batch(NamedTuple):
    """A frame written to the log and not yet reported."""

    number: int
    generation: int
    start: int  # where its frame begins in the generation's file
    error: str | None  # why writing it failed; None: written, durable once synced


class RedoLog:
    """The log files of one database: written on the loop thread, synced by the syncer.

    `append` and `rotate` are called on the event loop thread, in order; `on_written`
    reports every batch, in order, on the loop, never from inside `append`.
    """

    def __init__(
        self,
        database: Path,
        *,
        sync: bool = True,
        merge: bool = True,
        preallocate: int = 0,
        busy_poll: float = 0.0,
        start_syncer: StartSyncer | None = None,
    ) -> None:
        """`start_syncer`: how a syncer is started (default: a `_Syncer` process)."""
        self.directory = database.parent
        self.prefix = f"{database.name}-redo-"
        self.sync = sync  # fsync the log (fsync policy `off`: written, not synced)
        self.merge = merge  # one sync for every batch written meanwhile (`always`: no)
        # Bytes of zeros each spare file gets; 0: no spares (not worth it without syncs).
        self.preallocate = preallocate if sync else 0
        self.busy_poll = busy_poll  # seconds the syncer polls for a request after an answer
        self._spare_path = database.parent / f"{database.name}.redo-spare"
        self._spare: threading.Thread | None = None  # zero-filling the spare
        self._spare_ready = False  # set by that thread when it is done
        self._prepared = 0  # zero-filled bytes of the current file (0: appended to)
        self._last_frame = 0  # bytes of the latest frame written
        self.syncs = 0  # syncs that succeeded, for tests and benchmarks
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_written: Written | None = None
        self._generation = 0
        self._fd: int | None = None
        self._size = 0  # bytes of whole, written frames in the current file
        self._cut = False  # a failed write may have left bytes past `_size`
        self._unreported: deque[_Batch] = deque()
        self._asked = 0  # the batch number whose sync is outstanding; 0: none
        # The generation whose batches the syncer is told of as they are written, while
        # it works on a sync of that file that covers every batch before them; -1: none.
        self._following = -1
        self._delivery_due = False
        self._syncer: SyncerLink | None = None
        # Compiled, the log's methods cannot be replaced on an instance: tests stand in
        # for the syncer here instead.
        self.start_syncer: StartSyncer = start_syncer or _Syncer

    # ------------------------------------------------------------------ files

    def path(self, generation: int) -> Path:
        return self.directory / f"{self.prefix}{generation}"

    def generations(self) -> list[int]:
        """The generations that have a file, oldest first."""
        found = []
        for entry in self.directory.iterdir():
            name = entry.name
            if name.startswith(self.prefix) and name[len(self.prefix) :].isdigit():
                found.append(int(name[len(self.prefix) :]))
        return sorted(found)

    def remove_through(self, generation: int) -> None:
        """Delete the files of `generation` and older (their changes are in SQLite)."""
        for old in self.generations():
            if old <= generation:
                with contextlib.suppress(FileNotFoundError):
                    self.path(old).unlink()

    # ------------------------------------------------------------------ loop side

    def start(self, generation: int, on_written: Written) -> None:
        """Frames go to `generation` until the next `rotate`; call on the loop."""
        self._loop = asyncio.get_running_loop()
        self._on_written = on_written
        self._generation = generation

    def get_ready(self) -> None:
        """Before the first batch, on the loop after `start`: open the current file and
        have the syncer process, started now, make its name durable.

        Done at the first batch instead, the first acknowledgement waited for a Python
        process to start, and for a directory sync queued behind the next spare's zero-fill,
        which opening the file starts (20-30 ms on the project's test VM). Waits for the
        first spare's zero-fill if it is still running: a zero-filled file from the start.
        """
        if self._spare is not None and not self._spare_ready:
            self._spare.join()
        try:
            if self._fd is None:
                self._open()
        except OSError as exc:  # the first write tries again, and fails its batch if it must
            log.error("%s: cannot open the redo log: %s", self.path(self._generation), exc)
            return
        if not self.sync or self._syncer is not None:
            return
        syncer = self._start_syncer()  # if it cannot start, the first sync tries again
        if not isinstance(syncer, str):
            # Batch 0 is none: the answer is ignored (`synced`), the directory sync is done.
            syncer.ask(0, self._generation)

    def append(self, number: int, body: bytes) -> None:
        """Write batch `number`'s frame; `on_written` will report it."""
        start = self._size
        data = frame(body)
        self._last_frame = len(data)
        self._record_batch(number, start, self._write(data))

    def fail(self, number: int, error: str) -> None:
        """Batch `number` has no frame (it could not be encoded): report it failed, in
        order with the others."""
        self._record_batch(number, self._size, error)

    def _record_batch(self, number: int, start: int, error: str | None) -> None:
        """Batch `number` awaits its report: a sync if written, the next delivery if not."""
        self._unreported.append(_Batch(number, self._generation, start, error))
        if error is None and self.sync:
            if not self._asked:
                self._ask()
            elif self._following == self._generation and self._syncer is not None:
                self._syncer.publish(number)
        elif not self._delivery_due:
            self._following = -1  # a later sync must not cover this failed batch
            self._delivery_due = True
            assert self._loop is not None
            self._loop.call_soon(self._deliver)

    def rotate(self, generation: int) -> None:
        """Frames appended from now on go to a new file."""
        self._close_file()
        self._generation = generation
        self._following = -1

    def stop(self) -> None:
        """Stop the syncer and close the file; batches not yet reported never will be."""
        if self._syncer is not None:
            self._syncer.stop()
            self._syncer = None
        self._close_file()
        if self._spare is not None:
            self._spare.join()
            self._spare = None
        self._spare_ready = False
        with contextlib.suppress(OSError):
            self._spare_path.unlink()

    # ------------------------------------------------------------------ zero-filled files

    def prepare(self) -> None:
        """Start zero-filling a spare file, unless one is ready or on its way."""
        if not self.preallocate or self._spare is not None:
            return
        self._spare_ready = False
        self._spare = threading.Thread(
            target=self._fill_spare, name="jobwire-redo-spare", daemon=True
        )
        self._spare.start()

    def _fill_spare(self) -> None:
        """On a thread of its own, which holds the GIL only between its system calls."""
        try:
            fd = os.open(self._spare_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                # In 64 KiB writes: the page cache keeps a file in folios as large as the
                # writes that filled it, and every later write into a folio walks all its
                # blocks: frames written over 1 MiB folios took up to twice as long.
                zeros = bytes(min(self.preallocate, 1 << 16))
                left = self.preallocate
                while left > 0:
                    left -= os.write(fd, zeros if left >= len(zeros) else zeros[:left])
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:  # the log appends to plain files meanwhile
            log.warning("%s: cannot zero-fill a redo log file: %s", self._spare_path, exc)
            return
        self._spare_ready = True

    @property
    def wants_new_file(self) -> bool:
        """A spare is ready, and the current file has no zeros left for another frame."""
        return self._spare_ready and self._size + self._last_frame > self._prepared

    def _deliver(self) -> None:
        """Report, from the oldest, the batches that need no sync (failed, or policy off)."""
        self._delivery_due = False
        unreported = self._unreported
        while unreported and (unreported[0].error is not None or not self.sync):
            batch = unreported.popleft()
            self._report(batch.number, batch.error)
        if unreported and not self._asked:
            self._ask()

    def _report(self, number: int, error: str | None) -> None:
        assert self._on_written is not None
        self._on_written(number, error)

    def _ask(self) -> None:
        """Ask for the sync of the oldest written batches of one file."""
        first = self._unreported[0]
        number = first.number
        self._following = -1
        if self.merge:
            for batch in self._unreported:
                if batch.error is not None or batch.generation != first.generation:
                    break
                number = batch.number
            else:  # every written batch is covered: the syncer may follow the next ones
                if first.generation == self._generation:
                    self._following = first.generation
        self._asked = number
        self._send(number, first.generation)

    def _send(self, number: int, generation: int) -> None:
        syncer = self._syncer or self._start_syncer()
        if isinstance(syncer, str):  # why it could not be started
            assert self._loop is not None
            self._loop.call_soon(self.synced, number, syncer)
        else:
            syncer.ask(number, generation)

    def _start_syncer(self) -> SyncerLink | str:
        """A new syncer process, or why it could not be started (logged)."""
        assert self._loop is not None
        try:
            self._syncer = self.start_syncer(self, self._loop)
        except OSError as exc:
            log.error("cannot start the redo log syncer: %s", exc)
            return f"redo log syncer: {exc}"
        return self._syncer

    @property
    def idle(self) -> bool:
        """Syncing, and no sync is outstanding: a batch written now is synced at once."""
        return self.sync and not self._asked

    def poll(self) -> None:
        """Report the batches the syncer has made durable, without waiting for the loop to
        read its answer: cheap (no system call), for the loop to call while it works
        through a long read."""
        if self._asked and self._syncer is not None:
            self._syncer.poll()

    def synced(self, number: int, error: str | None, more: bool = False) -> None:
        """The syncer's answer: the batches up to `number` are durable, or not; `more`:
        it is syncing newer ones already, and will answer again."""
        if not self._asked or number < self._asked:
            return  # asked of a syncer that has died since; asked again
        unreported = self._unreported
        if error is None:
            self.syncs += 1
            last = None
            while unreported and unreported[0].number <= number:
                last = unreported.popleft()
            if not more:
                self._asked = 0
                if unreported and unreported[0].error is None:
                    # The next sync first: reporting sends the acknowledgements, which
                    # takes tens of microseconds under load; the syncer would idle.
                    self._ask()
            if last is not None:
                self._report(last.number, last.error)
        else:
            self._asked, self._following = 0, -1
            self._sync_failed(error)
        self._deliver()

    def _sync_failed(self, error: str) -> None:
        """The file's unsynced frames may be lost: fail them and cut them off the file."""
        unreported = self._unreported
        generation = unreported[0].generation
        start = unreported[0].start
        failed = None
        while unreported and unreported[0].generation == generation:
            failed = unreported.popleft()
        assert failed is not None
        try:
            if generation == self._generation:
                if self._fd is not None:
                    self._truncate(self._fd, start)
                self._size, self._cut = start, False
            else:
                os.truncate(self.path(generation), start)
        except OSError as exc:
            log.error("%s: failed frames not cut off: %s", self.path(generation), exc)
            if generation == self._generation:
                self._size, self._cut = start, True  # cut before the next write
        self._report(failed.number, error)

    def lost_syncer(self, answered: bool) -> None:
        """The syncer died. One that had been working is replaced and asked again; one
        that died before its first answer would likely die again: its batch fails."""
        self._syncer = None
        self._following = -1
        number = self._asked
        if not number:
            return
        log.warning("redo log syncer of %s exited; starting another", self.directory)
        if answered:
            self._asked = 0
            self._ask()
        else:
            self.synced(number, "redo log syncer exited before it synced anything")

    def _write(self, data: bytes) -> str | None:
        """Append `data` to the current file; the error, or None."""
        try:
            fd = self._fd
            if fd is None:
                fd = self._open()
            if self._cut:
                self._truncate(fd, self._size)
                self._cut = False
            self._cut = True  # until the write below is known to be whole
            written = os.pwrite(fd, data, self._size)
            while written < len(data):  # the rest again: it fails with the reason, if any
                more = os.pwrite(fd, data[written:], self._size + written)
                if not more:
                    raise OSError(f"short write ({written} of {len(data)} bytes)")
                written += more
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"
        self._cut = False
        self._size += len(data)
        return None

    def _truncate(self, fd: int, size: int) -> None:
        """Cut the current file at `size`; the zeros past it go too."""
        os.ftruncate(fd, size)
        self._prepared = min(self._prepared, size)

    def _open(self) -> int:
        # The syncer syncs the directory too before the file's first frame counts, and with
        # it the spare's new name.
        path = self.path(self._generation)
        if self._spare_ready:
            try:
                os.replace(self._spare_path, path)
                fd = os.open(path, os.O_WRONLY)
            except OSError as exc:
                log.warning("%s: cannot use the zero-filled redo log file: %s", path, exc)
            else:
                self._fd, self._size, self._cut = fd, 0, False
                self._prepared = self.preallocate
                self._spare, self._spare_ready = None, False
                self.prepare()  # for the next generation
                return fd
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._fd, self._size, self._cut, self._prepared = fd, 0, False, 0
        return fd

    def _close_file(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


class _Syncer:
    """The loop's end of one syncer process (see `jobwire.store.syncproc`)."""

    def __init__(self, owner: RedoLog, loop: asyncio.AbstractEventLoop) -> None:
        """Start the process; OSError if it cannot be started."""
        self.owner = owner
        self.loop = loop
        self.answered = False
        self._shared: memoryview | None = None  # the numbers shared with the process
        # The batch number of the latest successful answer reported, from its message or
        # from the shared numbers, whichever came first: the other is then ignored.
        self._answered = 0
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        shared = _shared_numbers()
        command = [sys.executable, "-I", "-S", syncproc.__file__, str(child.fileno())]
        command += [str(owner.directory), owner.prefix, repr(owner.busy_poll)]
        passed = [child.fileno()]
        if shared is not None:
            command.append(str(shared))
            passed.append(shared)
        try:
            if shared is not None:
                self._shared = syncproc.map_shared(shared)
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, pass_fds=passed)
        except BaseException:
            self.sock.close()
            raise
        finally:
            child.close()
            if shared is not None:
                os.close(shared)
        self.sock.setblocking(False)
        loop.add_reader(self.sock.fileno(), self._readable)

    def ask(self, number: int, generation: int) -> None:
        # If it is gone, `_readable` sees that and tells the owner.
        try:
            self.sock.send(_REQUEST.pack(number, generation))
        except OSError:  # not contextlib.suppress: this runs for every sync
            return

    def publish(self, number: int) -> None:
        """Batch `number` is written to the file being synced (see `RedoLog._following`)."""
        if self._shared is not None:
            self._shared[syncproc.WRITTEN] = number  # aligned 8 bytes: never half-written

    def poll(self) -> None:
        shared = self._shared
        if shared is not None:
            answer = shared[syncproc.ANSWERED]
            self._succeeded(answer >> 1, bool(answer & 1))

    def _succeeded(self, number: int, more: bool) -> None:
        """A successful answer, from the shared numbers or from its message: reported by
        whichever comes first (each answer's number is above the one before)."""
        if number > self._answered:
            self._answered = number
            self.owner.synced(number, None, more)

    def _readable(self) -> None:
        # An answer with `more` unset is the last until the next request, so reading
        # stops there without a recv that fails with EAGAIN. Answers with `more` set can
        # queue up while the loop is busy: read on, so the newest is reported now.
        while self.sock.fileno() >= 0:
            try:
                message = self.sock.recv(_ANSWER.size)
            except BlockingIOError:
                return
            except OSError:
                message = b""
            if len(message) != _ANSWER.size:  # the syncer is gone
                self.stop()
                self.owner.lost_syncer(self.answered)
                return
            self.answered = True
            number, code, more = _ANSWER.unpack(message)
            if code:
                self.owner.synced(number, f"OSError: [Errno {code}] {os.strerror(code)}")
            else:
                self._succeeded(number, bool(more))
            if not more:
                return

    def stop(self) -> None:
        """Close the socket and wait for the process, which exits when it sees that."""
        if self.sock.fileno() >= 0:
            with contextlib.suppress(ValueError, OSError, RuntimeError):
                self.loop.remove_reader(self.sock.fileno())
            self.sock.close()
        if self._shared is not None:
            mapped = self._shared.obj
            self._shared.release()
            self._shared = None
            assert isinstance(mapped, mmap.mmap)
            mapped.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _shared_numbers() -> int | None:
    """A memory file of zeros for the numbers shared with a syncer; None where the system
    has none (the syncer then syncs as far as asked, and answers by message only)."""
    if not hasattr(os, "memfd_create"):
        return None
    fd = -1
    try:
        fd = os.memfd_create("jobwire-redo-shared")
        os.ftruncate(fd, syncproc.SHARED_SIZE)
    except OSError as exc:
        if fd >= 0:
            os.close(fd)
        log.warning("no shared memory for the redo log syncer: %s", exc)
        return None
    return fd
