"""HTTP plumbing of the OJS binding: replies, the error middleware, request body and query
parsing. Every failure leaves as an OJS error body; nothing here knows the engine."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import msgspec
import orjson
from aiohttp import web

from jobwire.engine.errors import StoreUnavailable
from jobwire.protocols.json_depth import MAX_DEPTH, too_deep
from jobwire.protocols.ojs.errors import OJSError, error_body, invalid
from jobwire.protocols.ojs.limits import MAX_INT, MIN_INT
from jobwire.protocols.ojs.messages import SPEC_VERSION, refused
from jobwire.server.errors import ERRORS

if TYPE_CHECKING:
    from jobwire.server.runtime import Runtime

log = logging.getLogger("jobwire.ojs")

CONTENT_TYPE = "application/openjobspec+json"
BASE = "/ojs/v1"
#: The request's id (`X-Request-Id`, or one made for it), kept on the request by the edges.
REQUEST_ID = "ojs_request_id"
# Errors answered over HTTP are counted in `ERRORS` by OJS error code, "http_" ahead.


def reply(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type=CONTENT_TYPE, headers=headers
    )


def http_error_code(status: int) -> str:
    """The OJS error code of an HTTP refusal aiohttp makes (routing, limits, parsing)."""
    return {
        404: "not_found",
        405: "method_not_allowed",
        413: "payload_too_large",
        415: "unsupported_media_type",
    }.get(status, "invalid_request" if status < 500 else "backend_error")


def failure_reply(request: web.Request, exc: Exception, request_id: str) -> web.Response:
    """The OJS error reply for what a handler raised (call it in the `except` block: an
    unexpected exception is logged with its traceback)."""
    return error_reply(exc, request_id, f"OJS request {request.method} {request.path}")


def error_reply(exc: Exception, request_id: str, what: str) -> web.Response:
    """`failure_reply` for `what` (logged with the traceback of an unexpected exception)."""
    if isinstance(exc, OJSError):
        ERRORS["http_" + exc.code] += 1
        return reply(error_body(exc, request_id), exc.status, exc.headers)
    if isinstance(exc, web.HTTPException):
        code = http_error_code(exc.status)
        ERRORS["http_" + code] += 1
        error = OJSError(code, exc.reason or code, status=exc.status)
        response = reply(error_body(error, request_id), exc.status)
        if exc.status == 405 and "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    ERRORS["http_internal"] += 1
    log.exception("%s failed", what)
    error = OJSError("backend_error", "internal error", status=500, retryable=True)
    return reply(error_body(error, request_id), 500)


def finish_reply(response: web.StreamResponse, request_id: str) -> web.StreamResponse:
    """The headers every OJS reply carries."""
    headers = response.headers
    headers["OJS-Version"] = SPEC_VERSION
    headers["X-Request-Id"] = request_id
    return response


#: A body's digits as "0", everything else as " ": a run of 19 zeros may be an integer
#: outside 64 bits (the common body has none; two C calls find out).
_DIGITS = bytes(0x30 if 0x30 <= i <= 0x39 else 0x20 for i in range(256))
_LONG_RUN = b"0" * 19
#: `_DIGITS` with "[" and "{" as "[" besides: one translation shows both what may nest and
#: the runs of digits (`plain_json`).
_PLAIN = bytes(0x5B if i in (0x5B, 0x7B) else c for i, c in enumerate(_DIGITS))


#: Seconds a request's body may take to arrive (`--http-body-timeout`); 0: no bound.
BODY_TIMEOUT = web.AppKey("body_timeout", float)


async def committed(runtime: Runtime) -> None:
    """Wait until what the store was given so far is durable: an OJS 503 (retryable) when
    its commit failed, so a reply never acknowledges what may be lost."""
    try:
        await runtime.durable()
    except StoreUnavailable:
        raise OJSError(
            "backend_error", "the store could not commit", status=503, retryable=True
        ) from None


async def read_body(request: web.Request, up_to: int | None = None) -> bytes:
    """The request's body (its first `up_to` bytes), within the body read timeout: a client
    that sends it too slowly gets 408 and its connection is closed after the reply."""
    read = request.read() if up_to is None else request.content.read(up_to)
    body: bytes
    if request.content.is_eof():  # all of it arrived with the headers: nothing to wait for
        body = await read
        return body
    timeout = request.config_dict.get(BODY_TIMEOUT, 0.0)
    if not timeout:
        body = await read
        return body
    try:
        async with asyncio.timeout(timeout):
            body = await read
            return body
    except TimeoutError:
        request.protocol.keep_alive(False)
        raise OJSError(
            "request_timeout", f"request body not received within {timeout:g}s", status=408
        ) from None


async def read_json(request: web.Request, *, required: bool = True) -> Any:
    """The body as JSON; integers are exact (never floats), and refused outside 64 bits."""
    raw = await read_body(request)
    return decode_json(raw, required=required)


def decode_json(raw: bytes, *, required: bool = True) -> Any:
    if not raw.strip():
        if required:
            raise OJSError("invalid_payload", "request body is empty; send a JSON object")
        return {}
    try:
        body = msgspec.json.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise OJSError("invalid_payload", f"malformed JSON: {exc}") from None
    if too_deep(raw, body):
        raise OJSError("invalid_payload", f"JSON nested deeper than {MAX_DEPTH} levels")
    if _LONG_RUN in raw.translate(_DIGITS):
        check_integers(body)
    return body


def plain_json(raw: bytes) -> bool:
    """True when `raw` cannot nest too deeply or hold an integer beyond 64 bits (so a
    decoder may take it without the checks of `decode_json`): the usual body."""
    shape = raw.translate(_PLAIN)
    return shape.count(b"[") <= MAX_DEPTH and shape.find(_LONG_RUN) < 0


def check_integers(body: Any) -> None:
    """Refuse an integer outside [-2^63, 2^64-1] (what jobwire's JSON encoders write back)
    anywhere in `body`, naming where it is."""
    stack: list[tuple[Any, str]] = [(body, "$")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            stack.extend((v, f"{path}.{k}") for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(value))
        elif isinstance(value, int) and not MIN_INT <= value <= MAX_INT:
            raise refused("integers must lie in [-2^63, 2^64-1]; send larger ones as strings", path)


async def read_object(request: web.Request, *, required: bool = True) -> dict[str, Any]:
    body = await read_json(request, required=required)
    if not isinstance(body, dict):
        raise OJSError("invalid_payload", "request body must be a JSON object")
    return body


def str_field(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise invalid(f"{name} is required and must be a non-empty string")
    return value


def optional_str(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise invalid(f"{name} must be a string")
    return value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(body: dict[str, Any], name: str, default: int | None = None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if not is_int(value) or value <= 0:
        raise invalid(f"{name} must be a positive integer")
    result: int = value
    return result


def query_int(request: web.Request, name: str, default: int, *, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise invalid(f"query parameter {name} must be an integer") from None
    if not low <= value <= high:
        raise invalid(f"query parameter {name} must be in [{low}, {high}]")
    return value


def query_list(request: web.Request, name: str) -> list[str]:
    """`?name=a,b&name=c` -> [a, b, c]."""
    out: list[str] = []
    for raw in request.query.getall(name, []):
        out.extend(part for part in raw.split(",") if part)
    return out
