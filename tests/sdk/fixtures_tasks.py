"""Tasks for the SDK tests, run in-process or as `python -m jobwire worker
tests.sdk.fixtures_tasks:worker --server ...`.

Tasks that tests must synchronise with take a JSON payload {"dir": ..., "id": ...}: on start
they create `<dir>/<id>.started.<pid>.<n>` (one file per run, so a test can see a job run
again, and by which process), then wait until `<dir>/<id>.release` exists. Waiting is a poll
of the file system; it never decides an outcome, the test does by creating the file.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from pathlib import Path
from typing import Any

from jobwire import Job, JobFailed, Worker

# Small backoff so reconnect tests are quick; servers are overridden with --server.
worker = Worker(
    ["127.0.0.1:4730"],
    concurrency=2,
    grace_period=30.0,
    heartbeat=0.5,
    reconnect_base=0.05,
    reconnect_cap=0.2,
)

_runs = itertools.count()
POLL = 0.01


def mark_started(job: Job) -> Path:
    """Record that this job started here; return its release file."""
    spec = job.json()
    folder = Path(spec["dir"])
    (folder / f"{spec['id']}.started.{os.getpid()}.{next(_runs)}").write_text(job.handle)
    return folder / f"{spec['id']}.release"


@worker.task("echo")
def echo(job: Job) -> bytes:
    return job.payload


@worker.task("reverse")
async def reverse(job: Job) -> bytes:
    return job.payload[::-1]


@worker.task("json")
def as_json(job: Job) -> Any:
    return {"got": job.json()}


@worker.task("text")
async def as_text(job: Job) -> str:
    return job.text.upper()


@worker.task("updates")
async def updates(job: Job) -> str:
    job.send_status(1, 3)
    job.send_data(b"first")
    job.send_warning("careful")
    job.send_status(3, 3)
    return "done"


@worker.task("thread_updates")
def thread_updates(job: Job) -> str:
    job.send_status(1, 2)
    job.send_data("from a thread")
    return "done"


@worker.task("raise")
def raise_(job: Job) -> None:
    raise ValueError(f"bad input: {job.text}")


@worker.task("async_raise")
async def async_raise(job: Job) -> None:
    raise KeyError("missing")


@worker.task("fail")
async def fail(job: Job) -> None:
    raise JobFailed(job.handle)


@worker.task("system_exit")
def system_exit(job: Job) -> None:
    raise SystemExit(3)


@worker.task("bad_return")
async def bad_return(job: Job) -> object:
    return object()


@worker.task("stuck_thread", timeout=0.5)
def stuck_thread(job: Job) -> None:
    threading.Event().wait()  # blocks its thread for good; the worker must not care


@worker.task("stuck_async", timeout=0.5)
async def stuck_async(job: Job) -> None:
    await asyncio.Event().wait()


@worker.task("block")
async def block(job: Job) -> str:
    """Starts (marker file), then waits for its release file."""
    release = mark_started(job)
    while not release.exists():
        await asyncio.sleep(POLL)
    return f"released {job.json()['id']}"


@worker.task("block_thread")
def block_thread(job: Job) -> str:
    release = mark_started(job)
    while not release.exists():
        time.sleep(POLL)
    return f"released {job.json()['id']}"
