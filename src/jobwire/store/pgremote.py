"""Operations on a job another node of the cluster holds: the node that holds it runs them.

A worker may fetch a job from node B and send its acknowledgement to node A (a load balancer
spreads requests over the nodes). A's engine does not know the job; `RemoteJobs.at_holder`
finds where it is, from its row:

- **held by a live node**: the operation goes to that node as a message on its channel
  (`pg_notify`, or a row of `relay` when too large, as the news of foreground jobs does); the
  holder runs it as if it had come to it (its commit barrier included) and answers the same
  way, on the asking node's channel. The asker waits `ASK_TIMEOUT` seconds at most, then
  looks again: `HolderUnavailable` if the holder still lives (stalled, or cut off), the
  case below if it died meanwhile.
- **no row**: the job finished (a finished job is known only to the node that finished it),
  or never was: every live node is asked, and the one that knows it answers.
- **held by no live node** (in the shared queue, or its node's lease ran out before the
  others' heartbeats reaped it): a node found dead is reaped at once (its row goes, its jobs
  back to the shared queue, as the heartbeat's reaping does); the job's row comes back as a
  copy, or is taken into this node's engine when the caller means to change it (a cancel).

A node is live while its lease runs, as for the heartbeat's reaping: a node killed a moment
ago still holds its jobs until then, and an operation on one of them gets a 503 meanwhile.

The listeners' operations run through the executor they `serve`; the store's own, whatever
the listeners, through `serve_own`: `unique.follow` (`jobwire.store.pgfollow`), which has the
clients of one node hear of the job another node holds under their unique key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any

import psycopg

from jobwire.engine.job import Job
from jobwire.ports import StoredJob
from jobwire.ports.cluster import Executor, HolderAnswer, HolderUnavailable
from jobwire.store.peerlink import PING, SETTLE
from jobwire.store.pgcluster import (
    NOTIFY_MAX,
    NOTIFY_SQL,
    RELAY_SQL,
    Connection,
    detached_job,
    node_channel,
)
from jobwire.store.pgfollow import KeyFollows
from jobwire.store.postgres import _STORED, _reason

if TYPE_CHECKING:
    from jobwire.store.pgcluster import ClusterNode

log = logging.getLogger("jobwire.cluster")

#: Seconds a node waits for the node holding a job to answer an operation on it.
ASK_TIMEOUT = 5.0
#: Looks at where a job is before giving up on one that keeps moving between nodes, and the
#: pause before each look again (doubling): a moving job settles within a commit or two.
LOOKS = 6
LOOK_AGAIN = 0.005

#: Where a job is (job id, this node): its owner, whether that node lives (its lease runs),
#: and its row. Not this node's own rows (its engine is newer than they are). A node's lock is
#: not asked: after PostgreSQL restarted, a live node's lock is free until its next heartbeat.
WHERE_SQL = f"""
SELECT j.owner, COALESCE(n.lease_until >= now(), false),
    {", ".join("j." + column for column in _STORED.split(", "))}
FROM jobs j LEFT JOIN nodes n ON n.id = j.owner
WHERE j.id = %s AND j.owner IS DISTINCT FROM %s
LIMIT 1
"""
#: The other live nodes (this node).
PEERS_SQL = "SELECT id FROM nodes WHERE id <> %s AND lease_until >= now()"
#: A node found dead (its lease ran out) leaves the cluster as the heartbeat's reaping
#: makes it leave: its row goes and its jobs go back to the shared queue, but for the job
#: being taken here, if any, which becomes this node's (a job in the shared queue too). In
#: one statement, the listening nodes notified. Parameters by name: dead (a node id or
#: NULL), job (an id or NULL: take none), node, channel.
REAP_AND_TAKE_SQL = f"""
WITH dead AS (
    DELETE FROM nodes WHERE id = %(dead)s AND lease_until < now() RETURNING id
), requeued AS (
    UPDATE jobs SET owner = NULL
    WHERE owner IN (SELECT id FROM dead) AND id IS DISTINCT FROM %(job)s
    RETURNING function, queue
), taken AS (
    UPDATE jobs SET owner = %(node)s
    WHERE id = %(job)s AND (owner IS NULL OR owner IN (SELECT id FROM dead))
    AND EXISTS (SELECT 1 FROM nodes WHERE id = %(node)s)
    RETURNING {_STORED}, client_node
), names AS (
    SELECT DISTINCT function || chr(31) || queue AS name FROM requeued
    UNION SELECT 'nodes' FROM dead
), notified AS (
    SELECT count(pg_notify(%(channel)s, name)) AS notes FROM names
)
SELECT notified.notes, taken.* FROM notified LEFT JOIN taken ON true
"""


class RemoteJobs:
    """`jobwire.ports.cluster.RemoteJobs` for a node of a PostgreSQL cluster."""

    def __init__(self, cluster: ClusterNode, ask_timeout: float = ASK_TIMEOUT) -> None:
        self.cluster = cluster
        self.node = cluster.node
        self.ask_timeout = ask_timeout
        self._executor: Executor | None = None
        self._own: dict[str, Executor] = {}  # the store's operations, by name
        self._lookups = Connection(cluster.store.dsn)
        self._sends = Connection(cluster.store.dsn)
        self._asks: dict[int, _Ask] = {}
        self._last_ask = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.asked = 0  # operations sent to other nodes
        self.served = 0  # operations run here for other nodes
        cluster.on_message = self._received
        cluster.store.on_abandon.append(self.close)
        #: Clients here of jobs whose unique key another node's job holds.
        self.follows = KeyFollows(cluster, self)
        if cluster.links is not None:  # broken peer links are settled by asking
            cluster.links.remote = self
            self.serve_own(SETTLE, cluster.links.settle)
            self.serve_own(PING, cluster.links.pong)

    def serve(self, executor: Executor) -> None:
        self._executor = executor

    def serve_own(self, operation: str, executor: Executor) -> None:
        """Run `operation` for the other nodes with `executor`, whatever the listeners serve."""
        self._own[operation] = executor

    def close(self) -> None:
        self.follows.close()
        self._lookups.drop()
        self._sends.drop()
        for ask in self._asks.values():
            ask.done.set()

    # ------------------------------------------------------------------ asking

    async def at_holder(
        self, operation: str, job_id: str, arguments: dict[str, Any], *, adopt: bool
    ) -> HolderAnswer | Job | None:
        try:
            return await self._at_holder(operation, job_id, arguments, adopt)
        except (psycopg.Error, OSError, TimeoutError) as exc:
            raise HolderUnavailable(
                f"cannot find where job {job_id} is, the database is unreachable: {_reason(exc)}"
            ) from None

    async def _at_holder(
        self, operation: str, job_id: str, arguments: dict[str, Any], adopt: bool
    ) -> HolderAnswer | Job | None:
        silent: int | None = None  # a holder that did not answer in time
        for look in range(LOOKS):
            if look:
                await asyncio.sleep(LOOK_AGAIN * 2 ** (look - 1))
            rows = await self._lookups.fetch(WHERE_SQL, (job_id, self.node))
            if not rows:
                peers = await self._lookups.fetch(PEERS_SQL, (self.node,))
                nodes = [int(row[0]) for row in peers]
                return await self._ask(nodes, operation, job_id, arguments) if nodes else None
            owner, live, *stored = rows[0]
            if live:
                if owner == silent:  # alive and still silent: stalled, or cut off
                    raise HolderUnavailable(
                        f"the node holding job {job_id} did not answer within {self.ask_timeout:g}s"
                    )
                try:
                    answer = await self._ask([int(owner)], operation, job_id, arguments)
                except HolderUnavailable:
                    silent = int(owner)  # look again: it may have died meanwhile
                    continue
                if answer is not None:
                    return answer
                continue  # it no longer holds the job: it moved, look again
            row = StoredJob(*stored)
            if owner is not None or adopt:  # a dead node's: back to the shared queue first
                took = await self._reap_and_take(owner, job_id if adopt else None)
                if adopt:
                    if took:
                        return None  # this engine holds the job now
                    continue  # another node took it first
            return _as_queued(detached_job(row))
        raise HolderUnavailable(f"job {job_id} kept moving between nodes; try again")

    async def _reap_and_take(self, dead: int | None, job_id: str | None) -> bool:
        """Reap `dead` if it is dead, and take `job_id` into this engine: whether it came."""
        parameters = {
            "dead": dead,
            "job": job_id,
            "node": self.node,
            "channel": self.cluster.store.channel,
        }
        rows = await self._lookups.fetch(REAP_AND_TAKE_SQL, parameters)
        taken = [row[1:] for row in rows if row[1] is not None]
        if taken:
            self.cluster.claimed += self.cluster.load(taken)
        return bool(taken)

    async def from_every_node(
        self, operation: str, key: str, arguments: dict[str, Any]
    ) -> list[HolderAnswer]:
        try:
            peers = await self._lookups.fetch(PEERS_SQL, (self.node,))
        except (psycopg.Error, OSError, TimeoutError) as exc:
            raise HolderUnavailable(f"the database is unreachable: {_reason(exc)}") from None
        nodes = [int(row[0]) for row in peers]
        if not nodes:
            return []
        ask = await self._asked(nodes, operation, key, arguments, every=True)
        if ask.waiting:
            raise HolderUnavailable(
                f"{ask.waiting} node(s) did not answer within {self.ask_timeout:g}s"
            )
        return ask.answers

    async def ask(
        self, nodes: list[int] | None, operation: str, job_id: str, arguments: dict[str, Any]
    ) -> HolderAnswer | None:
        """Ask `nodes` (None: every other live node) to run the operation: the answer of the
        first that knows the job, None when none does. HolderUnavailable when some did not
        answer in time and none knew, or the database is unreachable."""
        try:
            if nodes is None:
                peers = await self._lookups.fetch(PEERS_SQL, (self.node,))
                nodes = [int(row[0]) for row in peers]
            return await self._ask(nodes, operation, job_id, arguments) if nodes else None
        except (psycopg.Error, OSError, TimeoutError) as exc:
            raise HolderUnavailable(f"the database is unreachable: {_reason(exc)}") from None

    async def _ask(
        self, nodes: list[int], operation: str, job_id: str, arguments: dict[str, Any]
    ) -> HolderAnswer | None:
        """Ask `nodes` to run the operation; the answer of the one that knows the job, None
        when none does. HolderUnavailable when some did not answer in time and none knew."""
        ask = await self._asked(nodes, operation, job_id, arguments, every=False)
        if ask.answers:
            return ask.answers[0]
        if ask.waiting:
            raise HolderUnavailable(
                f"the node holding job {job_id} did not answer within {self.ask_timeout:g}s"
            )
        return None

    async def _asked(
        self, nodes: list[int], operation: str, key: str, arguments: dict[str, Any], every: bool
    ) -> _Ask:
        """Send the operation to `nodes` and wait (up to `ask_timeout`) for the first answer,
        or with `every` for all of them."""
        self._last_ask += 1
        number = self._last_ask
        ask = self._asks[number] = _Ask(len(nodes), every)
        self.asked += 1
        message = {"op": operation, "a": number, "n": self.node, "j": key, "x": arguments}
        payload = json.dumps(message, separators=(",", ":"))
        try:
            for node in nodes:
                await self._send(node, payload)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.ask_timeout):
                    await ask.done.wait()
        finally:
            del self._asks[number]
        return ask

    async def _send(self, node: int, payload: str) -> None:
        channel = node_channel(self.cluster.store.channel, node)
        if len(payload.encode()) < NOTIFY_MAX:
            await self._sends.fetch(NOTIFY_SQL, (channel, payload))
        else:
            await self._sends.fetch(RELAY_SQL, (payload, channel))

    # ------------------------------------------------------------------ answering

    def _received(self, message: dict[str, Any]) -> bool:
        """A message on this node's channel: an operation to run, or the answer to one this
        node asked; False: neither (news of a foreground job)."""
        if "op" in message:
            task = asyncio.get_running_loop().create_task(self._run(message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return True
        if "re" in message:
            ask = self._asks.get(message["re"])
            if ask is not None:
                ask.heard(message["r"])
            return True
        return False

    async def _run(self, message: dict[str, Any]) -> None:
        answer: HolderAnswer | None = None
        executor = self._own.get(message["op"], self._executor)
        try:
            if executor is not None:
                answer = await executor(message["op"], message["j"], message["x"])
        except Exception:
            log.exception(
                "cluster: running %s of job %s for another node", message["op"], message["j"]
            )
        self.served += 1
        reply: dict[str, Any] = {"re": message["a"], "r": None}
        if answer is not None:
            reply["r"] = {"s": answer.status, "b": answer.body.decode(), "h": answer.headers}
        try:
            await self._send(int(message["n"]), json.dumps(reply, separators=(",", ":")))
        except Exception as exc:
            log.warning("cluster: could not answer node %s: %s", message["n"], _reason(exc))


class _Ask:
    """An operation sent to some nodes, waiting for the one that knows the job (or, with
    `every`, for each node's answer)."""

    def __init__(self, nodes: int, every: bool) -> None:
        self.waiting = nodes
        self.every = every
        self.answers: list[HolderAnswer] = []
        self.done = asyncio.Event()

    def heard(self, reply: dict[str, Any] | None) -> None:
        self.waiting -= 1
        if reply is not None and (self.every or not self.answers):
            self.answers.append(
                HolderAnswer(int(reply["s"]), reply["b"].encode(), dict(reply["h"]))
            )
        if (self.answers and not self.every) or self.waiting <= 0:
            self.done.set()


def _as_queued(job: Job) -> Job:
    """A row no live node holds: a job that was running is waiting to run again."""
    from jobwire.engine.job import JobState

    if job.state is JobState.ACTIVE:
        job.state = JobState.AVAILABLE
    return job
