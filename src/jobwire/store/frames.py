"""What one redo log frame holds: a batch of job changes, encoded by columns.

The store builds each batch's frame on the event loop thread, as the engine tells it of
changes, so the encoding is built for the common case, a plain job (no unique id, attempt
limit, run time, reducer or protocol attributes) among others like it. A new job is added
to the frame's columns when it is saved (`FrameBuilder.created`), while the loop has it at
hand; consecutive plain jobs that share their function, queue, priority, state, attempts
and creation time (the submits of one read share it: `Engine.enqueue`), with consecutive
row keys (the jobs a client just submitted), form a run that is stored once. When the
engine numbered their ids (`PREFIX:N`) with consecutive numbers, the run stores the prefix
and the first number instead of the ids. Later changes of jobs are kept by key and encoded
when the frame is finished, after the new jobs, so the latest record of a job wins when
the frame is read back (at start and in checkpoints, off the loop), which rebuilds the rows
SQLite is given.

Body: `marshal` (version 2, which keeps no table of shared objects, the cost of the
version 4 encoding when every payload is also referenced by its job) of
`(FORMAT, runs, ids, payloads, full, deleted, kv)`:

- `runs`: `(first row key, jobs, function, queue, priority, state, attempts, first
  number, id prefix, created_at, origin)` per run; first number 0: the ids are in `ids`
  (runs written before jobs kept their origin have no origin: 0)
- `ids`: the ids of the jobs of runs without numbers
- `payloads`: per job of the runs
- `full`: row key -> full row, for the other jobs
- `deleted` (int64, little-endian): row keys of removed jobs
- `kv`: key-value changes, (namespace, key) -> value or None

Rows are `PLAIN_WIDTH` or `FULL_WIDTH` wide, the job's origin last; a full row of a
frame written before origins were kept is widened with origin 0 when it is read. Frames of
the three formats before this one (a created_at column beside the runs; columns
with ids; and `marshal` of `(changes, kv)`) still decode.
"""

from __future__ import annotations

import logging
import marshal
import struct
from collections.abc import Iterator
from typing import Any, Final

from jobwire.engine.job import Job, JobState
from jobwire.ports import encode_ext

log = logging.getLogger("jobwire.store")

Row = tuple[Any, ...]
#: What a batch changes: job row key -> its row to insert or replace, or None to delete it.
Changes = dict[int, Row | None]
#: Key-value changes of a batch: (namespace, key) -> value, or None to delete it.
KVChanges = dict[tuple[str, str], bytes | None]

FORMAT: Final = 4  # the first element of a body; the oldest body began with a dict
_FORMAT_TIMES: Final = 3  # a created_at column beside the runs (decoded, no longer written)
_FORMAT_IDS: Final = 2  # columns with every id (decoded, no longer written)
PLAIN_WIDTH: Final = 10  # values in a plain job's row
FULL_WIDTH: Final = 15  # values in a full row
_OLD_FULL_WIDTH: Final = 14  # a full row before origins were kept
_MARSHAL_VERSION: Final = 2
_LENGTHS, _CREATED, _DELETED = (struct.Struct(f"<{c}") for c in ("qq", "d", "q"))
#: A run's fields (see the module's docstring).
Run = tuple[int, int, str, str, int, int, int, int, str, float, int]


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
        job.origin,
    )


def _ext(job: Job) -> bytes | None:
    # Encoding runs in a loop callback: raising there would lose the whole batch.
    try:
        return encode_ext(job.ext or {})
    except (TypeError, ValueError, RecursionError) as exc:
        log.error("job %s stored without its protocol attributes: %s", job.id, exc)
        return None


def _prefix(job_id: str, number: int) -> str | None:
    """The id's part before its number, or None if the id does not end with `number`."""
    digits = str(number)
    return job_id[: -len(digits)] if job_id.endswith(digits) else None


class FrameBuilder:
    """One batch's frame, built as the store is told of its changes; `finish` encodes it.

    The engine numbers every id it makes from one prefix (`Engine.next_id`; replayed
    jobs keep a number only when their id has that prefix), so a run of jobs with
    consecutive numbers needs only the first job's id.
    """

    def __init__(self) -> None:
        self.runs: list[Run] = []
        self.ids: list[str] = []
        self.payloads: list[bytes] = []
        #: Jobs changed after they were first saved, and jobs that are not plain, by row
        #: key (None: removed), encoded with their latest state by `finish`.
        self.changes: dict[int, Job | None] = {}
        # The run being built: its first key, size and first number (0: ids in `ids`), and
        # what its jobs share.
        self._first = self._count = self._first_number = 0
        self._function = self._queue = self._prefix = ""
        self._priority = self._attempts = self._origin = 0
        self._state = JobState.AVAILABLE
        self._created_at = 0.0

    @property
    def empty(self) -> bool:
        return not (self._count or self.runs or self.changes)

    def created(self, key: int, job: Job) -> None:
        """A new job, saved for the first time under row key `key`."""
        if is_plain(job):
            self._add(key, job)
        else:
            self.changes[key] = job

    def changed(self, key: int, job: Job) -> None:
        self.changes[key] = job

    def removed(self, key: int) -> None:
        self.changes[key] = None

    def _add(self, key: int, job: Job) -> None:
        """Add a plain job to the current run, or start a run with it."""
        number = job.number
        count = self._count
        if (
            not count
            or key != self._first + count
            or number != (self._first_number + count if self._first_number else 0)
            or job.function is not self._function
            or job.queue is not self._queue
            or job.priority != self._priority
            or job.state is not self._state
            or job.attempts != self._attempts
            or job.created_at != self._created_at
            or job.origin != self._origin
        ):
            self._end_run()
            prefix = _prefix(job.id, number) if number else None
            if prefix is None:
                number = 0  # its id goes into `ids`, as a client's would
            self._first, self._first_number, self._prefix = key, number, prefix or ""
            self._function, self._queue = job.function, job.queue
            self._priority, self._state, self._attempts = job.priority, job.state, job.attempts
            self._created_at = job.created_at
            self._origin = job.origin
        self._count += 1
        if not number:
            self.ids.append(job.id)
        self.payloads.append(job.payload)

    def _end_run(self) -> None:
        if self._count:
            self.runs.append(
                (
                    self._first,
                    self._count,
                    self._function,
                    self._queue,
                    self._priority,
                    int(self._state),
                    self._attempts,
                    self._first_number,
                    self._prefix,
                    self._created_at,
                    self._origin,
                )
            )
            self._count = 0

    def finish(self, kv: KVChanges) -> bytes:
        """The frame's body: every job's latest state (None: removed) and `kv`."""
        full: Changes = {}
        deleted: list[int] = []
        for key, job in self.changes.items():
            if job is None:
                deleted.append(key)
            elif is_plain(job):
                self._add(key, job)
            else:
                full[key] = full_row(job)
        self._end_run()
        body = (
            FORMAT,
            self.runs,
            self.ids,
            self.payloads,
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
        return _widened(value[0]), value[1]  # the format before columns
    if len(value) == 9 and value[0] == _FORMAT_IDS:
        return _decode_with_ids(value)
    times: Iterator[tuple[float]] | None = None  # per job (format 3); None: per run
    if len(value) == 8 and value[0] == _FORMAT_TIMES:
        _, runs, created, ids, payloads, full, deleted, kv = value
        times = _CREATED.iter_unpack(created)
    elif len(value) == 7 and value[0] == FORMAT:
        _, runs, ids, payloads, full, deleted, kv = value
    else:
        raise ValueError("not a batch of changes")
    try:
        changes = _rows_of_runs(runs, ids, payloads, times)
        if times is not None and next(times, None) is not None:
            raise ValueError("more times than jobs")
        _add_full_and_deleted(changes, full, deleted)
    except (struct.error, StopIteration, IndexError) as exc:
        raise ValueError(f"bad columns: {exc!r}") from exc
    return changes, kv


def _rows_of_runs(
    runs: list[Any], ids: list[str], payloads: list[bytes], times: Iterator[tuple[float]] | None
) -> Changes:
    """The rows of the runs' jobs; their created_at from the runs, or from `times`."""
    changes: Changes = {}
    job_at = id_at = 0
    for run in runs:
        first, count, function, queue, priority, state, attempts, number, prefix = run[:9]
        at = run[9] if times is None else 0.0
        origin = run[10] if len(run) > 10 else 0
        for offset in range(count):
            key = first + offset
            if number:
                job_id = f"{prefix}{number + offset}"
            else:
                job_id = ids[id_at]
                id_at += 1
            if times is not None:
                (at,) = next(times)
            payload = payloads[job_at]
            job_at += 1
            row = (key, job_id, function, queue, payload, priority, state, attempts, at, origin)
            changes[key] = row
    if job_at != len(payloads) or id_at != len(ids):
        raise ValueError("columns do not match the runs")
    return changes


def _decode_with_ids(value: tuple[Any, ...]) -> tuple[Changes, KVChanges]:
    """A frame of the format before this one: every job's id in a column."""
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
                row = (key, job_id, function, queue, payload, priority, state, attempts, at, 0)
                changes[key] = row
        if next(per_job, None) is not None:
            raise ValueError("more columns than jobs")
        if id_at != len(ids) or payload_at != len(payloads):
            raise ValueError("column lengths do not add up")
        _add_full_and_deleted(changes, full, deleted)
    except (struct.error, StopIteration) as exc:
        raise ValueError(f"bad columns: {exc!r}") from exc
    return changes, kv


def _add_full_and_deleted(changes: Changes, full: Changes, deleted: bytes) -> None:
    """After the runs' rows: the full rows, then the removals, which come last."""
    changes.update(_widened(full))
    for (key,) in _DELETED.iter_unpack(deleted):
        changes[key] = None


def _widened(rows: Changes) -> Changes:
    """Rows of a frame written before origins were kept, with origin 0 (unknown) added."""
    for key, row in rows.items():
        if row is not None and len(row) in (PLAIN_WIDTH - 1, _OLD_FULL_WIDTH):
            rows[key] = (*row, 0)
    return rows
