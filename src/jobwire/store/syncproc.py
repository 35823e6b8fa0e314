"""The syncer: a child process that fdatasyncs the redo log for the server.

    python -I -S syncproc.py SOCKET_FD DIRECTORY PREFIX [BUSY_POLL [SHARED_FD]]

Why a process: a thread of the server would need the GIL after every fdatasync, and the
server's event loop holds it while it is busy, so a thread's syncs would run only when the
loop idles. This process shares nothing with the loop but the file, a socket and two numbers.

Protocol, over a SOCK_SEQPACKET socket, one message per datagram: the server asks
`(batch number, generation)` (REQUEST): make the log file of that generation durable up to
that batch. The answer is `(batch number, errno, more)` (ANSWER): errno is 0 when the file is
durable up to that batch, and `more` is 1 when this process has already gone on to sync
newer batches, so the server must not ask: another answer follows. A generation's file is
created by the server; the first request for it also syncs the directory, so the new name
survives a crash. The process exits when the server closes its end (or dies), and ignores
SIGINT and SIGTERM, which a terminal or a service manager may send to the whole process
group: the server decides when it stops.

The shared numbers (SHARED_FD, a memory file of two int64 that both processes map):
- WRITTEN, stored by the server: while this process works for it, the newest batch
  written to the file being synced. Each sync covers the batches up to that number, and
  when a sync ends and the number has grown, the next one starts at once. Asking by
  message costs a round trip through the server's event loop, which is often busy for
  tens of microseconds handling clients, while the batches written meanwhile wait; under
  load one request now starts a chain of back-to-back syncs. A pwrite returns before the
  server stores the number, so a sync begun after reading it covers those frames.
- ANSWERED, stored by this process: its latest successful answer, `number << 1 | more`,
  stored before the answer is sent. The server's loop reads the socket only between
  callbacks, and a callback handling a client's read of many requests runs for tens of
  microseconds; the server looks at this number while it works through such a read
  (`RedoLog.poll`), so the acknowledgements go out, and the next sync is asked for,
  that much sooner. Failures are answered by message only.

Busy polling (BUSY_POLL seconds, the server's `--busy-poll`): after its last answer the
process polls for the next request without blocking, yielding the CPU (sched_yield) on each
pass, for that long before it sleeps in recv again. Under a steady load of durable writes
the next request comes within microseconds, and on a virtual machine waking a sleeping
process takes tens of them, each time, on top of every fdatasync.

It runs with `-I -S` and imports only the standard library, so it starts in milliseconds.
"""

from __future__ import annotations

import errno
import mmap
import os
import signal
import socket
import struct
import sys
import time

REQUEST = struct.Struct("<qq")  # batch number, generation
ANSWER = struct.Struct("<qqq")  # batch number, errno, more (1: another answer follows)
WRITTEN, ANSWERED = 0, 1  # the shared numbers, by index
SHARED_SIZE = 16  # bytes: two int64


def map_shared(fd: int) -> memoryview:
    """The shared numbers in the memory file `fd`, mapped (the map outlives `fd`)."""
    return memoryview(mmap.mmap(fd, SHARED_SIZE)).cast("q")


def serve(
    sock: socket.socket,
    directory: str,
    prefix: str,
    busy_poll: float = 0.0,
    shared: memoryview | None = None,
) -> None:
    """Answer requests until the server closes its end. `shared`: the shared numbers, or
    None to sync only as far as asked and answer by message only."""
    log = _LogFile(directory, prefix)
    poll_until = 0.0  # the `time.monotonic()` until which to poll for the next request
    while True:
        try:
            message = _next_request(sock, poll_until)
        except OSError:
            return
        if len(message) != REQUEST.size:  # b"": the server closed its end
            return
        number, generation = REQUEST.unpack(message)
        more = True
        while more:
            if shared is not None:
                number = max(number, shared[WRITTEN])
            code = log.sync(generation)
            more = code == 0 and shared is not None and shared[WRITTEN] > number
            if code == 0 and shared is not None:
                shared[ANSWERED] = number << 1 | more
            try:
                sock.send(ANSWER.pack(number, code, more))
            except OSError:
                return
        if busy_poll:
            poll_until = time.monotonic() + busy_poll


class _LogFile:
    """The log file of the generation last synced, kept open."""

    def __init__(self, directory: str, prefix: str) -> None:
        self.directory, self.prefix = directory, prefix
        self.generation, self.fd = -1, -1

    def sync(self, generation: int) -> int:
        """fdatasync the file of `generation`: 0, or the errno of the failure."""
        try:
            if generation != self.generation:
                self._open(generation)
            os.fdatasync(self.fd)
        except OSError as exc:
            return exc.errno or errno.EIO
        return 0

    def _open(self, generation: int) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd, self.generation = -1, -1
        self.fd = os.open(os.path.join(self.directory, f"{self.prefix}{generation}"), os.O_WRONLY)
        folder = os.open(self.directory, os.O_RDONLY)  # the file's name must last too
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
        self.generation = generation


def _next_request(sock: socket.socket, poll_until: float) -> bytes:
    """The next message (b"" once the server is gone): polled for until `poll_until`,
    then waited for."""
    while time.monotonic() < poll_until:
        try:
            return sock.recv(REQUEST.size, socket.MSG_DONTWAIT)
        except BlockingIOError:
            os.sched_yield()  # a process woken on this CPU (the server's client) runs now
    return sock.recv(REQUEST.size)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    fd, directory, prefix = int(argv[1]), argv[2], argv[3]
    busy_poll = float(argv[4]) if len(argv) > 4 else 0.0
    shared = None
    if len(argv) > 5:
        shared = map_shared(int(argv[5]))
        os.close(int(argv[5]))
    with socket.socket(fileno=fd) as sock:
        serve(sock, directory, prefix, busy_poll, shared)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
