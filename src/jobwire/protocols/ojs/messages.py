"""The OJS wire messages, declared once as typed structs with their limits.

Decoding a body into one of these validates it in the same step (types, ranges, lengths,
enumerations, times and durations), and the OpenAPI document's request schemas are generated
from them (`schemas()`), so the limits in `limits.py` live in one place. A refusal names the
field as a JSON path (`$.options.timeout_ms`, `$.jobs[3].options.retry.max_attempts`): the
OJS error body carries it in the message and in `details.field`.

Unknown attributes are allowed everywhere (OJS keeps unknown envelope attributes and echoes
them); the handlers read them from the plain decoded object.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal, TypeVar

import msgspec
from msgspec import Meta, Struct

from jobwire.protocols.ojs import limits
from jobwire.protocols.ojs.errors import OJSError
from jobwire.protocols.ojs.times import parse_duration, parse_time

T = TypeVar("T")

# `$(?!\n)`: Python's `$` also matches before a final newline ("noop\n" would pass); the
# lookahead refuses it and means nothing to the ECMA regexes of the published schemas.
TYPE_PATTERN: Final = r"^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*$(?!\n)"
QUEUE_PATTERN: Final = r"^[a-z0-9][a-z0-9._-]*$(?!\n)"
UUID7_PATTERN: Final = (
    r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$(?!\n)"
)
SPEC_VERSION: Final = "1.0"


class Timestamp(float):
    """Seconds since the epoch, sent as RFC 3339 with a timezone or `+DURATION` from now."""


class Duration(float):
    """Seconds, sent as an ISO-8601 duration (`PT30S`, `P1DT2H`)."""


JobType = Annotated[str, Meta(pattern=TYPE_PATTERN, max_length=limits.MAX_NAME)]
QueueName = Annotated[str, Meta(pattern=QUEUE_PATTERN, max_length=limits.MAX_NAME)]
Name = Annotated[str, Meta(min_length=1, max_length=limits.MAX_NAME)]
Priority = Annotated[int, Meta(ge=limits.PRIORITY_MIN, le=limits.PRIORITY_MAX)]
Millis = Annotated[float, Meta(ge=0, le=limits.MAX_DURATION_MS)]
PositiveMillis = Annotated[int, Meta(ge=1, le=limits.MAX_DURATION_MS)]
Int64 = Annotated[int, Meta(ge=limits.MIN_INT, le=2**63 - 1)]
Strategy = Literal["exponential", "linear", "constant", "none", "polynomial"]
UniqueState = Literal[
    "scheduled",
    "available",
    "pending",
    "active",
    "retryable",
    "completed",
    "cancelled",
    "discarded",
]


class Retry(Struct, kw_only=True):
    """`options.retry` (ojs-retry): refused with 422, as the conformance suite expects."""

    max_attempts: Annotated[int, Meta(ge=0, le=limits.MAX_ATTEMPTS)] = 3
    initial_interval: Duration | None = None
    initial_interval_ms: Millis | None = None
    backoff_coefficient: Annotated[float, Meta(ge=1, le=limits.MAX_BACKOFF_COEFFICIENT)] = 2.0
    max_interval: Duration | None = None
    max_interval_ms: Millis | None = None
    jitter: bool = True
    backoff_strategy: Strategy | None = None
    backoff_type: Strategy | None = None  # an older spelling
    non_retryable_errors: list[str] = []
    on_exhaustion: Literal["discard", "dead_letter"] = "discard"


class Unique(Struct, kw_only=True):
    """`options.unique` (ojs-unique-jobs)."""

    keys: list[Literal["type", "queue", "args", "meta"]] | None = None
    args_keys: list[str] | None = None
    meta_keys: list[str] | None = None
    period: Duration | None = None
    states: list[UniqueState] | None = None
    on_conflict: Literal["reject", "ignore", "replace"] = "reject"

    def __post_init__(self) -> None:
        if self.keys is not None and "meta" in self.keys and not self.meta_keys:
            raise ValueError("unique.meta_keys is required when unique.keys contains meta")


Rate = Annotated[int, Meta(ge=1, le=limits.MAX_RATE)]


class RateLimit(Struct, kw_only=True):
    """`options.rate_limit`: jobwire's per-queue `max_per_second`, and the rate-limiting
    extension's keyed partition `{key, concurrency, rate, period, on_limit}` (at most
    `concurrency` jobs of the key active at once, at most `rate` started per `period`),
    enforced when jobs are fetched; a job over its key's limit waits in its queue."""

    max_per_second: Rate | None = None
    key: Name | None = None
    concurrency: Rate | None = None
    rate: Rate | None = None
    period: Literal["second", "minute", "hour", "day"] | None = None
    on_limit: Literal["wait"] = "wait"

    def __post_init__(self) -> None:
        keyed = self.concurrency is not None or self.rate is not None
        if self.max_per_second is None and not keyed:
            raise ValueError("rate_limit needs max_per_second, or a key with concurrency or rate")
        if keyed and self.key is None:
            raise ValueError("rate_limit.key is required with concurrency or rate")
        if self.key is not None and not keyed:
            raise ValueError("rate_limit.key needs concurrency or rate")
        if self.period is not None and self.rate is None:
            raise ValueError("rate_limit.period needs rate")


class Options(Struct, kw_only=True):
    """`options` of a PUSH; a few may also sit at the envelope's top level (options win)."""

    queue: QueueName | None = None
    priority: Priority | None = None
    timeout_ms: Millis | None = None
    visibility_timeout_ms: Millis | None = None
    scheduled_at: Timestamp | None = None
    delay_until: Timestamp | None = None
    expires_at: Timestamp | None = None
    tags: list[str] | None = None
    pending: bool = False
    retry: Retry | None = None
    unique: Unique | None = None
    rate_limit: RateLimit | None = None


class Envelope(Struct, kw_only=True):
    """A PUSH body (`POST /ojs/v1/jobs`) and each job of a batch."""

    type: JobType
    args: list[Any]
    id: Annotated[str, Meta(pattern=UUID7_PATTERN)] | None = None
    meta: dict[str, Any] | None = None
    specversion: Literal["1.0"] = "1.0"
    schema: str | None = None
    options: Options | None = None
    # The core envelope's top-level attributes; `options` wins over them.
    queue: QueueName | None = None
    priority: Priority | None = None
    scheduled_at: Timestamp | None = None
    tags: list[str] | None = None


class Batch(Struct, kw_only=True):
    """`POST /ojs/v1/jobs/batch`: all or nothing."""

    jobs: Annotated[list[Envelope], Meta(min_length=1, max_length=limits.MAX_BATCH)]


class Template(Envelope, kw_only=True):
    """A job to create later (a cron run, a workflow step): the id is each job's own."""

    args: list[Any] = []
    id: Any = None


class PlainEnvelope(Envelope, kw_only=True, forbid_unknown_fields=True):
    """An envelope without attributes jobwire does not know, decoded straight from bytes
    (`envelope.parse_plain_push`, which checks its names against those seen valid before
    instead of a regex each time). Structs live here, not in a compiled module: msgspec
    reads their annotations, which mypyc does not keep."""

    type: str
    queue: str | None = None


class Callbacks(Struct, kw_only=True):
    on_success: Template | None = None
    on_failure: Template | None = None
    on_complete: Template | None = None


Steps = Annotated[list[Template], Meta(min_length=1, max_length=limits.MAX_STEPS)]


class Workflow(Struct, kw_only=True):
    """`POST /ojs/v1/workflows`: chain, group, or batch (a group with callbacks)."""

    type: Literal["chain", "group", "batch"]
    name: str | None = None
    steps: Steps | None = None
    jobs: Steps | None = None
    callbacks: Callbacks | None = None
    meta: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.steps is None and self.jobs is None:
            raise ValueError("steps (or jobs) must be a non-empty array of jobs")


class CronRegistration(Struct, kw_only=True):
    """`POST /ojs/v1/cron`: `{name, expression, job_template}` or the cron spec's flat
    `{name, cron, type, args, options}`."""

    name: Name
    expression: Annotated[str, Meta(min_length=1, max_length=limits.MAX_NAME)] | None = None
    cron: Annotated[str, Meta(min_length=1, max_length=limits.MAX_NAME)] | None = None
    timezone: Annotated[str, Meta(max_length=limits.MAX_NAME)] | None = None
    overlap_policy: Literal["skip", "allow", "cancel_previous", "enqueue"] | None = None
    enabled: bool = True
    description: str | None = None
    job_template: Template | None = None
    type: JobType | None = None
    args: list[Any] | None = None
    options: Options | None = None
    meta: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.expression is None and self.cron is None:
            raise ValueError("expression (or cron) is required")
        if self.job_template is None and self.type is None:
            raise ValueError("job_template (or type) is required")


class CronToggle(Struct, kw_only=True):
    enabled: bool


class Fetch(Struct, kw_only=True):
    queues: Annotated[list[QueueName], Meta(min_length=1)] | None = None
    count: Annotated[int, Meta(ge=1, le=limits.MAX_FETCH)] = 1
    worker_id: Name | None = None
    visibility_timeout_ms: PositiveMillis | None = None


JobId = Annotated[str, Meta(min_length=1)]


class Ack(Struct, kw_only=True):
    job_id: JobId
    #: The worker acking: when given, the job must be leased to it (else 409).
    worker_id: Name | None = None
    result: Any = None


class NackError(Struct, kw_only=True):
    code: str = "handler_error"
    message: str = ""
    type: str | None = None
    retryable: bool = True
    details: Any = None


class Nack(Struct, kw_only=True):
    job_id: JobId
    #: The worker nacking: when given, the job must be leased to it (else 409).
    worker_id: Name | None = None
    error: NackError | None = None
    requeue: bool = False


class Heartbeat(Struct, kw_only=True):
    worker_id: Name
    state: str | None = None
    #: The graceful-shutdown extension: the worker is draining (as `state: "drain"`).
    shutdown: bool | None = None
    active_jobs: list[str] | Int64 | None = None
    active_job_ids: list[str] | None = None
    visibility_timeout_ms: PositiveMillis | None = None


class Register(Struct, kw_only=True):
    worker_id: Name | None = None
    hostname: str | None = None
    pid: Int64 | None = None
    queues: Annotated[list[QueueName], Meta(min_length=1)] | None = None
    concurrency: Annotated[int, Meta(ge=1, le=limits.MAX_ATTEMPTS)] | None = None
    labels: list[str] | None = None


class Deregister(Struct, kw_only=True):
    worker_id: Name


class WorkerDirective(Struct, kw_only=True):
    state: Literal["running", "quiet", "terminate"]


class Progress(Struct, kw_only=True):
    """`PUT /ojs/v1/jobs/{id}/progress` (progress extension): a fraction, clamped to [0, 1]."""

    progress: Annotated[float, Meta(ge=-1e12, le=1e12)]
    message: Annotated[str, Meta(max_length=limits.MAX_MESSAGE)] | None = None
    #: The worker reporting: when given, the job must be leased to it (else 409).
    worker_id: Annotated[str, Meta(min_length=1, max_length=limits.MAX_NAME)] | None = None


class Backpressure(Struct, kw_only=True):
    """A queue's depth bound (backpressure extension): enqueues beyond it are refused (429)."""

    max_depth: Annotated[int, Meta(ge=1, le=limits.MAX_DEPTH)] | None = None
    strategy: Literal["reject"] = "reject"
    warning_threshold: Annotated[float, Meta(gt=0, le=1)] | None = None


class QueueConfig(Struct, kw_only=True):
    """`PUT /ojs/v1/admin/queues/{name}/config`."""

    backpressure: Backpressure | None = None


class BulkFilter(Struct, kw_only=True):
    state: Literal["discarded"] = "discarded"
    queue: QueueName | None = None
    type: JobType | None = None


class BulkRetry(Struct, kw_only=True):
    """`POST /ojs/v1/admin/jobs/bulk/retry`: dead-lettered jobs back to their queues; the
    operator must confirm."""

    filter: BulkFilter
    confirm: bool = False


#: Every request message, by the name the OpenAPI document gives its schema.
REQUESTS: Final[tuple[type[Struct], ...]] = (
    Envelope,
    Batch,
    Workflow,
    CronRegistration,
    CronToggle,
    Fetch,
    Ack,
    Nack,
    Heartbeat,
    Register,
    Deregister,
    WorkerDirective,
    Progress,
    QueueConfig,
    BulkRetry,
)


# ---------------------------------------------------------------------- decoding


def _dec_hook(kind: type, value: Any) -> Any:
    if kind is Timestamp:
        if not isinstance(value, str):
            raise TypeError("Expected an RFC 3339 timestamp string")
        try:
            return Timestamp(parse_time(value))
        except ValueError as exc:
            raise ValueError(f"Expected an RFC 3339 timestamp with a timezone: {exc}") from None
    if kind is Duration:
        if not isinstance(value, str):
            raise TypeError("Expected an ISO-8601 duration string such as PT30S")
        try:
            return Duration(parse_duration(value))
        except ValueError as exc:
            raise ValueError(f"Expected an ISO-8601 duration: {exc}") from None
    raise NotImplementedError(kind)


_MISSING_FIELD = re.compile(r"^Object missing required field `([^`]+)`$")


def refusal(exc: msgspec.ValidationError, prefix: str = "$") -> OJSError:
    """msgspec's ValidationError as the OJS 400 naming the field (422 in a retry policy)."""
    text = str(exc)
    message, sep, where = text.rpartition(" - at `")
    path = where.rstrip("`") if sep else "$"
    if not sep:
        message = text
    missing = _MISSING_FIELD.match(message)
    if missing:
        path += "." + missing.group(1)
    return refused(message, prefix + path[1:])


def refused(message: str, path: str) -> OJSError:
    """The OJS refusal of the field at `path`: 400, or 422 inside a retry policy (what the
    conformance suite expects of an unacceptable policy)."""
    status = 422 if ".options.retry" in path else 400
    return OJSError(
        "invalid_request", f"{message} - at `{path}`", status=status, details={"field": path}
    )


def convert(value: Any, kind: type[T], prefix: str = "$") -> T:
    """Validate a decoded JSON value as `kind`; raises OJSError naming the field."""
    try:
        return msgspec.convert(value, kind, dec_hook=_dec_hook)
    except msgspec.ValidationError as exc:
        raise refusal(exc, prefix) from None


def schemas(ref_template: str = "#/components/schemas/{name}") -> dict[str, Any]:
    """JSON schemas of the request messages (OpenAPI 3.1 components), from the structs."""
    _, components = msgspec.json.schema_components(
        REQUESTS, schema_hook=_schema_hook, ref_template=ref_template
    )
    return components


def _schema_hook(kind: type) -> dict[str, Any]:
    if kind is Timestamp:
        return {
            "type": "string",
            "format": "date-time",
            "maxLength": limits.MAX_TIME_TEXT,
            "description": "RFC 3339 with a timezone, 1970 to 9999 (or +ISO-8601 duration "
            "from now, e.g. +PT5S)",
        }
    if kind is Duration:
        return {
            "type": "string",
            "pattern": r"^P(\d+(\.\d+)?D)?(T(\d+(\.\d+)?H)?(\d+(\.\d+)?M)?(\d+(\.\d+)?S)?)?$",
            "maxLength": limits.MAX_TIME_TEXT,
            "description": f"ISO-8601 duration, at most P{limits.MAX_DURATION_S // 86400}D",
        }
    raise NotImplementedError(kind)
