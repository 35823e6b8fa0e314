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

import logging
from collections.abc import Iterable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from jobwire.protocols.ojs.errors import OJSError, error_body
from jobwire.protocols.ojs.ids import uuid7
from jobwire.protocols.ojs.messages import SPEC_VERSION
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


def refuse_non_json(request: web.Request) -> None:
    """OJSError 415 for a non-JSON Content-Type on an OJS request that may carry a body."""
    if (
        request.method in _BODY_METHODS
        and request.path.startswith("/ojs/")
        and "Content-Type" in request.headers
        and not is_json(request.content_type)
    ):
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


class OJSRequestHandler(RequestHandler):
    """aiohttp's connection handler, answering what its parser refuses with an OJS body."""

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
    def __call__(self) -> RequestHandler:
        kwargs: dict[str, Any] = self._kwargs
        return OJSRequestHandler(self, loop=self._loop, **kwargs)


class OJSAppRunner(web.AppRunner):
    """An AppRunner whose connections answer malformed HTTP with an OJS error body."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _OJSServer
        return server
