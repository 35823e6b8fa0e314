"""The job envelope: validate a PUSH request (`messages.Envelope`) into a `PushRequest`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from jobwire.protocols.ojs.errors import OJSError
from jobwire.protocols.ojs.limits import MAX_NAME, PRIORITY_MAX, PRIORITY_MIN
from jobwire.protocols.ojs.messages import (
    QUEUE_PATTERN,
    SPEC_VERSION,
    TYPE_PATTERN,
    Envelope,
    PlainEnvelope,
    Template,
    _dec_hook,
    convert,
)
from jobwire.protocols.ojs.retry import RetryPolicy, policy_of
from jobwire.protocols.ojs.unique import UniquePolicy, unique_policy

TYPE_RE: Final = re.compile(TYPE_PATTERN)
QUEUE_RE: Final = re.compile(QUEUE_PATTERN)

#: Envelope attributes jobwire interprets; anything else is kept and echoed back.
KNOWN_FIELDS = frozenset({"id", "type", "args", "meta", "options", "specversion", "schema"})
#: Core envelope attributes that may sit at the top level instead of in `options`.
TOP_LEVEL_OPTIONS = ("queue", "priority", "scheduled_at", "tags")

__all__ = [
    "MAX_NAME",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "SPEC_VERSION",
    "PushRequest",
    "check_queue",
    "parse_plain_push",
    "parse_push",
    "push_request",
]


@dataclass(slots=True, init=False)
class PushRequest:
    """A validated PUSH. Its own `__init__`, not the dataclass's: compiled (mypyc), it
    makes one per push without running Python code."""

    type: str
    args: list[Any]
    id: str | None
    queue: str
    priority: int
    meta: dict[str, Any] | None
    tags: list[str] | None
    run_at: float | None
    expires_at: float | None
    timeout: float | None  # seconds of execution the job may take
    visibility_timeout: float | None  # seconds a fetch leases it
    pending: bool
    retry: RetryPolicy
    retry_raw: dict[str, Any] | None  # the validated `retry` option as sent
    unique: dict[str, Any] | None
    unique_policy: UniquePolicy | None
    rate_limit: int | None  # rate_limit.max_per_second
    #: The rate-limiting extension's keyed limit {key, concurrency, rate, period}, validated.
    keyed_limit: dict[str, Any] | None
    extra: dict[str, Any]
    schema: str | None
    options: dict[str, Any]

    def __init__(
        self,
        type: str,
        args: list[Any],
        id: str | None = None,
        queue: str = "default",
        priority: int = 0,
        meta: dict[str, Any] | None = None,
        tags: list[str] | None = None,
        run_at: float | None = None,
        expires_at: float | None = None,
        timeout: float | None = None,
        visibility_timeout: float | None = None,
        pending: bool = False,
        retry: RetryPolicy | None = None,
        retry_raw: dict[str, Any] | None = None,
        unique: dict[str, Any] | None = None,
        unique_policy: UniquePolicy | None = None,
        rate_limit: int | None = None,
        keyed_limit: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
        schema: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        self.type = type
        self.args = args
        self.id = id
        self.queue = queue
        self.priority = priority
        self.meta = meta
        self.tags = tags
        self.run_at = run_at
        self.expires_at = expires_at
        self.timeout = timeout
        self.visibility_timeout = visibility_timeout
        self.pending = pending
        self.retry = retry if retry is not None else _DEFAULT_RETRY
        self.retry_raw = retry_raw
        self.unique = unique
        self.unique_policy = unique_policy
        self.rate_limit = rate_limit
        self.keyed_limit = keyed_limit
        self.extra = extra if extra is not None else {}
        self.schema = schema
        self.options = options if options is not None else {}


#: The retry policy of a job without one (frozen: shared by every such request).
_DEFAULT_RETRY: Final = RetryPolicy()


def check_queue(name: Any) -> str:
    if not isinstance(name, str) or len(name) > MAX_NAME or not QUEUE_RE.match(name):
        raise OJSError("invalid_request", "queue must match [a-z0-9][a-z0-9._-]* (lower case)")
    return name


def parse_push(body: Any, prefix: str = "$", *, template: bool = False) -> PushRequest:
    """Validate a PUSH body (`POST /ojs/v1/jobs`); raises OJSError naming the bad field.

    `template`: a job to create later (cron, workflow step), whose `id` is ignored and whose
    `args` default to [].
    """
    if not isinstance(body, dict):
        raise OJSError("invalid_payload", "request body must be a JSON object")
    env = convert(body, Template if template else Envelope, prefix)
    return push_request(env, body)


_PLAIN: Final = msgspec.json.Decoder(PlainEnvelope, dec_hook=_dec_hook)
_NO_FIELDS: dict[str, Any] = {}
#: Job type and queue names found valid so far: a server sees the same few again and again.
_TYPES: Final[set[str]] = set()
_QUEUES: Final[set[str]] = set()
_KNOWN_NAMES: Final = 4096  # each set is emptied when it holds this many


def _known(name: str, seen: set[str], pattern: re.Pattern[str]) -> bool:
    if name in seen:
        return True
    if len(name) > MAX_NAME or not pattern.match(name):
        return False
    if len(seen) >= _KNOWN_NAMES:
        seen.clear()
    seen.add(name)
    return True


def parse_plain_push(raw: bytes) -> PushRequest | None:
    """The usual PUSH body, without `options` or unknown attributes, decoded and validated in
    one step from its bytes; None for any other body, good or bad, which `parse_push` then
    takes (and refuses with its own errors). The caller checks nesting depth and integer
    range first, as for any body."""
    try:
        env = _PLAIN.decode(raw)
    except msgspec.DecodeError:  # ValidationError too: the full path names the field
        return None
    if env.options is not None or not _known(env.type, _TYPES, TYPE_RE):
        return None
    if env.queue is not None and not _known(env.queue, _QUEUES, QUEUE_RE):
        return None
    return _plain_request(env)


def _plain_request(env: PlainEnvelope) -> PushRequest:
    """`push_request` of an envelope without options or unknown attributes: what it sets
    for one, in one call (a test compares the two)."""
    scheduled_at = env.scheduled_at
    return PushRequest(
        type=env.type,
        args=env.args,
        id=env.id,
        queue=env.queue if env.queue is not None else "default",
        priority=env.priority if env.priority is not None else 0,
        meta=env.meta,
        tags=env.tags,
        run_at=float(scheduled_at) if scheduled_at is not None else None,
        schema=env.schema,
    )


def push_request(env: Envelope, body: dict[str, Any]) -> PushRequest:
    """The request of an envelope validated from `body` (which keeps the unknown fields)."""
    options = env.options
    raw_options = body.get("options")
    if not isinstance(raw_options, dict):
        raw_options = {}
    req = PushRequest(
        type=env.type,
        args=env.args,
        id=None if isinstance(env, Template) else env.id,
        meta=env.meta,
        schema=env.schema,
        options=raw_options,
    )
    # Options win over the top-level attributes.
    queue = options.queue if options is not None and options.queue is not None else env.queue
    if queue is not None:
        req.queue = queue
    priority = options.priority if options is not None and options.priority is not None else None
    priority = priority if priority is not None else env.priority
    if priority is not None:
        req.priority = priority
    tags = options.tags if options is not None and options.tags is not None else env.tags
    req.tags = tags
    run_at = env.scheduled_at
    if options is not None:
        if options.scheduled_at is not None:
            run_at = options.scheduled_at
        if run_at is None:
            run_at = options.delay_until
        req.expires_at = options.expires_at
        if options.timeout_ms is not None:
            req.timeout = options.timeout_ms / 1000
        if options.visibility_timeout_ms is not None:
            req.visibility_timeout = options.visibility_timeout_ms / 1000
        req.pending = options.pending
        if options.retry is not None:
            req.retry = policy_of(options.retry)
            req.retry_raw = raw_options.get("retry")
        if options.unique is not None:
            req.unique = raw_options.get("unique")
            req.unique_policy = unique_policy(options.unique)
        if options.rate_limit is not None:
            limit = options.rate_limit
            req.rate_limit = limit.max_per_second
            if limit.key is not None:
                req.keyed_limit = {
                    "key": limit.key,
                    "concurrency": limit.concurrency,
                    "rate": limit.rate,
                    "period": limit.period or ("second" if limit.rate is not None else None),
                }
    req.run_at = float(run_at) if run_at is not None else None
    if req.expires_at is not None:
        req.expires_at = float(req.expires_at)
    req.extra = {
        k: v for k, v in body.items() if k not in KNOWN_FIELDS and k not in TOP_LEVEL_OPTIONS
    }
    return req
