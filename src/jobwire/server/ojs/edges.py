"""HTTP edges of the OJS binding: JSON bodies only (415), CORS only when configured, and an
OJS error body even for requests aiohttp's parser refuses.

- A request that may carry a body (POST, PUT, PATCH, DELETE) under `/ojs/` with a
  Content-Type other than JSON (`application/json`, `application/openjobspec+json`, any
  `application/*+json`) is 415 `unsupported_media_type`. The types a web page may send
  cross-origin without a preflight (`text/plain`, form types) are therefore refused, so a
  page cannot enqueue or change anything behind the operator's back. A request without a
  Content-Type is accepted (as HTTP clients that send none expect).
- CORS is off unless `--cors-origin ORIGIN` names origins: then a preflight from one of them
  is answered 204, and replies to it carry `Access-Control-Allow-Origin`; no other origin
  gets any CORS header. `*` allows every origin.
- Malformed HTTP (a bad Content-Length, an oversize URL or header, a bare LF) is refused by
  aiohttp's parser before any handler runs; `OJSAppRunner` makes that refusal an OJS error
  body too, where the connection still allows an answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, cast

from aiohttp import web
from aiohttp.typedefs import Handler
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from jobwire.protocols.ojs.errors import OJSError, error_body
from jobwire.protocols.ojs.ids import uuid7
from jobwire.protocols.ojs.messages import SPEC_VERSION
from jobwire.server.limits import ConnectionTable, IdleGuard
from jobwire.server.ojs.direct import Edges, direct_handler
from jobwire.server.ojs.http import http_error_code, reply

log = logging.getLogger("jobwire.ojs")

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_CORS_METHODS = "GET, POST, PUT, PATCH, DELETE, OPTIONS"
_CORS_HEADERS = "Content-Type, X-Request-Id, Authorization, Accept"
_CORS_EXPOSE = "X-Request-Id, OJS-Version, Location, Retry-After"
CORS_MAX_AGE = 600


def is_json(content_type: str) -> bool:
    """`application/json`, `application/openjobspec+json`, `application/*+json`."""
    kind = content_type.lower()
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )


@web.middleware
async def json_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    """415 for a non-JSON Content-Type on a request that may carry a body."""
    refuse_non_json(request)
    response: web.StreamResponse = await handler(request)
    return response


#: Content-Type header values seen -> JSON or not: aiohttp parses the header anew for every
#: request that asks its `content_type`; clients send the same few values.
_JSON_CONTENT_TYPES: dict[str, bool] = {}
_KEPT_CONTENT_TYPES = 64


def refuse_non_json(request: web.Request) -> None:
    """OJSError 415 for a non-JSON Content-Type on an OJS request that may carry a body."""
    if request.method not in _BODY_METHODS:
        return
    raw = request.headers.get("Content-Type")
    if raw is None:
        return
    json_type = _JSON_CONTENT_TYPES.get(raw)
    if json_type is None:
        json_type = is_json(request.content_type)
        if len(_JSON_CONTENT_TYPES) < _KEPT_CONTENT_TYPES:
            _JSON_CONTENT_TYPES[raw] = json_type
    if not json_type and request.path.startswith("/ojs/"):
        raise OJSError(
            "unsupported_media_type",
            f"Content-Type {request.content_type!r} is not JSON; send "
            "application/openjobspec+json or application/json",
            status=415,
        )


class Cors:
    """The CORS middleware: nothing at all unless origins are configured."""

    def __init__(self, origins: Iterable[str]) -> None:
        self.origins = frozenset(origins)
        self.any = "*" in self.origins

    def allowed(self, origin: str | None) -> bool:
        return origin is not None and (self.any or origin in self.origins)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if not self.allowed(origin):
            response: web.StreamResponse = await handler(request)
            return response
        assert origin is not None
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            preflight = web.Response(status=204)
            preflight.headers.update(
                {
                    "Access-Control-Allow-Methods": _CORS_METHODS,
                    "Access-Control-Allow-Headers": request.headers.get(
                        "Access-Control-Request-Headers", _CORS_HEADERS
                    ),
                    "Access-Control-Max-Age": str(CORS_MAX_AGE),
                }
            )
            self._allow(preflight, origin)
            return preflight
        response = await handler(request)
        self._allow(response, origin)
        response.headers["Access-Control-Expose-Headers"] = _CORS_EXPOSE
        return response

    def _allow(self, response: web.StreamResponse, origin: str) -> None:
        response.headers["Access-Control-Allow-Origin"] = "*" if self.any else origin
        if not self.any:
            response.headers["Vary"] = "Origin"


def _raw_error(status: int, reason: str, code: str, message: str) -> bytes:
    """A complete HTTP/1.1 error reply with an OJS error body, for a connection refused or
    timed out before aiohttp has a request to answer."""
    request_id = f"req_{uuid7()}"
    error = OJSError(code, message, status=status, retryable=True)
    body = reply(error_body(error, request_id), status).body
    assert isinstance(body, bytes)
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"OJS-Version: {SPEC_VERSION}\r\nX-Request-Id: {request_id}\r\n"
        + ("Retry-After: 1\r\n" if status == 503 else "")
        + "Connection: close\r\n\r\n"
    )
    return head.encode() + body


class OJSRequestHandler(RequestHandler):
    """aiohttp's connection handler, answering what its parser refuses with an OJS body,
    and holding the connection bounds (server/limits.py): admission in total and per
    address, the idle timeout, and the time a request's header may take to arrive.

    aiohttp has no header read timeout; this one watches its parser's progress through its
    handler's fields (`_request_count`, `_messages`, `_current_request`, `_upgraded`),
    which tests/server/test_limits.py keeps honest."""

    jobwire_table: ConnectionTable | None = None
    header_timeout: float = 0.0
    _address = ""
    _idle: IdleGuard | None = None
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        table = self.jobwire_table
        if table is None:
            return
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else "-"
        refused = table.admit(address)
        if refused is not None:
            log.warning("refused an HTTP connection from %s: %s", address, refused)
            # uvloop's transports implement asyncio.Transport without subclassing it.
            writer = cast(asyncio.Transport, transport)
            writer.write(_raw_error(503, "Service Unavailable", "unavailable", refused))
            self.force_close()
            return
        self._address = address
        self._idle = table.guard(self._loop, self._idle_expired)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._idle is not None:
            self._idle.settle()
            self._idle = None
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        if self._address and self.jobwire_table is not None:
            self.jobwire_table.release(self._address)
            self._address = ""
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        idle, table = self._idle, self.jobwire_table
        if idle is not None and table is not None and table.settle_on_data:
            idle.settle()
            self._idle = None
        count = self._request_count
        super().data_received(data)
        if self._request_count != count or self._upgraded:
            if self._header_timer is not None:  # the header is complete
                self._header_timer.cancel()
                self._header_timer = None
        elif (
            self._header_timer is None
            and self.header_timeout > 0
            and self._between_requests()
            and not self._force_close
        ):
            # The first bytes of a request's header: all of it must come in time.
            self._header_timer = self._loop.call_later(self.header_timeout, self._header_late)

    def _between_requests(self) -> bool:
        return self._current_request is None and not self._messages and not self._upgraded

    def _header_late(self) -> None:
        self._header_timer = None
        if self._between_requests() and self.transport is not None:
            log.info("closing an HTTP connection from %s: header too slow", self._address)
            message = f"request header not received within {self.header_timeout:g}s"
            self.transport.write(_raw_error(408, "Request Timeout", "request_timeout", message))
            self.force_close()

    def _idle_expired(self) -> None:
        self._idle = None
        if self.transport is not None and not self._force_close:
            log.info("closing an HTTP connection from %s: idle", self._address)
            message = "nothing received within the idle timeout"
            self.transport.write(_raw_error(408, "Request Timeout", "request_timeout", message))
            self.force_close()

    def settle(self) -> None:
        """The connection authenticated (part A's hook): the idle timeout no longer applies."""
        if self._idle is not None:
            self._idle.settle()
            self._idle = None

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            self.log_exception("Error handling request from %s", request.remote, exc_info=exc)
        else:  # the client's malformed request: no traceback in the server's log
            log.info("refused malformed HTTP from %s: %s", request.remote, message or exc)
        if request.writer.output_size > 0:  # a reply has started: the connection is broken
            raise ConnectionError("a response was sent already; cannot send an error")
        code = http_error_code(status)
        text = message if status < 500 and message else "internal error"
        request_id = f"req_{uuid7()}"
        error = OJSError(code, text, status=status, retryable=status >= 500)
        response = reply(error_body(error, request_id), status)
        response.headers.update({"OJS-Version": SPEC_VERSION, "X-Request-Id": request_id})
        response.force_close()
        return response


class _OJSServer(web.Server):
    jobwire_table: ConnectionTable | None = None
    header_timeout = 0.0

    def __call__(self) -> RequestHandler:
        kwargs: dict[str, Any] = self._kwargs
        handler = OJSRequestHandler(self, loop=self._loop, **kwargs)
        handler.jobwire_table = self.jobwire_table
        handler.header_timeout = self.header_timeout
        return handler


class OJSAppRunner(web.AppRunner):
    """An AppRunner whose connections answer malformed HTTP with an OJS error body and keep
    the connection bounds of `connections` (None: unbounded)."""

    def __init__(
        self,
        app: web.Application,
        *,
        connections: ConnectionTable | None = None,
        header_timeout: float = 0.0,
        edges: Edges | None = None,
        **kwargs: Any,
    ) -> None:
        """`edges`: the OJS edges middleware, whose routes then skip aiohttp's router
        once it has shown where they go (`jobwire.server.ojs.direct`)."""
        super().__init__(app, **kwargs)
        self._connections = connections
        self._header_timeout = header_timeout
        self._edges = edges

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _OJSServer
        assert isinstance(server, _OJSServer)
        server.jobwire_table = self._connections
        server.header_timeout = self._header_timeout
        if self._edges is not None:
            server.request_handler = direct_handler(self.app, self._edges, server.request_handler)
        return server
