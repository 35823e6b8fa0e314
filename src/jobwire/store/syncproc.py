"""The syncer: a child process that fdatasyncs the redo log for the server.

    python -I -S syncproc.py SOCKET_FD DIRECTORY PREFIX [BUSY_POLL]

Why a process: a thread of the server would need the GIL after every fdatasync, and the
server's event loop holds it while it is busy, so a thread's syncs would run only when the
loop idles. This process shares nothing with the loop but the file and a socket.

Protocol, over a SOCK_SEQPACKET socket, one message per datagram: the server asks
`(batch number, generation)` (two little-endian int64): make the log file of that generation
durable. The answer is `(batch number, errno)`, 0 when the file is durable. A generation's
file is created by the server; the first request for it also syncs the directory, so the
new name survives a crash. The process exits when the server closes its end (or dies), and
ignores SIGINT and SIGTERM, which a terminal or a service manager may send to the whole
process group: the server decides when it stops.

Busy polling (BUSY_POLL seconds, the server's `--busy-poll`): after each answer the process
polls for the next request without blocking, yielding the CPU (sched_yield) on each pass, for
that long before it sleeps in recv again. Under a steady load of durable writes the next
request comes within microseconds, and on a virtual machine waking a sleeping process takes
tens of them, each time, on top of every fdatasync.

It runs with `-I -S` and imports only the standard library, so it starts in milliseconds.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import struct
import sys
import time

MESSAGE = struct.Struct("<qq")


def serve(sock: socket.socket, directory: str, prefix: str, busy_poll: float = 0.0) -> None:
    generation, fd = -1, -1
    poll_until = 0.0  # the `time.monotonic()` until which to poll for the next request
    while True:
        try:
            message = _next_request(sock, poll_until)
        except OSError:
            return
        if len(message) != MESSAGE.size:  # b"": the server closed its end
            return
        number, wanted = MESSAGE.unpack(message)
        code = 0
        try:
            if wanted != generation:
                if fd >= 0:
                    os.close(fd)
                    fd, generation = -1, -1
                fd = os.open(os.path.join(directory, f"{prefix}{wanted}"), os.O_WRONLY)
                folder = os.open(directory, os.O_RDONLY)
                try:
                    os.fsync(folder)
                finally:
                    os.close(folder)
                generation = wanted
            os.fdatasync(fd)
        except OSError as exc:
            code = exc.errno or errno.EIO
        try:
            sock.send(MESSAGE.pack(number, code))
        except OSError:
            return
        if busy_poll:
            poll_until = time.monotonic() + busy_poll


def _next_request(sock: socket.socket, poll_until: float) -> bytes:
    """The next message (b"" once the server is gone): polled for until `poll_until`,
    then waited for."""
    while time.monotonic() < poll_until:
        try:
            return sock.recv(MESSAGE.size, socket.MSG_DONTWAIT)
        except BlockingIOError:
            os.sched_yield()  # a process woken on this CPU (the server's client) runs now
    return sock.recv(MESSAGE.size)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    fd, directory, prefix = int(argv[1]), argv[2], argv[3]
    busy_poll = float(argv[4]) if len(argv) > 4 else 0.0
    with socket.socket(fileno=fd) as sock:
        serve(sock, directory, prefix, busy_poll)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
