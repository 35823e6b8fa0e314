"""What one redo log frame holds: a batch of job changes, encoded by columns.

The hand-off encodes every batch on the event loop thread, so the encoding is built for
the common case, a plain job (no unique id, attempt limit, run time, reducer or protocol
attributes) among others like it. Consecutive plain jobs that share their function,
queue, priority, state and attempts, with consecutive row keys (the jobs a client just
submitted), form a run that is stored once; what differs per job goes into columns that
one C call each turns into bytes (`struct.pack`, `str.join`, `bytes.join`). The codec
that came before, a row tuple per job that `marshal` then walked object by object, cost
several times as much per job. Other jobs keep a full row tuple. Reading a frame back (at
start and in checkpoints, off the loop) rebuilds the rows SQLite is given.

Body: `marshal` of `(FORMAT, runs, lengths, created, ids, payloads, full, deleted, kv)`,
the number columns little-endian:

- `runs`: `(first row key, jobs, function, queue, priority, state, attempts)` per run
- `lengths` (int64 pairs) per plain job: id length, payload length
- `created` (float64) per plain job: created_at
- `ids`, `payloads`: the plain jobs' ids and payloads, concatenated
- `full`: row key -> full row, for the other jobs
- `deleted` (int64): row keys of removed jobs
- `kv`: key-value changes, (namespace, key) -> value or None

Frames written before this format (`marshal` of `(changes, kv)`) still decode.
"""

from __future__ import annotations

import logging
import marshal
import struct
from typing import Any, Final

from jobwire.engine.job import Job, JobState
from jobwire.store.base import encode_ext

log = logging.getLogger("jobwire.store")

Row = tuple[Any, ...]
#: What a batch changes: job row key -> its row to insert or replace, or None to delete it.
Changes = dict[int, Row | None]
#: Key-value changes of a batch: (namespace, key) -> value, or None to delete it.
KVChanges = dict[tuple[str, str], bytes | None]

FORMAT: Final = 2  # the first element of a columns body; the older body began with a dict
PLAIN_WIDTH: Final = 9  # values in a plain job's row
FULL_WIDTH: Final = 14  # values in a full row
_MARSHAL_VERSION: Final = 4
_LENGTHS, _CREATED, _DELETED = (struct.Struct(f"<{c}") for c in ("qq", "d", "q"))
#: A run's fields (see the module's docstring).
Run = tuple[int, int, str, str, int, int, int]


def is_plain(job: Job) -> bool:
    return (
        job.unique is None
        and job.max_attempts is None
        and job.run_at is None
        and job.reducer is None
        and job.ext is None
    )


def full_row(job: Job) -> Row:
    """The row of a job with every column."""
    return (
        job.row,
        job.id,
        job.function,
        job.queue,
        job.unique,
        job.payload,
        job.priority,
        int(job.state),
        job.attempts,
        job.max_attempts,
        job.run_at,
        job.created_at,
        job.reducer,
        None if job.ext is None else _ext(job),
    )


def _ext(job: Job) -> bytes | None:
    # Encoding runs in a loop callback: raising there would lose the whole batch.
    try:
        return encode_ext(job.ext or {})
    except (TypeError, ValueError) as exc:
        log.error("job %s stored without its protocol attributes: %s", job.id, exc)
        return None


def encode(batch: dict[int, Job | None], kv: KVChanges) -> bytes:
    """The body of a frame: each job's latest state (None: removed) and `kv`."""
    runs: list[Run] = []
    lengths: list[int] = []
    created: list[float] = []
    ids: list[str] = []
    payloads: list[bytes] = []
    full: Changes = {}
    deleted: list[int] = []
    # The run being built: its first key, size, and the fields its jobs share.
    first = count = next_key = priority = attempts = 0
    function = queue = ""
    state = JobState.AVAILABLE
    for key, job in batch.items():
        if job is None:
            deleted.append(key)
            continue
        if not is_plain(job):
            full[key] = full_row(job)
            continue
        if (
            not count
            or key != next_key
            or job.function is not function
            or job.queue is not queue
            or job.priority != priority
            or job.state is not state
            or job.attempts != attempts
        ):
            if count:
                runs.append((first, count, function, queue, priority, int(state), attempts))
            first, count, function, queue = key, 0, job.function, job.queue
            priority, state, attempts = job.priority, job.state, job.attempts
        count += 1
        next_key = key + 1
        job_id, payload = job.id, job.payload
        lengths.append(len(job_id))
        lengths.append(len(payload))
        created.append(job.created_at)
        ids.append(job_id)
        payloads.append(payload)
    if count:
        runs.append((first, count, function, queue, priority, int(state), attempts))
    body = (
        FORMAT,
        runs,
        struct.pack(f"<{len(lengths)}q", *lengths),
        struct.pack(f"<{len(created)}d", *created),
        "".join(ids),
        b"".join(payloads),
        full,
        struct.pack(f"<{len(deleted)}q", *deleted),
        kv,
    )
    return marshal.dumps(body, _MARSHAL_VERSION)


def decode(body: bytes) -> tuple[Changes, KVChanges]:
    """A frame's changes as rows; ValueError (or EOFError, TypeError) if it is not one."""
    value = marshal.loads(body)
    if not isinstance(value, tuple):
        raise ValueError("not a batch of changes")
    if len(value) == 2 and all(isinstance(part, dict) for part in value):
        return value[0], value[1]  # the format before columns
    if len(value) != 9 or value[0] != FORMAT:
        raise ValueError("not a batch of changes")
    _, runs, lengths, created, ids, payloads, full, deleted, kv = value
    changes: Changes = {}
    try:
        per_job = zip(_LENGTHS.iter_unpack(lengths), _CREATED.iter_unpack(created), strict=True)
        id_at = payload_at = 0
        for first, count, function, queue, priority, state, attempts in runs:
            for key in range(first, first + count):
                (id_length, payload_length), (at,) = next(per_job)
                job_id = ids[id_at : id_at + id_length]
                payload = payloads[payload_at : payload_at + payload_length]
                id_at += id_length
                payload_at += payload_length
                row = (key, job_id, function, queue, payload, priority, state, attempts, at)
                changes[key] = row
        if next(per_job, None) is not None:
            raise ValueError("more columns than jobs")
        if id_at != len(ids) or payload_at != len(payloads):
            raise ValueError("column lengths do not add up")
        changes.update(full)
        for (key,) in _DELETED.iter_unpack(deleted):
            changes[key] = None
    except (struct.error, StopIteration) as exc:
        raise ValueError(f"bad columns: {exc!r}") from exc
    return changes, kv
