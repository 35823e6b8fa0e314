"""The unique-job index: fingerprint -> the job holding it, and until when.

A later PUSH with the same fingerprint conflicts while that job exists in one of the
policy's states and, for a policy with a `period`, the period since its enqueue has not run
out. The index is rebuilt from restored jobs' `ext` after a restart.
"""

from __future__ import annotations

from jobwire.engine.job import Job
from jobwire.engine.jobindex import JobIndex
from jobwire.protocols.ojs.unique import UniquePolicy


def shares_unique_key(policy: UniquePolicy) -> bool:
    """Whether a cluster's unique index keeps this policy's lock: every policy (a replace
    cancels the holder on its node, then takes the key). The index holds a key as long as
    its job lives; a policy with a `period` or fewer states conflicts for less, which
    `conflicts_with` decides once the index names the holder."""
    return policy.on_conflict in ("reject", "ignore", "replace")


def conflicts_with(policy: UniquePolicy, holder: Job | None, now: float) -> bool:
    """Whether a new PUSH with `policy` conflicts with `holder`, the job the cluster's index
    says holds its key (None: it finished meanwhile): as `UniqueIndex.conflict` decides for a
    job on this node, by the holder's state and its lock's `period`."""
    if holder is None or holder.state.name.lower() not in policy.states:
        return False
    until = (holder.ext or {}).get("unique_until")
    return not (isinstance(until, int | float) and now >= until)


class UniqueIndex:
    def __init__(self) -> None:
        self._holders: dict[str, tuple[str, float | None]] = {}  # key -> (job id, until)

    def add(self, key: str, job: Job, until: float | None) -> None:
        self._holders[key] = (job.id, until)

    def conflict(self, key: str, policy: UniquePolicy, now: float, jobs: JobIndex) -> Job | None:
        """The job a new PUSH with `key` would duplicate, or None."""
        held = self._holders.get(key)
        if held is None:
            return None
        job_id, until = held
        job = jobs.get(job_id)
        if job is None or (until is not None and now >= until):
            del self._holders[key]
            return None
        if job.state.name.lower() not in policy.states:
            return None
        return job

    def clear(self) -> None:
        self._holders.clear()
