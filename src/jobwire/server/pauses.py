"""Pausing a queue, from every place that can (OJS, its admin API, the dashboard).

A paused queue hands out no job to a fetch. On a cluster the pause holds on every node
(`jobwire.store.pgshared`): the node pauses its queue at once and the others when they hear
of it; the reply waits for the database to have it.
"""

from __future__ import annotations

from jobwire.server.runtime import Runtime


async def set_queue_paused(runtime: Runtime, queue: str, paused: bool) -> None:
    """Raises an error of the driver when the database cannot be told (nothing changed on
    the other nodes; this node's queue is paused or resumed all the same)."""
    runtime.engine.queue(queue).paused = paused
    if runtime.cluster is not None:
        await runtime.cluster.set_paused(queue, paused)
