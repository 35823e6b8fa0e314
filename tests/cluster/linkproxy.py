"""A TCP proxy a test puts between two nodes' peer link: it forwards both ways and can hold
back what the listening node sends from a frame on, then cut the link at a moment the test
chooses: as a network that stalls, then breaks.

The listening node's bytes are its greeting, then frames (`jobwire.store.peerlink.encode`);
the dialer's are all frames. The first frame `drop` says yes to, and every frame after it
on that connection, is held back; `drop_sent` does the same for what the dialer sends (by
default its bytes are copied as they come). Threads over blocking sockets: the tests that
use it are synchronous.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

import orjson

from jobwire.store.peerlink import CHALLENGE_BYTES, GREETING

_FRAME = struct.Struct(">II")


class LinkProxy:
    def __init__(
        self,
        target: tuple[str, int],
        drop: Callable[[dict[str, Any]], bool],
        drop_sent: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        self.target = target
        self.drop = drop
        self.drop_sent = drop_sent
        self.dropped: list[dict[str, Any]] = []
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self._server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                dialer, _ = self._server.accept()
            except OSError:
                return
            if self._closed:  # accepted as it closed: refused all the same
                dialer.close()
                return
            listener = socket.create_connection(self.target)
            with self._lock:
                self._sockets += [dialer, listener]
            if self.drop_sent is None:
                copy = threading.Thread(target=self._copy, args=(dialer, listener), daemon=True)
            else:
                sent = (dialer, listener, self.drop_sent, 0)
                copy = threading.Thread(target=self._frames, args=sent, daemon=True)
            copy.start()
            greeting = len(GREETING) + CHALLENGE_BYTES
            received = (listener, dialer, self.drop, greeting)
            threading.Thread(target=self._frames, args=received, daemon=True).start()

    @staticmethod
    def _copy(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass

    def _frames(
        self,
        source: socket.socket,
        sink: socket.socket,
        drop: Callable[[dict[str, Any]], bool],
        greeting: int,
    ) -> None:
        try:
            if greeting:
                sink.sendall(_read(source, greeting))
            stalled = False
            while True:
                prefix = _read(source, _FRAME.size)
                total, head_size = _FRAME.unpack(prefix)
                rest = _read(source, total - 4)
                header = orjson.loads(rest[:head_size])
                stalled = stalled or drop(header)
                if stalled:
                    with self._lock:
                        self.dropped.append(header)
                    continue
                sink.sendall(prefix + rest)
        except (OSError, EOFError):
            pass

    def held_back(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [header for header in self.dropped if header.get("o") == kind]

    def cut(self) -> None:
        """Close every connection through the proxy at once (both nodes see the link end);
        the dialer's next dial goes through again."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        """Cut the link, and refuse every dial from now on."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self._server.close()
        self.cut()


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data
