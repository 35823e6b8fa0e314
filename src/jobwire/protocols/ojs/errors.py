"""OJS error bodies (ojs-http-binding §16): one exception type carrying code and HTTP status."""

from __future__ import annotations

import re
from typing import Any

DOCS_URL = "https://openjobspec.org/spec/errors"

#: HTTP status for each standard code; custom codes (x_*) default to 400.
STATUS = {
    "invalid_payload": 400,
    "invalid_request": 400,
    "schema_validation": 400,
    "not_found": 404,
    "method_not_allowed": 405,
    "duplicate": 409,
    "conflict": 409,
    "payload_too_large": 413,
    "unsupported_media_type": 415,
    "queue_paused": 422,
    "unsupported": 422,
    "rate_limited": 429,
    "backend_error": 500,
}

ERROR_TYPES = {
    "invalid_request": "validation_error",
    "invalid_payload": "validation_error",
    "schema_validation": "validation_error",
}

HINTS = {
    "invalid_payload": "Send a JSON object body with Content-Type application/openjobspec+json.",
    "invalid_request": "Check the request fields against the OJS HTTP binding.",
    "not_found": "Check the id; finished jobs are kept only for the retention period.",
    "conflict": "The job's current state does not allow this operation.",
    "duplicate": "A job with this id or unique key already exists.",
    "queue_paused": "Resume the queue with POST /ojs/v1/queues/{name}/resume.",
    "unsupported_media_type": "Send JSON, Content-Type application/openjobspec+json.",
}


class OJSError(Exception):
    """A refusal with an OJS error code; adapters render it with `error_body`."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.headers = headers  # sent with the error reply (Retry-After, ...)
        self.code = code
        self.message = message
        self.status = status if status is not None else STATUS.get(code, 400)
        self.retryable = retryable
        self.details = details


def error_body(error: OJSError, request_id: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "code": error.code,
        "type": ERROR_TYPES.get(error.code, error.code),
        "message": error.message,
        "retryable": error.retryable,
        "request_id": request_id,
        "hint": HINTS.get(error.code, "See the OJS error catalog."),
        "docs_url": DOCS_URL,
    }
    if error.details:
        body["details"] = error.details
    return {"error": body}


def invalid(message: str, *, status: int = 400) -> OJSError:
    """A request that parsed but breaks a rule of the spec."""
    return OJSError("invalid_request", message, status=status)


#: Coarse error classes guessed from a failure message, first match wins.
_ERROR_CLASSES = (
    (re.compile(r"rate.?limit|too many requests|throttl", re.I), "RateLimitExceeded"),
    (
        re.compile(r"connect\w*.*(timed? ?out|timeout)|(timed? ?out|timeout).*connect", re.I),
        "ConnectionTimeout",
    ),
    (re.compile(r"timed? ?out|timeout|deadline exceeded", re.I), "Timeout"),
    (re.compile(r"connection (refused|reset|closed)|unreachable", re.I), "ConnectionError"),
    (re.compile(r"not found|no such", re.I), "NotFound"),
    (re.compile(r"permission|forbidden|unauthori[sz]ed|denied", re.I), "PermissionDenied"),
    (re.compile(r"invalid|validation|malformed", re.I), "ValidationError"),
)


def classify_error(message: str) -> str:
    """An error class for a failure the worker did not classify, from its message.

    Error history entries carry a `type`: the worker's own, else `details.error_class`, else
    this guess (so the history groups failures even from workers that send only text).
    """
    for pattern, name in _ERROR_CLASSES:
        if pattern.search(message):
            return name
    return "InternalServerError"
