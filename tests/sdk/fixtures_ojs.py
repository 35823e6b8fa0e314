"""The OjsWorker the OJS worker tests run, in-process or as `jobwire worker --ojs URL
tests.sdk.fixtures_ojs:worker`; quick test intervals (no outcome depends on them)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from jobwire.sdk.ojs_worker import OjsJob, OjsWorker
from jobwire.sdk.ws_job import Retry

SETTINGS: dict[str, Any] = {
    "concurrency": 2,
    "heartbeat": 0.1,
    "poll_interval": 0.05,
    "reconnect_base": 0.05,
    "reconnect_cap": 0.2,
    "connect_timeout": 5.0,
    "grace_period": 60.0,
}

worker = OjsWorker("http://127.0.0.1:8080", **SETTINGS)


@worker.task("echo")
def echo(job: OjsJob) -> Any:
    """A thread task: the job's args and what the payload rule made of them."""
    return {"args": job.args, "payload": job.text, "attempt": job.attempt}


@worker.task("upper")
async def upper(job: OjsJob) -> str:
    """An async task on the worker's loop."""
    await asyncio.sleep(0)
    return job.text.upper()


@worker.task("reverse")
def reverse(job: OjsJob) -> bytes:
    """Written as for the Gearman Worker: bytes in, bytes out."""
    return job.payload[::-1]


@worker.task("fail")
def fail(job: OjsJob) -> None:
    raise ValueError(f"bad input {job.args!r}")


@worker.task("retry")
async def retry(job: OjsJob) -> None:
    raise Retry(f"try again after attempt {job.attempt}")


@worker.task("stuck", timeout=0.05)
async def stuck(job: OjsJob) -> None:
    await asyncio.Event().wait()


@worker.task("hold")
def hold(job: OjsJob) -> str:
    """args [folder, name]: mark `name.started.PID`, wait for `name.release`, return name."""
    import os

    folder, name = Path(job.args[0]), str(job.args[1])
    (folder / f"{name}.started.{os.getpid()}").touch()
    while not (folder / f"{name}.release").exists():
        time.sleep(0.01)
    return f"held {name}"
