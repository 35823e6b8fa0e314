"""Majordomo tasks for the SDK tests, run in-process or as `python -m jobwire worker
tests.sdk.fixtures_mdp:worker --server tcp://...` (see fixtures_tasks for the markers)."""

from __future__ import annotations

import asyncio
from typing import Any

from jobwire import JobFailed
from jobwire.sdk.zmq import Frames, MdpJob, MdpWorker
from tests.sdk.fixtures_tasks import POLL, mark_started

# Quick back-off so reconnect tests are quick; the endpoint is overridden with --server.
worker = MdpWorker(heartbeat=1.0, reconnect_base=0.05, reconnect_cap=0.2, grace_period=30.0)


@worker.task("echo")
def echo(job: MdpJob) -> Frames:
    """The request's frames, as they came (a thread task)."""
    return Frames(job.frames)


@worker.task("upper")
async def upper(job: MdpJob) -> bytes:
    return job.payload.upper()


@worker.task("json")
def as_json(job: MdpJob) -> Any:
    return {"got": job.json()}


@worker.task("stream")
async def stream(job: MdpJob) -> str:
    """Three PARTIALs (0.2), then the FINAL."""
    for part in (b"one", "two", {"n": 3}):
        job.send_data(part)
    job.send_status(1, 2)  # no Majordomo message: nothing is sent
    job.send_warning("no MDP message either")
    return "done"


@worker.task("thread_stream")
def thread_stream(job: MdpJob) -> str:
    job.send_data(b"from a thread")
    return "done"


@worker.task("raise")
def raise_(job: MdpJob) -> None:
    raise ValueError(f"bad input: {job.text}")


@worker.task("fail")
async def fail(job: MdpJob) -> None:
    raise JobFailed(job.handle, "refused")


@worker.task("stuck", timeout=0.3)
async def stuck(job: MdpJob) -> None:
    await asyncio.Event().wait()


@worker.task("block")
async def block(job: MdpJob) -> str:
    """Starts (marker file), then waits for its release file."""
    release = mark_started(job)  # type: ignore[arg-type]  # the same surface as Job
    while not release.exists():
        await asyncio.sleep(POLL)
    return f"released {job.json()['id']}"
