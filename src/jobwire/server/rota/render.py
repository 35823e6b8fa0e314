"""Engine jobs as Rota job copies (the `job` of an assignment).

A copy carries both views of the job's input, so a worker can use either: `args`, the OJS view
(an OJS job's args; `[payload as UTF-8]` for a job from another protocol), and the payload
bytes (`payload` when they are UTF-8, else `payload_base64`), which is what a Gearman worker
would get (an OJS job's payload is the JSON of its args). See README, "One mapping rule".
"""

from __future__ import annotations

from jobwire.engine.job import Job
from jobwire.protocols.ojs.times import format_time
from jobwire.protocols.rota import JobCopy
from jobwire.server.ojs.render import args_of


def job_copy(job: Job) -> JobCopy:
    ext = job.ext or {}
    return JobCopy(
        id=job.id,
        spec=job.function,
        queue=job.queue,
        payload=job.payload,
        args=args_of(job),
        priority=job.priority,
        attempt=job.attempts,
        max_attempts=job.max_attempts,
        created_at=format_time(job.created_at),
        meta=ext.get("meta"),
    )


def wants_logs(job: Job, every_job: bool) -> bool:
    """Logs are asked for when the server says so for every job, or the job's OJS
    `meta.logs` is true."""
    if every_job:
        return True
    meta = (job.ext or {}).get("meta")
    return isinstance(meta, dict) and meta.get("logs") is True
