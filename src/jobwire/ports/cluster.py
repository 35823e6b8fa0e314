"""What the listeners may ask of a cluster: the jobs other nodes hold, read from the store.

A node's engine holds only its own jobs; with a PostgreSQL store shared by several nodes
(`jobwire.store.pgcluster`), the others' jobs and the shared queue are rows in the store.
Status queries that find nothing locally ask this view; None on the runtime: no cluster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from jobwire.engine.cron import CronScheduler
    from jobwire.engine.job import Job

#: (function, queue) -> (jobs, of which running) that this node does not hold.
Counts = dict[tuple[str, str], tuple[int, int]]


class ClusterView(Protocol):
    async def find_job(self, job_id: str) -> Job | None:
        """A copy of the job with this id held by another node or by none (not finished)."""

    async def elsewhere(self) -> Counts:
        """Jobs not held by this node, by function and queue."""

    # State the nodes share (`jobwire.store.pgshared`).

    async def set_paused(self, queue: str, paused: bool) -> None:
        """Pause or resume a queue on every node."""

    def wants_hold(self) -> bool:
        """Whether a new job with a unique key must wait for its key to be settled in the
        cluster before it may run (other nodes run)."""

    def hold(self, job: Job) -> bool:
        """Hold a new PENDING job with a unique key until its batch settles the key."""

    async def settled(self, job: Job) -> str | None:
        """For a held job: the id of the job on another node that holds its key, or None."""

    def attach_cron(self, cron: CronScheduler) -> None:
        """Share the registrations and fire each tick on one node only."""
