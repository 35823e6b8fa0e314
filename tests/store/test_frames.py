"""The redo log's frame codec: what `encode` writes, `decode` reads back as rows."""

from __future__ import annotations

import marshal
from typing import Any

import pytest
from hypothesis import given, settings
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
            )
        else:
            rows[key] = frames.full_row(job)
    return rows


kv_changes = st.dictionaries(st.tuples(few_texts, texts), st.none() | st.binary(max_size=8))


@settings(max_examples=300)
@given(batches(), kv_changes)
def test_decode_reads_back_every_change_encode_wrote(
    batch: dict[int, Job | None], kv: frames.KVChanges
) -> None:
    changes, kv_read = frames.decode(frames.encode(batch, kv))
    assert changes == expected(batch)
    assert kv_read == kv


def test_a_run_of_submitted_jobs_is_stored_once() -> None:
    batch: dict[int, Job | None] = {}
    for key in range(1, 101):
        job = Job(f"H:host:{key}", "reverse", b"payload", created_at=1000.0 + key)
        job.row = key
        batch[key] = job
    body = marshal.loads(frames.encode(batch, {}))
    assert body[1] == [(1, 100, "reverse", "reverse", 0, int(JobState.AVAILABLE), 0)]


def test_frames_of_the_format_before_columns_still_decode() -> None:
    """A server upgraded after a crash replays the log its predecessor left."""
    changes: frames.Changes = {7: (7, "H:x:1", "f", "f", b"p", 0, 0, 0, 1.5), 8: None}
    kv: frames.KVChanges = {("cron", "k"): b"v"}
    assert frames.decode(marshal.dumps((changes, kv), 4)) == (changes, kv)


def valid_body() -> bytes:
    job = Job("H:host:1", "reverse", b"payload", created_at=1.0)
    job.row = 1
    return frames.encode({1: job}, {})


@pytest.mark.parametrize(
    "value",
    [
        "not a tuple",
        (frames.FORMAT, [], b"", b""),  # too short
        (3, [], b"", b"", "", b"", {}, b"", {}),  # a format this code does not know
        # a run of two jobs with the columns of one
        (frames.FORMAT, [(1, 2, "f", "f", 0, 0, 0)], b"\0" * 16, b"\0" * 8, "", b"", {}, b"", {}),
        # lengths past the end of the ids
        (
            frames.FORMAT,
            [(1, 1, "f", "f", 0, 0, 0)],
            b"\5" + b"\0" * 15,
            b"\0" * 8,
            "",
            b"",
            {},
            b"",
            {},
        ),
        # columns for a job no run stands for
        (frames.FORMAT, [], b"\0" * 16, b"\0" * 8, "", b"", {}, b"", {}),
        (frames.FORMAT, [], b"", b"", "", b"", {}, b"\0" * 3, {}),  # a key cut short
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
