"""Clients of one node that wait on the job another node holds under their unique key.

A new job with a unique key is held back, when other nodes run, until its batch has settled
the key in the cluster's index (`jobwire.store.pgshared`); a foreground one is always written
to the shared queue, its clients waiting on its node as for any foreground job another node
runs (`ClusterNode.waits`). When another job holds the key, the new job leaves the engine and
its clients join that job, as they would have on one node: their JOB_CREATED names it
(`PostgresStore.coalesced`), and the job stays among those this node's clients wait on, under
the holder's id. `KeyFollows` then arranges for the holder's news to reach them, from its row:

- it names another live node as its clients' (`client_node`: a foreground job offered there,
  or one that other node's clients follow): that node hands this one what it hears of the job
  (the operation `unique.follow`, sent and answered as `jobwire.store.pgremote` sends any);
- otherwise the row is made to name this node (one conditional update), so that any node that
  claims the job later tells this node; and the node that holds it now, if any, subscribes
  this node's channel to it (`unique.follow` again), or answers with its end if it finished
  and still keeps it;
- no row: the holder ended between the conflict and now. Every live node is asked; one that
  still keeps it answers with its end. Otherwise this node runs the job after all: submitted
  again with its key (held and settled as any), its news handed to the clients under the
  holder's id. It may find the key taken again, and follow that job.

A holder that moves meanwhile is looked up again, a few times, then the job is submitted
again: a holder still alive makes it lose its key again, and its clients follow it anew.
"""

from __future__ import annotations

import asyncio
import json
import logging
from enum import Enum
from typing import TYPE_CHECKING, Any

from jobwire.engine.job import Job, JobState
from jobwire.ports.cluster import HolderAnswer, HolderUnavailable
from jobwire.store.pgcluster import Forwarder, RemoteClient, _bytes, _text, node_channel
from jobwire.store.postgres import _reason

if TYPE_CHECKING:
    from jobwire.store.pgcluster import ClusterNode
    from jobwire.store.pgremote import RemoteJobs

log = logging.getLogger("jobwire.cluster")

#: The operation: subscribe the asking node's channel to a job (or to this node's clients'
#: record of it), or answer its end.
FOLLOW = "unique.follow"
#: Looks at where the holder is before running the job here after all, and the pause before
#: each look again (doubling).
LOOKS = 6
LOOK_AGAIN = 0.01

#: Name this node's clients as the job's (node, job id, node), unless another live node's
#: clients wait on it: answers who holds the job now, and whether that node lives. A claim
#: that has the row locked commits first; the update then sees its owner.
NAME_CLIENTS_SQL = """
UPDATE jobs j SET client_node = %s
WHERE j.id = %s AND (j.client_node IS NULL OR j.client_node = %s OR NOT EXISTS (
    SELECT 1 FROM nodes n WHERE n.id = j.client_node AND n.lease_until >= now()
))
RETURNING j.owner,
    COALESCE((SELECT n.lease_until >= now() FROM nodes n WHERE n.id = j.owner), false)
"""
#: The node whose clients wait on a job (job id).
CLIENT_NODE_SQL = "SELECT client_node FROM jobs WHERE id = %s LIMIT 1"


class Look(Enum):
    ARRANGED = 1  # the holder's news will come (or came: its end)
    AGAIN = 2  # it moved, or its node did not answer
    GONE = 3  # it ended, and no node keeps it


class KeyFollows:
    def __init__(self, cluster: ClusterNode, remote: RemoteJobs) -> None:
        self.cluster = cluster
        self.remote = remote
        self.node = cluster.node
        self._arranging: dict[str, asyncio.Task[None]] = {}  # by the holder's id
        remote.serve_own(FOLLOW, self._serve)
        cluster.shared.follow = self.follow

    def close(self) -> None:
        self.cluster.shared.follow = None
        for task in self._arranging.values():
            task.cancel()

    # ------------------------------------------------------------------ following

    def follow(self, job: Job, holder: str) -> None:
        """`job` lost its unique key to `holder`: its clients here wait on that job instead."""
        cluster = self.cluster
        # A job run here in the holder's place (`_run_here`) that found the holder alive after
        # all: whatever arranged its news is void, and it need not forward to itself.
        rerun = _unforward(job, holder)
        job.id = holder  # as its clients' JOB_CREATED named it
        first = cluster.wait_elsewhere(job) if job.subscribers else False
        if (first or rerun) and holder not in self._arranging:
            task = asyncio.get_running_loop().create_task(self._arrange(holder))
            self._arranging[holder] = task

    async def _arrange(self, holder: str) -> None:
        look = Look.AGAIN
        try:
            for attempt in range(LOOKS):
                if attempt:
                    await asyncio.sleep(LOOK_AGAIN * 2 ** (attempt - 1))
                if holder not in self.cluster.waits:
                    return  # its clients heard its end, or none is left
                look = await self._look(holder)
                if look is Look.ARRANGED:
                    log.debug("cluster: clients here follow job %s", holder)
                    return
                if look is Look.GONE:
                    break
        except Exception as exc:
            log.warning("cluster: cannot follow job %s: %s", holder, _reason(exc))
        finally:
            del self._arranging[holder]
        if look is Look.AGAIN:
            log.warning("cluster: job %s could not be followed; running it here", holder)
        self._run_here(holder)

    async def _look(self, holder: str) -> Look:
        fetch = self.cluster.shared_fetch
        me = self.node
        rows = await fetch(NAME_CLIENTS_SQL, (me, holder, me))
        if rows:  # any node that takes the job from now on tells this node
            owner, live = rows[0]
            if owner is None or not live:  # in the shared queue, or a dead node's
                return Look.ARRANGED
            if owner == me:
                return self._here(holder)
            return await self._ask([int(owner)], holder)
        rows = await fetch(CLIENT_NODE_SQL, (holder,))
        if not rows:  # ended: a node may still keep it
            return await self._ask(None, holder)
        client = rows[0][0]
        if client is None or client == me:
            return Look.AGAIN  # it changed meanwhile
        return await self._ask([int(client)], holder)  # that node's clients wait on it too

    def _here(self, holder: str) -> Look:
        job = self.cluster.engine.jobs.get(holder)
        if job is None:
            return Look.AGAIN  # its row is this node's, its engine has yet to take it
        if job.state.terminal:
            self.cluster.tell_finished(holder, job.state, job.result, None)
        elif not any(_forwards_to(s, holder) for s in job.subscribers or ()):
            self.cluster.engine.subscribe(job, Forwarder(self.cluster, holder))
        return Look.ARRANGED

    async def _ask(self, nodes: list[int] | None, holder: str) -> Look:
        """Ask `nodes` (None: every live node) to tell this node of `holder`."""
        try:
            answer = await self.remote.ask(nodes, FOLLOW, holder, {"node": self.node})
        except HolderUnavailable as exc:
            log.info("cluster: following job %s: %s", holder, exc)
            return Look.AGAIN
        if answer is None:
            return Look.AGAIN if nodes is not None else Look.GONE
        ended = json.loads(answer.body)
        if ended:  # it finished there, and that node still keeps it
            self.cluster.tell_finished(holder, JobState(ended["s"]), _bytes(ended["r"]), None)
        return Look.ARRANGED

    def _run_here(self, holder: str) -> None:
        """No node can tell of `holder`: its clients here get a job of this node's instead,
        submitted again with its key (the cluster settles it again)."""
        waiting = self.cluster.waits.get(holder)
        if not waiting:
            return
        model = waiting[0]
        try:
            self.cluster.engine.submit(
                model.function,
                model.payload,
                unique=model.unique,
                priority=model.priority,
                background=False,
                subscriber=Forwarder(self.cluster, holder),
                queue=model.queue,
                reducer=model.reducer,
                origin=model.origin,
            )
        except Exception as exc:
            log.warning("cluster: cannot run job %s here: %s", holder, exc)
            self.cluster.tell_finished(holder, JobState.DISCARDED, None, None)

    # ------------------------------------------------------------------ serving

    async def _serve(
        self, operation: str, job_id: str, arguments: dict[str, Any]
    ) -> HolderAnswer | None:
        """Another node's clients wait on `job_id`: tell that node what happens to it, or
        answer its end; None when this node knows nothing of it."""
        cluster = self.cluster
        job = cluster.engine.jobs.get(job_id)
        if job is not None and job.state.terminal:
            ended = {"s": int(job.state), "r": _text(job.result)}
            return HolderAnswer(200, json.dumps(ended).encode())
        if job is None:  # clients here wait on it: what they hear goes on
            waiting = cluster.waits.get(job_id)
            if not waiting:
                return None
            job = waiting[0]
        node = int(arguments["node"])
        channel = node_channel(cluster.store.channel, node)
        if not any(_tells(s, channel) for s in job.subscribers or ()):
            cluster.engine.subscribe(job, cluster.client_of(node, job_id))
        return HolderAnswer(200, b"{}")


def _tells(subscriber: object, channel: str) -> bool:
    return isinstance(subscriber, RemoteClient) and subscriber.channel == channel


def _forwards_to(subscriber: object, job_id: str) -> bool:
    return isinstance(subscriber, Forwarder) and subscriber.job_id == job_id


def _unforward(job: Job, holder: str) -> bool:
    """Drop the forwarders of `job` to `holder`'s clients: whether it had any."""
    subscribers = job.subscribers or []
    kept = [s for s in subscribers if not _forwards_to(s, holder)]
    if len(kept) == len(subscribers):
        return False
    job.subscribers = kept or None
    return True
