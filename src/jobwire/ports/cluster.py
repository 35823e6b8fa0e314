"""What the listeners may ask of a cluster: the jobs other nodes hold, read from the store.

A node's engine holds only its own jobs; with a PostgreSQL store shared by several nodes
(`jobwire.store.pgcluster`), the others' jobs and the shared queue are rows in the store.
Status queries that find nothing locally ask this view; None on the runtime: no cluster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from jobwire.engine.job import Job

#: (function, queue) -> (jobs, of which running) that this node does not hold.
Counts = dict[tuple[str, str], tuple[int, int]]


class ClusterView(Protocol):
    async def find_job(self, job_id: str) -> Job | None:
        """A copy of the job with this id held by another node or by none (not finished)."""

    async def elsewhere(self) -> Counts:
        """Jobs not held by this node, by function and queue."""
