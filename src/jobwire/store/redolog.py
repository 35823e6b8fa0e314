"""The redo log: what makes a batch of job changes durable before SQLite has it.

Acknowledging a job needs only the batch's changes on disk, not a database update: the
store appends each batch as one frame to a log file and fsyncs it (on a thread of its own,
merging the frames that queued up meanwhile into one write and one fsync), and writes
SQLite later, in large checkpoints that leave the log behind. A job created and finished
between two checkpoints never reaches SQLite at all.

Files: `<db>-redo-<generation>`, one per generation. The store starts a new generation
when it checkpoints; a checkpoint records in SQLite the last generation it covers, and the
files up to it are deleted. On open, the frames of later generations are read back.

A frame is `length (u32) | crc32 (u32) | body`. The valid prefix of a file is every frame
up to the first one that is short or fails its checksum: only a crash during a write leaves
such a tail, and no frame of it was acknowledged (a frame counts once its fsync returned).
After a failed write the file is cut back to its last good frame before the next write, so
a later frame never follows garbage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

log = logging.getLogger("jobwire.store")

_HEADER = struct.Struct("<II")
# What the writer thread is asked to do: (kind, batch number or generation, frame bytes).
_WRITE, _ROTATE, _STOP = 0, 1, 2

#: `on_written(number, error)`: batches up to `number` are durable (error None) or failed.
Written = Callable[[int, "str | None"], None]


def frame(body: bytes) -> bytes:
    return _HEADER.pack(len(body), zlib.crc32(body)) + body


def read_frames(path: Path) -> Iterator[bytes]:
    """The bodies of the valid prefix of a log file."""
    with path.open("rb") as file:
        data = file.read()
    offset, end = 0, len(data)
    while offset + _HEADER.size <= end:
        length, crc = _HEADER.unpack_from(data, offset)
        start = offset + _HEADER.size
        body = data[start : start + length]
        if len(body) < length or zlib.crc32(body) != crc:
            break
        yield body
        offset = start + length
    if offset < end:
        log.warning("%s: %d bytes after the last whole frame ignored", path, end - offset)


class RedoLog:
    """The log files of one database, and the thread that appends to them.

    `append` and `rotate` are called on the event loop thread, in order; the thread writes
    the frames in that order and reports each write back through `on_written` on the loop.
    """

    def __init__(self, database: Path, *, sync: bool = True, merge: bool = True) -> None:
        self.directory = database.parent
        self.prefix = f"{database.name}-redo-"
        self.sync = sync  # fsync each write (fsync policy `off`: written, not synced)
        self.merge = merge  # one write for every frame queued meanwhile (policy `always`: no)
        self._queue: queue.SimpleQueue[tuple[int, int, bytes]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_written: Written | None = None
        # Owned by the writer thread once started:
        self._generation = 0
        self._fd: int | None = None
        self._size = 0  # bytes of whole, written frames in the current file
        self._cut = False  # a failed write may have left bytes past `_size`

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
        """Start the writer thread; frames go to `generation` until the next `rotate`."""
        self._loop = asyncio.get_running_loop()
        self._on_written = on_written
        self._generation = generation
        self._thread = threading.Thread(target=self._write_loop, name="jobwire-redo", daemon=True)
        self._thread.start()

    def append(self, number: int, body: bytes) -> None:
        """Queue batch `number`'s frame; `on_written` will report it."""
        self._queue.put((_WRITE, number, frame(body)))

    def rotate(self, generation: int) -> None:
        """Frames appended from now on go to a new file."""
        self._queue.put((_ROTATE, generation, b""))

    def stop(self) -> None:
        """Write what is queued, then end the thread (its last reports may never run)."""
        if self._thread is not None:
            self._queue.put((_STOP, 0, b""))
            self._thread.join()
            self._thread = None
        self._close_file()

    # ------------------------------------------------------------------ writer thread

    def _write_loop(self) -> None:
        held: tuple[int, int, bytes] | None = None
        while True:
            kind, value, data = held or self._queue.get()
            held = None
            if kind == _STOP:
                return
            if kind == _ROTATE:
                self._close_file()
                self._generation = value
                continue
            number, chunks = value, [data]
            while self.merge:
                try:
                    held = self._queue.get_nowait()
                except queue.Empty:
                    break
                if held[0] != _WRITE:
                    break  # a rotation or the stop: after this write
                number = held[1]
                chunks.append(held[2])
                held = None
            error = self._write(b"".join(chunks))
            loop, report = self._loop, self._on_written
            assert loop is not None and report is not None
            with contextlib.suppress(RuntimeError):  # a closed loop has nobody waiting
                loop.call_soon_threadsafe(report, number, error)

    def _write(self, data: bytes) -> str | None:
        """Append `data` to the current file and make it durable; the error, or None."""
        try:
            fd = self._fd
            if fd is None:
                fd = self._open()
            if self._cut:
                os.ftruncate(fd, self._size)
                self._cut = False
            self._cut = True  # until the write below is known to be whole
            written = os.pwrite(fd, data, self._size)
            if written != len(data):
                raise OSError(f"short write ({written} of {len(data)} bytes)")
            if self.sync:
                os.fdatasync(fd)
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"
        self._cut = False
        self._size += len(data)
        return None

    def _open(self) -> int:
        path = self.path(self._generation)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._fd, self._size, self._cut = fd, 0, False
        if self.sync:  # the new file's name must survive a crash with its frames
            directory = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        return fd

    def _close_file(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
