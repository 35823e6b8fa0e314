"""The Python SDK: Gearman clients and workers for jobwire and gearmand.

`OjsWorker` (an Open Job Spec HTTP worker, `jobwire.sdk.ojs_worker`), `OjsJob` and `Retry`
are imported on first use: they bring in aiohttp.
"""

from typing import TYPE_CHECKING, Any

from jobwire.sdk.client import AsyncClient, Client
from jobwire.sdk.errors import (
    JobException,
    JobFailed,
    JobwireError,
    NotAcknowledged,
    ServerError,
    ServerUnavailable,
    Timeout,
)
from jobwire.sdk.session import Handle, JobStatus, Receipt, Update
from jobwire.sdk.worker import Job, Worker, WorkerState

if TYPE_CHECKING:
    from jobwire.sdk.ojs_worker import OjsJob, OjsWorker
    from jobwire.sdk.ws_job import Retry

_LAZY = {
    "OjsJob": "jobwire.sdk.ojs_worker",
    "OjsWorker": "jobwire.sdk.ojs_worker",
    "Retry": "jobwire.sdk.ws_job",
}

__all__ = [
    "AsyncClient",
    "Client",
    "Handle",
    "Job",
    "JobException",
    "JobFailed",
    "JobStatus",
    "JobwireError",
    "NotAcknowledged",
    "OjsJob",
    "OjsWorker",
    "Receipt",
    "Retry",
    "ServerError",
    "ServerUnavailable",
    "Timeout",
    "Update",
    "Worker",
    "WorkerState",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'jobwire.sdk' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
