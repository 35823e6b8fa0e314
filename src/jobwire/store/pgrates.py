"""Queue rate limits the nodes of a cluster share: the limit and its budget.

- **The limit.** `queue_rates` holds each limited queue's `per_second`. A node that is told a
  limit (an OJS push with `rate_limit.max_per_second` that changes it) writes the row and
  notifies; every node reads the table again (and on the poll) and applies what it holds.
- **The budget: a token bucket per queue**, in the same row: `tokens` (at most `per_second`)
  refilled at `per_second` a second since `refreshed_at`. A fetch asks for the k jobs it could
  hand out of a limited queue in one `UPDATE ... RETURNING` (not a round trip per job), gets
  g <= k tokens, hands out at most g jobs, and gives back what it did not hand out.
  Cluster-wide, over any T seconds, a queue hands out at most per_second * (T + 1) jobs (a
  full bucket, then the refill), whatever the number of nodes and wherever its workers are;
  each node also keeps its own sliding one-second window (`QueueRateLimits`), so no node
  hands out more than per_second in any one second.
- **Keyed limits** (the rate-limiting extension's `rate_limit.key`): per key, at most
  `concurrency` jobs running at once in the whole cluster (a row per running job in
  `key_slots`, deleted once it stops running here; a dead node's rows do not count) and a
  token bucket of `rate` per `period` in `key_limits`. A fetch takes both for the keyed jobs
  it would hand out in one statement (`take_keyed`, one row lock per key); a job refused
  waits in its queue, as over a node's own limit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from jobwire.store.sharedkeys import RATES_CHANGED

if TYPE_CHECKING:
    from jobwire.store.pgcluster import ClusterNode

log = logging.getLogger("jobwire.cluster")

#: Applies a shared limit to this node's queue (None: lifted).
Apply = Callable[[str, int | None], None]
#: A keyed job a fetch would hand out: its key, its id, the key's concurrency and rate
#: (None: not limited so) and the rate's period in seconds.
KeyedAsk = tuple[str, str, int | None, int | None, float]

SET_SQL = """
WITH limited AS (
    INSERT INTO queue_rates (queue, per_second, tokens) VALUES (%s, %s, %s)
    ON CONFLICT (queue) DO UPDATE SET per_second = EXCLUDED.per_second,
        tokens = LEAST(queue_rates.tokens, EXCLUDED.per_second)
)
SELECT pg_notify(%s, %s)
"""
FORGET_SQL = """
WITH forgotten AS (DELETE FROM queue_rates),
    keys AS (DELETE FROM key_limits),
    slots AS (DELETE FROM key_slots)
SELECT pg_notify(%s, %s)
"""
READ_SQL = "SELECT queue, per_second FROM queue_rates"
#: Tokens in the bucket now: what was left plus the refill since, at most a second's worth.
#: The statement's one timestamp; a statement that waited for another's lock finds a later
#: `refreshed_at` and adds nothing for the time before it.
_AVAILABLE = (
    "LEAST(per_second, tokens + per_second * GREATEST(0, EXTRACT(EPOCH FROM"
    " statement_timestamp() - refreshed_at)))"
)
_GRANT = f"LEAST(%s, floor({_AVAILABLE}))"
TAKE_SQL = f"""
UPDATE queue_rates SET
    tokens = {_AVAILABLE} - {_GRANT},
    granted = {_GRANT},
    refreshed_at = GREATEST(refreshed_at, statement_timestamp())
WHERE queue = %s
RETURNING granted
"""
#: Each keyed job's grant, in order: (key, job id, concurrency, rate, period in seconds).
TAKE_KEYED_SQL = """
SELECT take_keyed(key, job, %s, concurrency, rate, period)
FROM unnest(%s::text[], %s::text[], %s::int[], %s::int[], %s::float8[])
    WITH ORDINALITY AS asked (key, job, concurrency, rate, period, n)
ORDER BY n
"""
RELEASE_KEYED_SQL = "DELETE FROM key_slots WHERE job = ANY(%s::text[])"
GIVE_BACK_SQL = "UPDATE queue_rates SET tokens = LEAST(per_second, tokens + %s) WHERE queue = %s"


class SharedRates:
    def __init__(self, cluster: ClusterNode) -> None:
        self.cluster = cluster
        self._apply: Apply | None = None
        self._known: dict[str, int] = {}  # as last read from the database
        self._giving_back: set[asyncio.Task[None]] = set()

    def attach(self, apply: Apply) -> None:
        self._apply = apply

    def close(self) -> None:
        self._apply = None

    async def share(self, queue: str, per_second: int) -> None:
        """Limit `queue` on every node (this node has already applied it); a new bucket
        starts full."""
        channel = self.cluster.store.channel
        parameters = (queue, per_second, per_second, channel, RATES_CHANGED)
        await self.cluster.shared_fetch(SET_SQL, parameters)
        self._known[queue] = per_second

    async def forget(self) -> None:
        """Lift every shared limit (an admin reset)."""
        await self.cluster.shared_fetch(FORGET_SQL, (self.cluster.store.channel, RATES_CHANGED))
        # `_known` stays: the reading this notification brings lifts them (and any a reading
        # under way meanwhile applied again).

    async def read(self) -> None:
        apply = self._apply
        if apply is None:
            return
        rows = await self.cluster.shared_fetch(READ_SQL, ())
        limits = {str(queue): int(per_second) for queue, per_second in rows}
        for queue, per_second in limits.items():  # again, too: an admin reset forgot them
            apply(queue, per_second)
        for queue in self._known.keys() - limits.keys():
            apply(queue, None)
        self._known = limits

    async def take(self, queue: str, wanted: int) -> int:
        """Up to `wanted` tokens of `queue`'s bucket: how many this node may hand out now. A
        queue with no row (its limit not committed yet) is limited on this node only."""
        try:
            rows = await self.cluster.shared_fetch(TAKE_SQL, (wanted, wanted, queue))
        except Exception as exc:  # no budget known: hand out nothing rather than too much
            log.warning("cluster: taking %s's rate budget failed: %s", queue, exc)
            return 0
        return int(rows[0][0]) if rows else wanted

    def give_back(self, queue: str, unused: int) -> None:
        """Tokens taken but not used (the jobs went meanwhile), off the fetch's path."""
        task = asyncio.get_running_loop().create_task(self._give_back(queue, unused))
        self._giving_back.add(task)
        task.add_done_callback(self._giving_back.discard)

    async def _give_back(self, queue: str, unused: int) -> None:
        try:
            await self.cluster.shared_fetch(GIVE_BACK_SQL, (unused, queue))
        except Exception as exc:
            log.warning("cluster: giving back %s's rate budget failed: %s", queue, exc)

    async def take_keyed(self, asked: list[KeyedAsk]) -> list[bool]:
        """Whether each keyed job may be handed out now, by its key's shared limits; none
        when the statement fails (the limits are kept, not the throughput)."""
        # In the order of their keys: two nodes' fetches lock the keys' rows in one order.
        order = sorted(range(len(asked)), key=lambda index: asked[index][0])
        columns = list(zip(*(asked[index] for index in order), strict=True))
        parameters = (self.cluster.node, *(list(column) for column in columns))
        try:
            rows = await self.cluster.shared_fetch(TAKE_KEYED_SQL, parameters)
        except Exception as exc:
            log.warning("cluster: taking keyed rate limits failed: %s", exc)
            return [False] * len(asked)
        granted = [False] * len(asked)
        for index, row in zip(order, rows, strict=True):
            granted[index] = bool(row[0])
        return granted

    def release_keyed(self, job_ids: list[str]) -> None:
        """Keyed jobs that stopped running here free their slots, off any request's path."""
        task = asyncio.get_running_loop().create_task(self._release_keyed(job_ids))
        self._giving_back.add(task)
        task.add_done_callback(self._giving_back.discard)

    async def _release_keyed(self, job_ids: list[str]) -> None:
        try:
            await self.cluster.shared_fetch(RELEASE_KEYED_SQL, (job_ids,))
        except Exception as exc:  # their node's lease frees them if it dies
            log.warning("cluster: freeing keyed slots failed: %s", exc)
