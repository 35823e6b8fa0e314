"""The job envelope: validate a PUSH request, and render a job as the OJS JSON object."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from jobwire.protocols.ojs.errors import OJSError, invalid
from jobwire.protocols.ojs.ids import is_uuid7
from jobwire.protocols.ojs.retry import RetryPolicy, parse_retry
from jobwire.protocols.ojs.times import parse_time

SPEC_VERSION = "1.0"
TYPE_RE = re.compile(r"^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*$")
QUEUE_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
PRIORITY_MIN, PRIORITY_MAX = -100, 100
MAX_NAME = 255

#: Envelope attributes jobwire interprets; anything else is kept and echoed back.
KNOWN_FIELDS = frozenset({"id", "type", "args", "meta", "options", "specversion", "schema"})


@dataclass(slots=True)
class PushRequest:
    type: str
    args: list[Any]
    id: str | None = None
    queue: str = "default"
    priority: int = 0
    meta: dict[str, Any] | None = None
    tags: list[str] | None = None
    run_at: float | None = None
    expires_at: float | None = None
    timeout: float | None = None  # seconds of execution the job may take
    visibility_timeout: float | None = None  # seconds a fetch leases it
    pending: bool = False
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    retry_raw: dict[str, Any] | None = None  # the validated `retry` option as sent
    unique: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    schema: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ms(options: dict[str, Any], name: str) -> float | None:
    value = options.get(name)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise invalid(f"options.{name} must be a non-negative number of milliseconds")
    return float(value) / 1000


def check_queue(name: Any) -> str:
    if not isinstance(name, str) or len(name) > MAX_NAME or not QUEUE_RE.match(name):
        raise invalid("queue must match [a-z0-9][a-z0-9._-]* (lower case)")
    return name


def parse_push(body: Any) -> PushRequest:
    """Validate a PUSH body (`POST /ojs/v1/jobs`); raises OJSError with the reason."""
    if not isinstance(body, dict):
        raise OJSError("invalid_payload", "request body must be a JSON object")
    job_type = body.get("type")
    if job_type is None:
        raise invalid("type is required")
    if not isinstance(job_type, str) or len(job_type) > MAX_NAME or not TYPE_RE.match(job_type):
        raise invalid("type must be dot-namespaced lower-case identifiers, e.g. email.send")
    if "args" not in body:
        raise invalid("args is required")
    args = body["args"]
    if not isinstance(args, list):
        raise invalid("args must be a JSON array")
    job_id = body.get("id")
    if job_id is not None and (not isinstance(job_id, str) or not is_uuid7(job_id)):
        raise invalid("id must be a lower-case UUIDv7")
    meta = body.get("meta")
    if meta is not None and not isinstance(meta, dict):
        raise invalid("meta must be an object")
    specversion = body.get("specversion", SPEC_VERSION)
    if specversion != SPEC_VERSION:
        raise invalid(f"specversion must be {SPEC_VERSION!r}")
    options = body.get("options")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise invalid("options must be an object")
    # The core envelope puts some attributes at the top level; options win.
    merged = {k: body[k] for k in ("queue", "priority", "scheduled_at", "tags") if k in body}
    merged.update(options)
    req = PushRequest(type=job_type, args=args, id=job_id, meta=meta)
    if "queue" in merged:
        req.queue = check_queue(merged["queue"])
    if "priority" in merged:
        priority = merged["priority"]
        if not _is_int(priority) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
            raise invalid(f"priority must be an integer in [{PRIORITY_MIN}, {PRIORITY_MAX}]")
        req.priority = priority
    tags = merged.get("tags")
    if tags is not None:
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise invalid("tags must be an array of strings")
        req.tags = tags
    for name in ("delay_until", "scheduled_at"):
        if merged.get(name) is not None:
            try:
                req.run_at = parse_time(merged[name])
            except (ValueError, TypeError):
                raise invalid(f"{name} must be an RFC 3339 timestamp with a timezone") from None
    if merged.get("expires_at") is not None:
        try:
            req.expires_at = parse_time(merged["expires_at"])
        except (ValueError, TypeError):
            raise invalid("expires_at must be an RFC 3339 timestamp with a timezone") from None
    req.timeout = _ms(merged, "timeout_ms")
    req.visibility_timeout = _ms(merged, "visibility_timeout_ms")
    pending = merged.get("pending", False)
    if not isinstance(pending, bool):
        raise invalid("options.pending must be a boolean")
    req.pending = pending
    if "retry" in merged:
        req.retry = parse_retry(merged["retry"])
        req.retry_raw = merged["retry"]
    unique = merged.get("unique")
    if unique is not None and not isinstance(unique, dict):
        raise invalid("options.unique must be an object")
    req.unique = unique
    schema = body.get("schema")
    if schema is not None and not isinstance(schema, str):
        raise invalid("schema must be a string")
    req.schema = schema
    req.extra = {k: v for k, v in body.items() if k not in KNOWN_FIELDS}
    for k in ("queue", "priority", "scheduled_at", "tags"):
        req.extra.pop(k, None)
    req.options = options
    return req
