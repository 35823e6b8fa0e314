"""What a job's own asyncio Task gave it, kept where the worker runs jobs on long-lived slot
tasks (sdk/slots.py): its own context, its own cancellation, `asyncio.timeout`. One slot
(`concurrency=1`), so consecutive jobs share a slot task where slots are used."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars

import pytest

from jobwire import Client, Job, JobFailed
from tests.sdk.support import fresh_worker, serving, wait_workers
from tests.servers import ServerProcess

seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="unset")


async def remember(job: Job) -> str:
    """Sets a context variable; returns what it held before (another job's value leaked?)."""
    before = seen.get()
    seen.set(job.text)
    await asyncio.sleep(0)  # a second step, also in the job's context
    assert seen.get() == job.text
    return before


async def cancel_self(job: Job) -> bytes:
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    await asyncio.sleep(0)
    return b"not reached"


async def cancel_self_and_finish(job: Job) -> bytes:
    """Cancels its task and returns before the cancellation lands."""
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    return b"finished"


async def own_timeout(job: Job) -> str:
    try:
        async with asyncio.timeout(0.01):
            await asyncio.sleep(60)
    except TimeoutError:
        return "timed out"
    return "slept"


async def instant_timeout(job: Job) -> str:
    """A timeout that expires at once: its cancellation is queued before the job's first
    wait is taken up by whatever carries the job on, and must still reach the job."""
    try:
        async with asyncio.timeout(0):
            await asyncio.sleep(10)
    except TimeoutError:
        return "timed out"
    return "slept"


async def group_failure(job: Job) -> str:
    """A TaskGroup whose child fails: it cancels this job's task, then takes the cancellation
    back, unless the task had cancellations pending from before (a job before this one)."""

    async def fail() -> None:
        raise ValueError("child")

    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(fail())
            await asyncio.sleep(60)
    except ExceptionGroup as failed:
        return f"caught {failed.exceptions[0]}"
    return "not reached"


async def cancelling(job: Job) -> str:
    """The cancellations pending on this job's task: none, as on a fresh Task."""
    task = asyncio.current_task()
    assert task is not None
    return str(task.cancelling())


async def swallow_cancel(job: Job) -> str:
    """Catches its own cancellation and carries on, as some tasks do."""
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    return "carried on"


@pytest.fixture
def one_slot(jobwire: ServerProcess) -> Client:
    worker = fresh_worker([jobwire.address], concurrency=1)
    for name, func in [
        ("remember", remember),
        ("cancel-self", cancel_self),
        ("cancel-self-and-finish", cancel_self_and_finish),
        ("own-timeout", own_timeout),
        ("swallow-cancel", swallow_cancel),
        ("group-failure", group_failure),
        ("instant-timeout", instant_timeout),
        ("cancelling", cancelling),
    ]:
        worker.add_task(name, func)
    with serving(worker):
        wait_workers(jobwire)
        with Client([jobwire.address]) as client:
            yield client


def test_each_job_has_a_context_of_its_own(one_slot: Client) -> None:
    assert [one_slot.submit("remember", str(n)) for n in range(3)] == [b"unset"] * 3


def test_a_job_that_cancels_its_task_fails_alone(one_slot: Client) -> None:
    with pytest.raises(JobFailed):
        one_slot.submit("cancel-self")
    assert one_slot.submit("reverse", b"abc") == b"cba"  # the next job runs as usual
    assert one_slot.submit("cancel-self-and-finish") == b"finished"
    assert one_slot.submit("remember", "x") == b"unset"
    assert one_slot.submit("cancelling") == b"0"
    assert one_slot.submit("swallow-cancel") == b"carried on"
    assert one_slot.submit("cancelling") == b"0"
    assert one_slot.submit("reverse", b"xyz") == b"zyx"


def test_timeouts_and_task_groups_in_jobs_after_a_cancelled_one(one_slot: Client) -> None:
    # Both count on their task's cancellations: a job's must not leak to the next.
    assert [one_slot.submit("own-timeout") for _ in range(3)] == [b"timed out"] * 3
    assert [one_slot.submit("instant-timeout") for _ in range(3)] == [b"timed out"] * 3
    assert one_slot.submit("group-failure") == b"caught child"
    with pytest.raises(JobFailed):
        one_slot.submit("cancel-self")
    assert one_slot.submit("own-timeout") == b"timed out"
    assert one_slot.submit("group-failure") == b"caught child"
    assert one_slot.submit("swallow-cancel") == b"carried on"
    assert one_slot.submit("group-failure") == b"caught child"
