"""The Python SDK: Gearman clients and workers for jobwire and gearmand."""

from jobwire.sdk.client import AsyncClient, Client
from jobwire.sdk.errors import (
    JobException,
    JobFailed,
    JobwireError,
    ServerError,
    ServerUnavailable,
    Timeout,
)
from jobwire.sdk.session import Handle, JobStatus, Update
from jobwire.sdk.worker import Job, Worker, WorkerState

__all__ = [
    "AsyncClient",
    "Client",
    "Handle",
    "Job",
    "JobException",
    "JobFailed",
    "JobStatus",
    "JobwireError",
    "ServerError",
    "ServerUnavailable",
    "Timeout",
    "Update",
    "Worker",
    "WorkerState",
]
