"""A batch push's unique keys on a cluster: checked against the whole cluster, kept in its
index.

Alone, a node's own unique map decides every job of a batch before any is created (all or
nothing). On a cluster the batch first asks the index which of its keys a job on another
node holds (one statement) and decides each as a single push would (`conflicts_with`):
`reject` refuses the whole batch, naming the job, before anything is created; `ignore`
answers that job in the batch's place; `replace` cancels it on its node first. The jobs are
then created with their keys shared, each held until its batch commits, and the reply waits
for that. A key another node took in the moment between the check and the commit (the same
key pushed on two nodes at once) is settled as for a single push: the job is withdrawn; a
`reject` then refuses the batch and cancels the jobs it made (they may have started),
`ignore` answers the holder, `replace` keeps the job with its key on this node only.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from jobwire.engine.job import Job, JobState
from jobwire.protocols.ojs.errors import OJSError
from jobwire.server.ojs.render import job_json
from jobwire.server.ojs.unique import conflicts_with, shares_unique_key
from jobwire.store.sharedkeys import ojs_key

if TYPE_CHECKING:
    from jobwire.ports.cluster import ClusterView
    from jobwire.server.ojs.app import OJSService, Prepared


class BatchKeys:
    """The cluster's side of one batch push (`JobRoutes.push_batch`)."""

    def __init__(self, service: OJSService, cluster: ClusterView, plans: list[Prepared]) -> None:
        self.service = service
        self.cluster = cluster
        self.plans = plans
        #: Jobs of the batch answered by a job on another node (ignore), by index.
        self.answered: dict[int, dict[str, Any]] = {}
        #: Plans whose key stays on this node only (the holder elsewhere does not conflict).
        self.local: set[int] = set()

    async def check(self) -> None:
        """Before any job is created: the keys other nodes' jobs hold, decided per plan."""
        keyed = {
            ojs_key(plan.unique_key): index
            for index, plan in enumerate(self.plans)
            if plan.unique_key is not None
            and plan.policy is not None
            and shares_unique_key(plan.policy)
            and plan.existing is None  # a job here holds it: decided already
        }
        if not keyed:
            return
        holders = await self.cluster.key_holders(list(keyed))
        for key, holder in sorted(holders.items(), key=lambda item: keyed[item[0]]):
            await self._decide(keyed[key], holder, before=True)

    def shares(self, index: int) -> bool:
        """Whether plan `index` is created with its key in the cluster's index."""
        return index not in self.local

    async def settle(self, created: dict[int, Job]) -> dict[int, Job]:
        """Wait until each held job's key is settled; the jobs that stay, by index (a job
        that lost its key to another node's is decided again)."""
        held = {i: job for i, job in created.items() if job.state is JobState.PENDING}
        outcomes = await asyncio.gather(*(self.cluster.settled(job) for job in held.values()))
        kept = dict(created)
        for (index, _job), holder in zip(held.items(), outcomes, strict=True):
            if holder is None:
                continue
            del kept[index]  # withdrawn: the key is another node's job's
            made = await self._decide(index, holder, before=False)
            if made is not None:
                kept[index] = made
        return kept

    async def _decide(self, index: int, holder: str, before: bool) -> Job | None:
        """Plan `index` meets `holder`, a job on another node with its key. Before the batch
        is created, a conflict refuses it, answers the holder, or cancels it; after (a key
        lost in a race), a job that does not conflict or replaces is made with its key on
        this node only."""
        service, plan = self.service, self.plans[index]
        policy = plan.policy
        assert policy is not None
        existing = service.engine.jobs.get(holder) or await self.cluster.find_job(holder)
        if not conflicts_with(policy, existing, service.engine.clock()):
            return self._local(index, before)
        if policy.on_conflict == "reject":
            raise OJSError(
                "duplicate",
                f"jobs[{index}]: a job with the same unique key exists: {holder};"
                " no job of the batch was created"
                if before
                else f"jobs[{index}]: another node took the same unique key meanwhile: {holder};"
                " the batch's other jobs were cancelled",
                details={"index": index, "existing_job_id": holder, "unique_key": plan.unique_key},
            )
        if policy.on_conflict == "ignore":
            self.answered[index] = job_json(existing) if existing is not None else {"id": holder}
            return None
        with contextlib.suppress(OJSError):  # replace; it ended meanwhile: the key is free
            await service.operations.run_by_id("cancel", holder, None, None)
        return None if before else self._local(index, before)

    def _local(self, index: int, before: bool) -> Job | None:
        self.local.add(index)
        if before:
            return None
        job, _ = self.service.commit(self.plans[index], share_unique=False)
        return job
