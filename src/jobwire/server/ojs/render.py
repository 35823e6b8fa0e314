"""Engine jobs as OJS JSON objects, and the one payload mapping rule between protocols.

Mapping rule (documented in the README): the OJS `type` is the engine function (the Gearman
function name). A job pushed over OJS carries `payload = JSON encoding of args`; a job submitted
by another protocol (Gearman) appears to OJS with `args = [payload decoded as UTF-8]`.
Results go the same way: an OJS ack stores the JSON encoding of `result` as the result bytes,
and a result from another protocol appears as a JSON string.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from jobwire.engine.job import Job, JobState
from jobwire.protocols.ojs.envelope import SPEC_VERSION
from jobwire.protocols.ojs.times import format_time

DEFAULT_MAX_ATTEMPTS: Final = 3
_NO_EXT: Final[dict[str, Any]] = {}
# Enum members as constants: a member lookup is a Python attribute read (mypyc too).
_SCHEDULED: Final = JobState.SCHEDULED
_RETRYABLE: Final = JobState.RETRYABLE
_COMPLETED: Final = JobState.COMPLETED
_DISCARDED: Final = JobState.DISCARDED
_CANCELLED: Final = JobState.CANCELLED


def payload_for(args: list[Any]) -> bytes:
    # Typed here: mypyc's build environment lacks orjson, whose calls are Any there.
    payload: bytes = orjson.dumps(args)
    return payload


def args_of(job: Job) -> list[Any]:
    ext = job.ext
    if ext is not None and "args" in ext:
        args: list[Any] = ext["args"]
        return args
    return [job.payload.decode("utf-8", "replace")]


def result_of(job: Job) -> Any:
    ext = job.ext
    if ext is not None and "result" in ext:
        return ext["result"]
    if job.result is None:
        return None
    return job.result.decode("utf-8", "replace")


def error_of(job: Job) -> dict[str, Any] | None:
    error = job.error
    if error is None:
        return None
    if isinstance(error, dict):
        return error
    if isinstance(error, bytes):
        error = error.decode("utf-8", "replace")
    text = str(error)
    kind = _ERROR_KINDS.get(text, "error")
    return {"type": kind, "code": kind, "message": text or kind}


_ERROR_KINDS = {
    "lease expired": "visibility_timeout",
    "worker lost": "worker_death",
    "expired": "expired",
    "worker deregistered": "worker_deregistered",
}


#: Each state's OJS name (an enum's `name` is a Python-level property: slow per reply).
_STATE_NAMES: Final = {state: state.name.lower() for state in JobState}


def state_name(state: JobState) -> str:
    return _STATE_NAMES[state]


def job_json(job: Job) -> dict[str, Any]:
    """The job as OJS shows it (GET /ojs/v1/jobs/:id and every reply that embeds a job)."""
    ext = job.ext or _NO_EXT
    state = job.state
    created_at = format_time(job.created_at)
    enqueued = ext.get("enqueued_at", job.created_at)
    out: dict[str, Any] = {
        "specversion": SPEC_VERSION,
        "id": job.id,
        "type": job.function,
        "queue": job.queue,
        "args": args_of(job),
        "state": _STATE_NAMES[state],
        "priority": job.priority,
        "attempt": job.attempts,
        "max_attempts": (
            job.max_attempts if job.max_attempts is not None else DEFAULT_MAX_ATTEMPTS
        ),
        "created_at": created_at,
        # A job pushed over OJS is enqueued when it is created: the same text.
        "enqueued_at": created_at if enqueued == job.created_at else format_time(enqueued),
    }
    extra = ext.get("extra")
    if extra:  # unknown attributes of the push come first; the known ones win
        out = {**extra, **out}
    if ext.get("meta") is not None:
        out["meta"] = ext["meta"]
    if ext.get("tags") is not None:
        out["tags"] = ext["tags"]
    if ext.get("timeout") is not None:
        out["timeout_ms"] = int(ext["timeout"] * 1000)
    if job.run_at is not None and state in (_SCHEDULED, _RETRYABLE):
        out["scheduled_at"] = format_time(job.run_at)
    if state is _RETRYABLE and job.run_at is not None:
        out["next_attempt_at"] = format_time(job.run_at)
    if ext.get("expires_at") is not None:
        out["expires_at"] = ext.get("expires_at_text") or format_time(ext["expires_at"])
    if ext.get("parent_results") is not None:
        out["parent_results"] = ext["parent_results"]
    workflow = ext.get("workflow")
    if isinstance(workflow, dict):
        out["workflow_id"] = workflow.get("id")
    if ext.get("retry_delay") is not None:
        out["retry_delay_ms"] = int(ext["retry_delay"] * 1000)
    if job.started_at is not None and job.attempts:
        out["started_at"] = format_time(job.started_at)
    finished = job.finished_at
    if finished is not None:
        # A discarded job that never ran (expired) was not completed in any sense.
        if state is _COMPLETED or (state is _DISCARDED and job.attempts):
            out["completed_at"] = format_time(finished)
        if state is _DISCARDED:
            out["discarded_at"] = format_time(finished)
        if state is _CANCELLED:
            out["cancelled_at"] = format_time(finished)
    if state is not _COMPLETED:
        error = error_of(job)
        if error is not None:
            out["error"] = error
    if ext.get("errors"):
        out["errors"] = ext["errors"]
    if state is _COMPLETED:
        result = result_of(job)
        if result is not None:
            out["result"] = result
    if job.progress is not None:  # Gearman WORK_STATUS, Rota progress
        out["progress"] = progress_of(job.progress)
    return out


def progress_of(progress: tuple[int, int]) -> dict[str, Any]:
    current, total = progress
    return {"current": current, "total": total}
