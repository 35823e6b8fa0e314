"""The admin text protocol's replies, from the engine's and the listener's state.

The bytes of each reply are made by `protocols.gearman.admin`, as gearmand sends them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Final

from jobwire import __version__
from jobwire.engine import Engine, IllegalTransition, JobState, WorkerState
from jobwire.protocols.gearman import admin
from jobwire.protocols.gearman.decoder import AdminCommand

if TYPE_CHECKING:
    from jobwire.server.gearman.handlers import GearmanConnection
    from jobwire.server.gearman.server import GearmanServer

_ACTIVE: Final = JobState.ACTIVE


def _band_counts(fn: Any) -> tuple[int, int, int]:
    high = normal = low = 0
    for lane in fn.lanes.values():
        h, n, lo = lane.count_by_level()
        high, normal, low = high + h, normal + n, low + lo
    return high, normal, low


def admin_reply(server: GearmanServer, command: AdminCommand) -> bytes:
    """The whole reply to one admin line (sent in one write)."""
    engine = server.engine
    args = command.args
    name = command.name
    if name == "status":
        return admin.status(
            (fn.name, fn.total, fn.running, len(fn.workers)) for fn in engine.functions.values()
        )
    if name == "prioritystatus":
        return admin.priority_status(
            (fn.name, *_band_counts(fn), len(fn.workers)) for fn in engine.functions.values()
        )
    if name == "workers":
        return admin.workers(
            (conn.fd, conn.peer_ip, _shown_id(conn), conn.worker.abilities if conn.worker else ())
            for conn in server.connections.values()
        )
    if name == "show" and len(args) > 1:
        what = " ".join(arg.lower() for arg in args[1:])
        if what == "jobs":
            # PERSISTED is 1 for background jobs, as gearmand shows even without a queue store.
            return admin.show_jobs(
                (
                    job.id,
                    max(job.attempts - (job.state is _ACTIVE), 0),
                    0,
                    int(job.background),
                )
                for job in engine.jobs.values()
                if not job.state.terminal
            )
        if what == "unique jobs":
            return admin.show_unique_jobs(
                job.unique or "" for job in engine.jobs.values() if not job.state.terminal
            )
        return admin.UNKNOWN_SHOW
    if name == "cancel" and len(args) >= 3 and args[1].lower() == "job":
        job = engine.jobs.get(args[2])
        if job is None or job.state.terminal:
            return admin.UNKNOWN_JOB
        engine.cancel(job)
        return admin.OK
    if name in ("create", "drop") and len(args) == 2 and args[1].lower() == "function":
        return admin.incomplete(args[0])  # gearmand echoes the word as typed
    if name == "create" and len(args) >= 3 and args[1].lower() == "function":
        engine.function(args[2])
        return admin.OK
    if name == "drop" and len(args) >= 3 and args[1].lower() == "function":
        try:
            engine.drop_function(args[2])
        except KeyError:
            return admin.DROP_UNKNOWN
        except IllegalTransition:
            return admin.DROP_BUSY
        return admin.OK
    if name == "maxqueue":
        return _maxqueue(engine, args)
    if name == "shutdown":
        # As gearmand: `shutdown` stops now; `shutdown graceful` stops accepting, lets the
        # running jobs finish, then stops. The OK goes out before the server closes.
        graceful = len(args) > 1 and args[1].lower() == "graceful"
        server.runtime.request_shutdown(graceful)
        return admin.OK
    if name == "getpid":
        return admin.ok_value(str(os.getpid()))
    if name == "verbose":
        return admin.ok_value(server.options.verbose)
    if name == "version":
        return admin.ok_value(__version__)
    return admin.unknown_command(args[0] if args else "")


def _maxqueue(engine: Engine, args: list[str]) -> bytes:
    if len(args) < 2:
        return admin.incomplete("maxqueue")
    values: list[int] = []
    for raw in args[2:5]:
        try:
            values.append(int(raw))
        except ValueError:
            values.append(0)
    if not values:
        high = normal = low = 0
    elif len(values) < 3:
        high = normal = low = values[0]
    else:
        high, normal, low = values
    engine.set_queue_limits(args[1], high, normal, low)
    return admin.OK_MAXQUEUE


def _shown_id(conn: GearmanConnection) -> str:
    """The client id, and the worker's state after it when an operator quieted or is
    terminating it (`CLIENT-ID[quiet]`): the line keeps gearmand's shape otherwise."""
    worker = conn.worker
    if worker is None or worker.state is WorkerState.RUNNING:
        return str(conn.client_id)
    return f"{conn.client_id}[{worker.state.value}]"
