"""The redo log's frame codec: what `encode` writes, `decode` reads back as rows."""

from __future__ import annotations

import marshal
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobwire.engine.job import Job, JobState
from jobwire.store import frames

# Strings a job may carry: any code point, NUL and lone surrogates included (Gearman
# names decode with surrogateescape).
texts = st.text(st.characters(exclude_categories=()), max_size=12)
few_texts = st.sampled_from(["reverse", "resize", "f", "ünïcode", "a\x00b"])


@st.composite
def jobs(draw: st.DrawFn, key: int) -> Job:
    job = Job(
        draw(texts),
        draw(few_texts),
        draw(st.binary(max_size=40)),
        draw(st.none() | few_texts),
        None,
        draw(st.sampled_from([0, 1, 2, -100, 100, 2**40])),
        True,
        draw(st.floats(allow_nan=False)),
    )
    job.row = key
    job.state = draw(st.sampled_from(list(JobState)))
    job.attempts = draw(st.sampled_from([0, 0, 0, 1, 7, 2**33]))
    job.origin = draw(st.sampled_from([0, 1, 1, 1, 2, 8]))
    if draw(st.integers(0, 4)) == 0:  # now and then, a job with the other columns
        job.unique = draw(st.none() | texts)
        job.max_attempts = draw(st.none() | st.integers(1, 9))
        job.run_at = draw(st.none() | st.floats(allow_nan=False))
        job.reducer = draw(st.none() | texts)
        job.ext = draw(st.none() | st.dictionaries(st.sampled_from(["a", "b"]), st.integers()))
    return job


@st.composite
def batches(draw: st.DrawFn) -> dict[int, Job | None]:
    """Keys mostly consecutive, as submits make them, with gaps and removals."""
    batch: dict[int, Job | None] = {}
    key = draw(st.integers(1, 2**40))
    for _ in range(draw(st.integers(0, 30))):
        key += draw(st.sampled_from([1, 1, 1, 2, 1000]))
        batch[key] = None if draw(st.integers(0, 5)) == 0 else draw(jobs(key))
    return batch


def expected(batch: dict[int, Job | None]) -> frames.Changes:
    """The rows SQLite must get: every column for a job that uses the rare ones."""
    rows: frames.Changes = {}
    for key, job in batch.items():
        if job is None:
            rows[key] = None
        elif frames.is_plain(job):
            rows[key] = (
                key,
                job.id,
                job.function,
                job.queue,
                job.payload,
                job.priority,
                int(job.state),
                job.attempts,
                job.created_at,
                job.origin,
            )
        else:
            rows[key] = frames.full_row(job)
    return rows


def encode(batch: dict[int, Job | None], kv: frames.KVChanges) -> bytes:
    """A frame of these changes (row key -> the job saved for the first time, None: removed)."""
    frame = frames.FrameBuilder()
    for key, job in batch.items():
        if job is None:
            frame.removed(key)
        else:
            frame.created(key, job)
    return frame.finish(kv)


kv_changes = st.dictionaries(st.tuples(few_texts, texts), st.none() | st.binary(max_size=8))


# Generation is slow on a busy machine: the health check would fail the test on load alone.
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(batches(), kv_changes)
def test_decode_reads_back_every_change_encode_wrote(
    batch: dict[int, Job | None], kv: frames.KVChanges
) -> None:
    changes, kv_read = frames.decode(encode(batch, kv))
    assert changes == expected(batch)
    assert kv_read == kv


def engine_job(
    number: int,
    function: str = "reverse",
    prefix: str = "H:host:",
    created_at: float = 1000.0,
    origin: int = 0,
) -> Job:
    """A job as the engine submits it: its id numbered, its row given on first save, created
    at the time of the read that brought it (shared with the other submits of that read)."""
    job = Job(f"{prefix}{number}", function, b"payload %d" % number, created_at=created_at)
    job.origin = origin
    job.number = number
    job.row = number
    return job


# Generation is slow on a busy machine: the health check would fail the test on load alone.
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_latest_record_of_each_job_wins_however_saves_interleave(data: st.DataObject) -> None:
    """New jobs go into columns at once, later changes by key: whatever the order, reading
    the frame back gives each job's state at the end of the batch."""
    frame = frames.FrameBuilder()
    latest: dict[int, Job | None] = {}
    jobs_made: list[Job] = []
    key = 0
    for _ in range(data.draw(st.integers(0, 40))):
        action = data.draw(st.sampled_from(["new", "new", "new", "change", "remove"]))
        if action == "new" or not jobs_made:
            key += data.draw(st.sampled_from([1, 1, 1, 2]))
            if data.draw(st.booleans()):
                job = engine_job(key, data.draw(few_texts))
            else:
                job = data.draw(jobs(key))
            frame.created(key, job)
            jobs_made.append(job)
            latest[key] = job
        else:
            job = data.draw(st.sampled_from(jobs_made))
            if action == "remove":
                frame.removed(job.row)
                latest[job.row] = None
            elif latest[job.row] is not None:  # a removed job is not saved again
                job.state = data.draw(st.sampled_from(list(JobState)))
                job.attempts += data.draw(st.integers(0, 2))
                if data.draw(st.integers(0, 5)) == 0:
                    job.ext = {"a": 1}
                frame.changed(job.row, job)
    # Every change above was saved, so the frame must give each job's state as it is now.
    changes, _ = frames.decode(frame.finish({}))
    assert changes == expected(latest)


def test_a_run_of_submitted_jobs_is_stored_once_without_their_ids() -> None:
    frame = frames.FrameBuilder()
    for number in range(1, 101):
        frame.created(number, engine_job(number))
    body = marshal.loads(frame.finish({}))
    available = int(JobState.AVAILABLE)
    assert body[1] == [(1, 100, "reverse", "reverse", 0, available, 0, 1, "H:host:", 1000.0, 0)]
    assert body[2] == []  # no ids: the run's prefix and first number make them
    changes, _ = frames.decode(marshal.dumps(body, 2))
    row = (57, "H:host:57", "reverse", "reverse", b"payload 57", 0, available, 0, 1000.0, 0)
    assert changes[57] == row


def test_the_submits_of_another_read_start_another_run() -> None:
    frame = frames.FrameBuilder()
    for number in range(1, 5):
        frame.created(number, engine_job(number, created_at=1000.0 if number < 3 else 1000.5))
    body = marshal.loads(frame.finish({}))
    assert [(run[0], run[1], run[9]) for run in body[1]] == [(1, 2, 1000.0), (3, 2, 1000.5)]
    changes, _ = frames.decode(frame.finish({}))
    assert [row[8] for row in changes.values() if row is not None] == [1000.0] * 2 + [1000.5] * 2


def test_ids_the_engine_did_not_number_are_stored_whole() -> None:
    frame = frames.FrameBuilder()
    job = engine_job(7)
    job.number = 0  # a client's id
    frame.created(7, job)
    liar = engine_job(8)
    liar.number = 9  # an id that does not end with its number is stored whole too
    frame.created(8, liar)
    changes, _ = frames.decode(frame.finish({}))
    assert [row[1] for row in changes.values() if row is not None] == ["H:host:7", "H:host:8"]


def test_frames_with_a_created_at_column_still_decode() -> None:
    """Written by the release before: a created_at per job, in a column of its own."""
    body = (
        3,
        [(5, 2, "f", "q", 1, 3, 0, 7, "H:x:"), (9, 1, "g", "g", 0, 0, 1, 0, "")],
        struct.pack("<3d", 1.5, 2.5, 3.5),
        ["client-id"],
        [b"x", b"yz", b"w"],
        {},
        struct.pack("<q", 11),
        {("cron", "k"): b"v"},
    )
    changes, kv = frames.decode(marshal.dumps(body, 2))
    assert changes == {
        5: (5, "H:x:7", "f", "q", b"x", 1, 3, 0, 1.5, 0),
        6: (6, "H:x:8", "f", "q", b"yz", 1, 3, 0, 2.5, 0),
        9: (9, "client-id", "g", "g", b"w", 0, 0, 1, 3.5, 0),
        11: None,
    }
    assert kv == {("cron", "k"): b"v"}


def test_frames_of_the_earlier_column_format_still_decode() -> None:
    """Written by older releases: every id in a column, lengths packed beside."""
    body = (
        2,
        [(5, 2, "f", "q", 1, 3, 0)],
        struct.pack("<4q", 3, 1, 4, 2),
        struct.pack("<2d", 1.5, 2.5),
        "abcdefg",
        b"xyz",
        {9: (9, "id9", "g", "g", None, b"p", 0, 3, 0, 2, None, 3.5, None, None)},
        struct.pack("<q", 11),
        {("cron", "k"): b"v"},
    )
    changes, kv = frames.decode(marshal.dumps(body, 4))
    assert changes == {
        5: (5, "abc", "f", "q", b"x", 1, 3, 0, 1.5, 0),
        6: (6, "defg", "f", "q", b"yz", 1, 3, 0, 2.5, 0),
        9: (9, "id9", "g", "g", None, b"p", 0, 3, 0, 2, None, 3.5, None, None, 0),
        11: None,
    }
    assert kv == {("cron", "k"): b"v"}


def test_frames_of_the_format_before_columns_still_decode() -> None:
    """A server upgraded after a crash replays the log its predecessor left."""
    changes: frames.Changes = {7: (7, "H:x:1", "f", "f", b"p", 0, 0, 0, 1.5), 8: None}
    kv: frames.KVChanges = {("cron", "k"): b"v"}
    widened = {7: (7, "H:x:1", "f", "f", b"p", 0, 0, 0, 1.5, 0), 8: None}  # origin 0: unknown
    assert frames.decode(marshal.dumps((changes, kv), 4)) == (widened, kv)


def test_runs_keep_their_jobs_origin_and_runs_written_before_origins_read_as_unknown() -> None:
    frame = frames.FrameBuilder()
    for number in range(1, 5):
        frame.created(number, engine_job(number, origin=1 if number < 3 else 2))
    body = marshal.loads(frame.finish({}))
    assert [(run[0], run[1], run[10]) for run in body[1]] == [(1, 2, 1), (3, 2, 2)]
    changes, _ = frames.decode(marshal.dumps(body, 2))
    assert [row[9] for row in changes.values() if row is not None] == [1, 1, 2, 2]
    older = (body[0], [run[:10] for run in body[1]], *body[2:])  # as the release before wrote
    changes, _ = frames.decode(marshal.dumps(older, 2))
    assert [row[9] for row in changes.values() if row is not None] == [0, 0, 0, 0]


def valid_body() -> bytes:
    frame = frames.FrameBuilder()
    frame.created(1, engine_job(1))
    client_job = engine_job(2)
    client_job.number = 0
    frame.created(2, client_job)
    return frame.finish({})


RUN = (1, 2, "f", "f", 0, 0, 0, 0, "", 1.5)
NUMBERED_RUN = (1, 2, "f", "f", 0, 0, 0, 1, "H:", 1.5)
TIMED_RUN = RUN[:9]  # format 3: created_at in a column of its own
TIMED_NUMBERED_RUN = NUMBERED_RUN[:9]


@pytest.mark.parametrize(
    "value",
    [
        "not a tuple",
        (frames.FORMAT, [], [], []),  # too short
        (5, [], [], [], {}, b"", {}),  # a format this code does not know
        (frames.FORMAT, [RUN], ["a"], [b"p"], {}, b"", {}),  # a run of two, one job
        (frames.FORMAT, [RUN], ["a"], [b"p", b"q"], {}, b"", {}),  # one id short
        (frames.FORMAT, [NUMBERED_RUN], ["a"], [b"p", b"q"], {}, b"", {}),  # an id over
        (frames.FORMAT, [TIMED_RUN], ["a", "b"], [b"p", b"q"], {}, b"", {}),  # a run's time short
        (frames.FORMAT, [], [], [b"p"], {}, b"", {}),  # a payload no run stands for
        (frames.FORMAT, [], [], [], {}, b"\0" * 3, {}),  # a key cut short
        (3, [TIMED_RUN], b"\0" * 8, ["a"], [b"p"], {}, b"", {}),  # a run of two, one job
        (3, [TIMED_RUN], b"\0" * 16, ["a"], [b"p", b"q"], {}, b"", {}),  # one id short
        (3, [TIMED_NUMBERED_RUN], b"\0" * 16, ["a"], [b"p", b"q"], {}, b"", {}),  # an id over
        (3, [], b"\0" * 8, [], [], {}, b"", {}),  # a time no run stands for
        (3, [TIMED_RUN], b"\0" * 8, ["a", "b"], [b"p", b"q"], {}, b"", {}),  # a time short
        (2, [(1, 2, "f", "f", 0, 0, 0)], b"\0" * 16, b"\0" * 8, "", b"", {}, b"", {}),
        (2, [(1, 1, "f", "f", 0, 0, 0)], b"\5" + b"\0" * 15, b"\0" * 8, "", b"", {}, b"", {}),
    ],
)
def test_a_body_that_is_no_batch_is_refused(value: Any) -> None:
    with pytest.raises(ValueError):
        frames.decode(marshal.dumps(value, 4))


def test_a_cut_body_is_refused() -> None:
    body = valid_body()
    for size in range(len(body)):
        with pytest.raises((ValueError, EOFError, TypeError)):
            frames.decode(body[:size])
