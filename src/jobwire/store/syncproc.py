"""The syncer: a child process that fdatasyncs the redo log for the server.

    python -I -S syncproc.py SOCKET_FD DIRECTORY PREFIX

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

It runs with `-I -S` and imports only the standard library, so it starts in milliseconds.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import struct
import sys

MESSAGE = struct.Struct("<qq")


def serve(sock: socket.socket, directory: str, prefix: str) -> None:
    generation, fd = -1, -1
    while True:
        try:
            message = sock.recv(MESSAGE.size)
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


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    fd, directory, prefix = int(argv[1]), argv[2], argv[3]
    with socket.socket(fileno=fd) as sock:
        serve(sock, directory, prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
