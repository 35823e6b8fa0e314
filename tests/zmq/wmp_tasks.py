"""Tasks for the WMP worker processes of the tests (`jobwire worker --wmp`). Each run is
logged as a line `TASK MANAGER JOB WORKER` in $WMP_TASK_LOG (appends are atomic)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from jobwire.sdk.worker import Worker

worker = Worker()
NAME = os.environ.get("WMP_WORKER_NAME", "worker")


def note(task: str, job: Any) -> None:
    path = os.environ.get("WMP_TASK_LOG")
    if path:
        line = f"{task} {getattr(job, 'manager', '-')} {job.handle} {NAME}\n".encode()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


@worker.task("echo")
async def echo(job: Any) -> bytes:
    note("echo", job)
    return bytes(job.payload).upper()


@worker.task("whoami")
def whoami(job: Any) -> bytes:  # a thread task
    note("whoami", job)
    return NAME.encode()


@worker.task("progress")
async def progress(job: Any) -> bytes:
    note("progress", job)
    job.send_status(1, 2)
    job.send_data(b"half")
    return b"done"


@worker.task("slow")
async def slow(job: Any) -> bytes:
    note("slow", job)
    await asyncio.sleep(600)
    return b"late"
