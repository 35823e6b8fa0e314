"""Lease ownership over HTTP: an ack, nack or progress report that names its worker is
accepted only from the worker holding the job's lease (the engine's `held_job` check)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobwire.engine.errors import JobNotHeld
from jobwire.engine.job import Job, JobState
from jobwire.protocols.ojs.errors import OJSError

if TYPE_CHECKING:
    from jobwire.server.ojs.app import OJSService


def check_holder(service: OJSService, job: Job, worker_id: str) -> None:
    """Raise 409 `conflict` unless `job` is leased to the worker `worker_id` (the engine's
    ownership check); the reply names the job's state, not its holder."""
    session = service.workers.get(worker_id)
    if session is None:
        holder = "leased to another worker" if job.state is JobState.ACTIVE else None
        raise OJSError(
            "conflict",
            f"job {job.id} is {holder or job.state.name.lower()}, not held by worker {worker_id}",
            status=409,
        )
    try:
        service.engine.held_job(session, job.id)
    except JobNotHeld as exc:
        raise OJSError(
            "conflict",
            f"job {job.id} is {exc.holder}, not held by worker {worker_id}",
            status=409,
        ) from None
