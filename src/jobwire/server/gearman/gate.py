"""Roles on the Gearman port: the gate between a connection's reads and its scanner.

Only with `--auth`: a connection without a gate (auth off, or an admin once known) feeds its
scanner directly, so the hot path pays one attribute test per read. The gate frames the
stream itself (packet headers and admin text lines), passes on what the connection's
principal may send, answers the rest with ERROR, and handles the authentication extension:

    OPTION_REQ "auth:<token>"  ->  OPTION_RES "auth"     (the token is never echoed)
                               ->  ERROR AUTH_FAILED     (and the connection is closed)

A connection whose TLS client certificate names a principal is authenticated from the start;
any other must send OPTION_REQ auth:<token> first: anything else is answered ERROR
AUTH_REQUIRED and closes it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from jobwire.protocols.gearman.packets import HEADER, HEADER_SIZE, REQ_MAGIC
from jobwire.protocols.gearman.packets import PacketType as T
from jobwire.server.auth import ADMIN, CLIENT, WORKER, Authenticator, Principal

if TYPE_CHECKING:
    from jobwire.server.gearman.handlers import GearmanConnection

log = logging.getLogger("jobwire.gearman")

#: The role each request packet needs (ECHO_REQ, OPTION_REQ, GET_STATUS and
#: GET_STATUS_UNIQUE: any principal).
PACKET_ROLE: Final[dict[int, str]] = {
    int(t): CLIENT
    for t in (
        T.SUBMIT_JOB,
        T.SUBMIT_JOB_BG,
        T.SUBMIT_JOB_HIGH,
        T.SUBMIT_JOB_HIGH_BG,
        T.SUBMIT_JOB_LOW,
        T.SUBMIT_JOB_LOW_BG,
        T.SUBMIT_JOB_SCHED,
        T.SUBMIT_JOB_EPOCH,
        T.SUBMIT_REDUCE_JOB,
        T.SUBMIT_REDUCE_JOB_BACKGROUND,
    )
} | {
    int(t): WORKER
    for t in (
        T.CAN_DO,
        T.CANT_DO,
        T.CAN_DO_TIMEOUT,
        T.RESET_ABILITIES,
        T.PRE_SLEEP,
        T.GRAB_JOB,
        T.GRAB_JOB_UNIQ,
        T.GRAB_JOB_ALL,
        T.WORK_STATUS,
        T.WORK_COMPLETE,
        T.WORK_FAIL,
        T.WORK_EXCEPTION,
        T.WORK_DATA,
        T.WORK_WARNING,
        T.SET_CLIENT_ID,
        T.ALL_YOURS,
    )
}
_ANY: Final = (
    int(T.ECHO_REQ),
    int(T.OPTION_REQ),
    int(T.GET_STATUS),
    int(T.GET_STATUS_UNIQUE),
)
_OPTION_REQ: Final = int(T.OPTION_REQ)
#: Admin text commands that change state; the others (status, workers, show, version, ...)
#: only read, and any authenticated principal may send them.
ADMIN_COMMANDS: Final = frozenset({"cancel", "create", "drop", "maxqueue", "shutdown"})
AUTH_PREFIX: Final = b"auth:"
#: An OPTION_REQ longer than this is no authentication attempt: passed on (or refused) whole.
MAX_OPTION: Final = 4096
#: An admin line longer than this without its newline is refused.
MAX_LINE: Final = 64 * 1024


class Gate:
    """One connection's gate (see the module docstring)."""

    def __init__(
        self, conn: GearmanConnection, auth: Authenticator, principal: Principal | None
    ) -> None:
        self.conn = conn
        self.auth = auth
        self.principal = principal
        self._buffer = b""
        self._passing = 0  # bytes of an allowed packet still to pass on
        self._skipping = 0  # bytes of a refused packet still to drop

    def feed(self, data: bytes) -> None:
        conn = self.conn
        buf = self._buffer + data if self._buffer else data
        self._buffer = b""
        size = len(buf)
        i = 0  # the first byte not handled yet
        start = 0  # the first byte of the run being passed on
        while i < size:
            if self._passing:
                n = min(self._passing, size - i)
                self._passing -= n
                i += n
                continue
            if self._skipping:
                n = min(self._skipping, size - i)
                self._skipping -= n
                i += n
                start = i
                continue
            if conn.closing:
                return
            if buf[i] == 0:  # a binary packet
                if size - i < HEADER_SIZE:
                    break
                magic, kind, length = HEADER.unpack_from(buf, i)
                if magic != REQ_MAGIC:  # the scanner's to refuse
                    i = size
                    break
                if kind == _OPTION_REQ and length <= MAX_OPTION:
                    end = i + HEADER_SIZE + length
                    if end > size:
                        break
                    body = buf[i + HEADER_SIZE : end]
                    if body.startswith(AUTH_PREFIX):
                        self._pass(buf, start, i)
                        i = start = end
                        self._authenticate(body[len(AUTH_PREFIX) :])
                        if self.principal is not None and self.principal.is_admin:
                            self._detach(buf[i:])
                            return
                        continue
                role = PACKET_ROLE.get(kind)
                if self.principal is not None and (
                    kind in _ANY or role is None or self.principal.may(role)
                ):
                    self._passing = HEADER_SIZE + length
                    continue
                self._pass(buf, start, i)
                self._refuse(kind, role)
                self._skipping = HEADER_SIZE + length
                continue
            # an admin text line
            newline = buf.find(b"\n", i)
            if newline < 0:
                if size - i > MAX_LINE:
                    self._pass(buf, start, i)
                    conn.send(b"ERR LINE_TOO_LONG admin+line+too+long\r\n")
                    conn.close_after_flush()
                    return
                break
            words = buf[i:newline].split()
            command = words[0].decode("latin-1").lower() if words else ""
            if self.principal is not None and (
                command not in ADMIN_COMMANDS or self.principal.is_admin
            ):
                i = newline + 1
                continue
            self._pass(buf, start, i)
            i = start = newline + 1
            if self.principal is None:
                conn.send(b"ERR AUTH_REQUIRED send+OPTION_REQ+auth:TOKEN+first\r\n")
                conn.close_after_flush()
                return
            conn.send(b"ERR PERMISSION_DENIED the+admin+role+is+needed\r\n")
        self._pass(buf, start, i)
        if i < size:
            self._buffer = buf[i:]

    def _pass(self, buf: bytes, start: int, end: int) -> None:
        if end > start and not self.conn.closing:
            self.conn.scanner.feed(buf[start:end] if start or end < len(buf) else buf)

    def _detach(self, rest: bytes) -> None:
        """An admin may do everything: the connection reads without the gate from now on."""
        conn = self.conn
        conn.gate = None
        if rest and not conn.closing:
            conn.scanner.feed(rest)

    def _authenticate(self, token: bytes) -> None:
        conn = self.conn
        principal = self.auth.by_token(token)
        if principal is None:
            log.warning("gearman: %s sent a token no principal has", conn.peer_ip)
            conn.error("AUTH_FAILED", "unknown token")
            conn.close_after_flush()
            return
        self.principal = principal
        conn.principal = principal.name
        conn.settle_idle()
        conn.send(_option_res_auth())

    def _refuse(self, kind: int, role: str | None) -> None:
        conn = self.conn
        if self.principal is None:
            conn.error("AUTH_REQUIRED", "send OPTION_REQ auth:TOKEN first")
            conn.close_after_flush()
            return
        needed = role or ADMIN
        conn.error("PERMISSION_DENIED", f"the {needed} role is needed for packet {kind}")


def _option_res_auth() -> bytes:
    from jobwire.protocols.gearman.replies import option_res

    return option_res(b"auth")
