"""The Gearman admin text protocol, client side: `status` and `workers` as rows."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from jobwire.sdk.connection import parse_address
from jobwire.sdk.errors import ServerError, ServerUnavailable


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


def query(server: str, command: str, timeout: float = 10.0) -> list[str]:
    """Send one list command (status, workers, ...) and return its lines without the final "."."""
    address = parse_address(server)
    try:
        with socket.create_connection(address, timeout=timeout) as sock:
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


def _is_error(reply: bytes) -> bool:
    return reply.startswith(b"ERR ") and reply.endswith(b"\n")


def status(server: str, timeout: float = 10.0) -> list[FunctionRow]:
    rows = []
    for line in query(server, "status", timeout):
        name, total, running, workers = line.split("\t")
        rows.append(FunctionRow(name, int(total), int(running), int(workers)))
    return rows


def workers(server: str, timeout: float = 10.0) -> list[ConnectionRow]:
    rows = []
    for line in query(server, "workers", timeout):
        head, _, functions = line.partition(" :")
        fd, ip, client_id = head.split(" ", 2)
        rows.append(ConnectionRow(fd, ip, client_id, tuple(functions.split())))
    return rows
