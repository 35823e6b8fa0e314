"""The Gearman admin text protocol, client side: `status` and `workers` as rows."""

from __future__ import annotations

import contextlib
import socket
import ssl
from dataclasses import dataclass

from jobwire.protocols.gearman.packets import HEADER, HEADER_SIZE, PacketType, encode_request
from jobwire.sdk.connection import parse_address
from jobwire.sdk.errors import AuthenticationFailed, ServerError, ServerUnavailable


@dataclass(frozen=True, slots=True)
class FunctionRow:
    name: str
    total: int  # queued + running
    running: int
    workers: int  # connections that registered the function


@dataclass(frozen=True, slots=True)
class ConnectionRow:
    fd: str
    ip: str
    client_id: str
    functions: tuple[str, ...]


def query(
    server: str,
    command: str,
    timeout: float = 10.0,
    *,
    tls: ssl.SSLContext | None = None,
    token: str | None = None,
) -> list[str]:
    """Send one list command (status, workers, ...) and return its lines without the final
    ".". `tls`: over TLS; `token`: authenticate first (OPTION_REQ auth:TOKEN)."""
    address = parse_address(server)
    try:
        with contextlib.ExitStack() as stack:
            sock = stack.enter_context(socket.create_connection(address, timeout=timeout))
            if tls is not None:
                sock = stack.enter_context(tls.wrap_socket(sock, server_hostname=address[0]))
            if token is not None:
                _authenticate(sock, server, token)
            sock.sendall(command.encode() + b"\n")
            reply = b""
            while not (reply == b".\n" or reply.endswith(b"\n.\n") or _is_error(reply)):
                chunk = sock.recv(65536)
                if not chunk:
                    raise ServerUnavailable(f"{server} closed the connection mid-reply")
                reply += chunk
    except OSError as exc:
        raise ServerUnavailable(f"{server}: {exc}") from exc
    if reply.startswith(b"ERR "):
        code, _, text = reply[4:].decode("utf-8", "replace").strip().partition(" ")
        raise ServerError(code, text)
    return reply.decode("utf-8", "replace").split("\n")[:-2]


def _authenticate(sock: socket.socket, server: str, token: str) -> None:
    sock.sendall(encode_request(PacketType.OPTION_REQ, b"auth:" + token.encode()))
    head = _read_exactly(sock, HEADER_SIZE, server)
    _, ptype, size = HEADER.unpack(head)
    body = _read_exactly(sock, size, server)
    if ptype != PacketType.OPTION_RES:
        detail = body.replace(b"\0", b" ").decode("utf-8", "replace")
        raise AuthenticationFailed(f"{server} refused the token: {detail}")


def _read_exactly(sock: socket.socket, size: int, server: str) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ServerUnavailable(f"{server} closed the connection during authentication")
        data += chunk
    return data


def _is_error(reply: bytes) -> bool:
    return reply.startswith(b"ERR ") and reply.endswith(b"\n")


def status(
    server: str,
    timeout: float = 10.0,
    *,
    tls: ssl.SSLContext | None = None,
    token: str | None = None,
) -> list[FunctionRow]:
    rows = []
    for line in query(server, "status", timeout, tls=tls, token=token):
        name, total, running, workers = line.split("\t")
        rows.append(FunctionRow(name, int(total), int(running), int(workers)))
    return rows


def workers(
    server: str,
    timeout: float = 10.0,
    *,
    tls: ssl.SSLContext | None = None,
    token: str | None = None,
) -> list[ConnectionRow]:
    rows = []
    for line in query(server, "workers", timeout, tls=tls, token=token):
        head, _, functions = line.partition(" :")
        fd, ip, client_id = head.split(" ", 2)
        rows.append(ConnectionRow(fd, ip, client_id, tuple(functions.split())))
    return rows
