"""What the listeners may ask of a cluster: the jobs other nodes hold, read from the store.

A node's engine holds only its own jobs; with a PostgreSQL store shared by several nodes
(`jobwire.store.pgcluster`), the others' jobs and the shared queue are rows in the store.
Status queries that find nothing locally ask this view; None on the runtime: no cluster.
Operations on a job another node holds (an OJS ack, nack, cancel, progress, heartbeat) go
to that node through `RemoteJobs`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from jobwire.engine.cron import CronScheduler
    from jobwire.engine.job import Job

#: (function, queue) -> (jobs, of which running) that this node does not hold.
Counts = dict[tuple[str, str], tuple[int, int]]


class ClusterView(Protocol):
    async def find_job(self, job_id: str) -> Job | None:
        """A copy of the job with this id held by another node or by none (not finished)."""

    def hold_ids(self, ids: list[str]) -> AbstractAsyncContextManager[set[str]]:
        """Hold these job ids, chosen by a client, in the whole cluster until the block
        ends (a push of one of them on any node waits): yields those a job's row has."""

    async def key_holders(self, keys: list[str]) -> dict[str, str]:
        """Of these unique keys (`jobwire.store.sharedkeys.shared_key`), those a job on
        another node holds in the cluster's index: key -> that job's id."""

    async def elsewhere(self) -> Counts:
        """Jobs not held by this node, by function and queue."""

    async def unheld_states(self, queue: str) -> dict[int, int]:
        """Jobs of `queue` that no live node holds (in the shared queue, or a dead node's not
        yet requeued), by state (a `JobState` value)."""

    async def unheld_by_queue(self) -> dict[str, dict[int, int]]:
        """`unheld_states` of every queue that has such jobs: queue -> state -> count."""

    async def gone_records(self, namespace: str) -> dict[int, dict[str, bytes]]:
        """The key-value records of `namespace` kept by nodes that are not alive (gone, or
        their lease ran out: the nodes no operation is sent to), by node."""

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

    def watch_claims(self, hook: Callable[[Job], None]) -> None:
        """Call `hook` with each job this node takes from the shared queue or from another
        node, as it enters the engine (before any worker can get it)."""

    def watch_adopted_records(self, hook: Callable[[str, dict[str, bytes]], None]) -> None:
        """Call `hook(namespace, records)` with the key-value records of a node gone that
        this node took over while it runs (its workflows and dead letters)."""

    def watch_addressed_records(
        self, namespace: str, kept: str, hook: Callable[[dict[str, bytes]], None]
    ) -> None:
        """Call `hook(records)`, now and at each heartbeat, with the shared key-value records
        of `namespace` (written by any node, owner 0) left for a record this node keeps in
        namespace `kept`: a record's key is that record's key, a US, then its own. Records
        for a record no node keeps are dropped. The hook deletes those it has dealt with."""

    def attach_cron(self, cron: CronScheduler) -> None:
        """Share the registrations and fire each tick on one node only."""

    def attach_rate_limits(self, apply: Callable[[str, int | None], None]) -> None:
        """Apply every queue rate limit the cluster shares with `apply(queue, per_second)`
        (None: lifted), now and whenever they change (`jobwire.store.pgrates`)."""

    async def share_rate_limit(self, queue: str, per_second: int) -> None:
        """Limit `queue` on every node (this node applied it already)."""

    async def forget_rate_limits(self) -> None:
        """Lift every shared rate limit (an admin reset)."""

    async def take_rate(self, queue: str, wanted: int) -> int:
        """Up to `wanted` of the cluster's budget for `queue` now: how many jobs of it this
        node may hand out."""

    def give_back_rate(self, queue: str, unused: int) -> None:
        """Budget taken by `take_rate` that was not used."""

    async def take_keyed(
        self, asked: list[tuple[str, str, int | None, int | None, float]]
    ) -> list[bool]:
        """For each keyed job a fetch would hand out (key, job id, the key's concurrency,
        rate, and the rate's period in seconds): whether the key's limits, shared by the
        nodes, let it run now (if so it holds a slot until `release_keyed`)."""

    def release_keyed(self, job_ids: list[str]) -> None:
        """Keyed jobs granted by `take_keyed` that stopped running here."""

    def forget_interest(self) -> None:
        """Forget the fetches and waiting workers this node claims for (an admin reset: the
        workers are forgotten too), so that new jobs go to the shared queue again."""


@dataclass(slots=True)
class HolderAnswer:
    """What the node holding a job answered to an operation on it: an HTTP status, the JSON
    body and the headers of its reply (the asking node answers its client with them)."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


#: Runs an operation on a job this node holds, as asked by another node: (operation, job id,
#: arguments) -> its answer, or None when this node does not know the job.
Executor = Callable[[str, str, dict[str, Any]], Awaitable[HolderAnswer | None]]


class HolderUnavailable(Exception):
    """The node holding a job did not answer in time (it may be stalled or cut off)."""


class RemoteJobs(Protocol):
    """Operations on a job another node of the cluster holds, carried out by that node.

    The listeners call `at_holder` only for a job their engine does not know; None on the
    runtime (memory and SQLite stores, a node alone in no cluster): every job is local."""

    node: int  # this node's id in the cluster

    def serve(self, executor: Executor) -> None:
        """Run the operations other nodes ask of this node's jobs with `executor`."""

    async def at_holder(
        self, operation: str, job_id: str, arguments: dict[str, Any], *, adopt: bool
    ) -> HolderAnswer | Job | None:
        """Have the node holding `job_id` run `operation`: its answer. A job that no live node
        holds (in the shared queue, or its node died) comes back as a copy of its row, or,
        with `adopt`, is taken into this node's engine (answer None: run it here). None also
        when no node knows the job. Raises HolderUnavailable when its holder does not answer
        in time."""

    async def from_every_node(
        self, operation: str, key: str, arguments: dict[str, Any]
    ) -> list[HolderAnswer]:
        """Have every other live node run `operation` on what it holds of `key` (a queue's
        counts, say): their answers. Raises HolderUnavailable when one does not answer in
        time."""
