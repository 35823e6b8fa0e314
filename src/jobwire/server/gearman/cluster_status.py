"""Gearman status replies on a cluster node: what the engine does not hold is read from the
shared store (`jobwire.ports.cluster`).

The read takes a round trip, so these replies are sent when it returns: after the replies to
requests that came later on the same connection, if any did. STATUS_RES names its job
handle; an admin `status` line is the only request a gearadmin connection sends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from jobwire.protocols.gearman import admin
from jobwire.protocols.gearman.replies import status_res

if TYPE_CHECKING:
    from jobwire.engine import Engine
    from jobwire.ports.cluster import ClusterView
    from jobwire.server.gearman.handlers import GearmanConnection

log = logging.getLogger("jobwire.cluster")
_tasks: set[asyncio.Task[None]] = set()


def _spawn(work: Coroutine[Any, Any, None]) -> None:
    task = asyncio.get_running_loop().create_task(work)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


def answer_status(conn: GearmanConnection, cluster: ClusterView, handle: bytes) -> None:
    """GET_STATUS of a job this node does not hold: known and running as the store says
    (progress is known only to the node running the job)."""

    async def answer() -> None:
        try:
            job = await cluster.find_job(handle.decode(errors="replace"))
        except Exception as exc:
            log.warning("cluster: status of %r not read: %s", handle, exc)
            job = None
        if job is None or job.state.terminal:
            conn.send(status_res(handle, b"0", b"0", b"0", b"0"))
        else:
            running = b"1" if job.state.name == "ACTIVE" else b"0"
            conn.send(status_res(handle, b"1", running, b"0", b"0"))

    _spawn(answer())


def answer_admin_status(conn: GearmanConnection, cluster: ClusterView, engine: Engine) -> None:
    """`status` for the whole cluster: every node's jobs, this node's workers."""

    async def answer() -> None:
        try:
            elsewhere = await cluster.elsewhere()
        except Exception as exc:
            log.warning("cluster: other nodes' jobs not read: %s", exc)
            elsewhere = {}
        totals: dict[str, tuple[int, int, int]] = {
            fn.name: (fn.total, fn.running, len(fn.workers)) for fn in engine.functions.values()
        }
        for (function, _queue), (jobs, running) in elsewhere.items():
            total, runs, workers = totals.get(function, (0, 0, 0))
            totals[function] = (total + jobs, runs + running, workers)
        conn.send(
            admin.status(
                (name, total, running, workers)
                for name, (total, running, workers) in totals.items()
            )
        )

    _spawn(answer())
