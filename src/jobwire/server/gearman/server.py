"""Listener state shared by the Gearman connections: options, names, the connection table."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jobwire.engine import Engine
from jobwire.protocols.gearman.replies import CreatedReplies
from jobwire.server.gearman.handlers import GearmanConnection
from jobwire.server.runtime import Runtime

if TYPE_CHECKING:
    from jobwire.server.auth import Authenticator, RateLimiter


@dataclass(slots=True)
class GearmanOptions:
    exceptions: bool = False  # forward WORK_EXCEPTION to every client (gearmand --exceptions)
    max_packet: int = 64 * 1024 * 1024
    keepalive: bool = False
    keepalive_idle: int = 30
    keepalive_interval: int = 10
    keepalive_count: int = 5
    verbose: str = "ERROR"


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


class GearmanServer:
    """Listener state shared by its connections."""

    def __init__(
        self,
        runtime: Runtime,
        options: GearmanOptions,
        auth: Authenticator | None = None,
        limiter: RateLimiter | None = None,
    ) -> None:
        self.runtime = runtime
        #: --auth: every connection gets a `gate.Gate` for its principal's roles.
        self.auth = auth
        #: --rate-limit: submissions a second per principal (per peer address without
        #: --auth), counted by the HTTP port's limiter; None: no limit (a submit tests this).
        self.limiter = limiter
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
        #: The start of the ids the engine numbers, `PREFIX:` (see `scanner.handle_number`).
        self.id_prefix = _encode(self.engine.jobs.prefix)
        #: JOB_CREATED replies, made a block of numbers at a time.
        self.created = CreatedReplies()

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

    def connection_made(self, conn: GearmanConnection) -> int:
        self._next_conn_id += 1
        self.connections[self._next_conn_id] = conn
        return self._next_conn_id

    def guard(self, conn: GearmanConnection, transport: asyncio.BaseTransport) -> None:
        """--auth: the principal of the TLS client certificate, if any, and the gate for it."""
        from jobwire.server.gearman.gate import Gate

        auth = self.auth
        assert auth is not None
        principal = None
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:
            principal = auth.by_certificate(ssl_object.getpeercert())
        if principal is not None:
            conn.principal = principal.name
            conn.settle_idle()
            if principal.is_admin:
                return  # may send anything: no gate
        conn.gate = Gate(conn, auth, principal)

    def connection_lost(self, conn: GearmanConnection) -> None:
        self.connections.pop(conn.conn_id, None)

    def protocol_factory(self) -> GearmanConnection:
        return GearmanConnection(self)
