"""`jobwire worker`, `jobwire submit` and `jobwire status`: the SDK on the command line."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import click

from jobwire.sdk import admin
from jobwire.sdk.cli_security import secure, security_options, tls_context
from jobwire.sdk.client import Client
from jobwire.sdk.errors import JobwireError
from jobwire.sdk.tasks import Task
from jobwire.sdk.worker import Worker

if TYPE_CHECKING:
    from jobwire.sdk.ojs_worker import OjsWorker
    from jobwire.sdk.zmq import MdpWorker

# jobwire.sdk.zmq (pyzmq) is imported where it is used: `jobwire submit` starts quicker.

DEFAULT_SERVER = "127.0.0.1:4730"
DEFAULT_MDP_SERVER = "tcp://127.0.0.1:5555"

servers_option = click.option(
    "--server",
    "servers",
    multiple=True,
    metavar="HOST[:PORT]",
    help=(
        f"A Gearman server; repeat for several (default {DEFAULT_SERVER}). With --mdp: the "
        f"Majordomo broker (default {DEFAULT_MDP_SERVER})."
    ),
)
mdp_option = click.option(
    "--mdp", is_flag=True, help="ZeroMQ Majordomo instead of Gearman (--server tcp://HOST:PORT)."
)
version_option = click.option(
    "--version",
    "mdp_version",
    type=click.IntRange(1, 2),
    help="With --mdp: Majordomo 0.1 (1, the default) or 0.2 (2).",
)


def load_object(target: str) -> object:
    """The object at MODULE:ATTR (ATTR may be dotted)."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise click.BadParameter("expected MODULE:ATTR, e.g. myapp.tasks:worker")
    # Like uvicorn and gunicorn: modules in the current directory are importable.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {module_name}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise click.BadParameter(f"{module_name} has no attribute {attr}") from None
    return obj


def load_worker(target: str) -> Worker:
    """The Worker at MODULE:ATTR (ATTR may be dotted)."""
    obj = load_object(target)
    if not isinstance(obj, Worker):
        raise click.BadParameter(f"{target} is a {type(obj).__name__}, not a jobwire Worker")
    return obj


def mdp_endpoint(servers: Sequence[str]) -> str:
    """The one Majordomo broker of --server (tcp:// is added to a bare HOST:PORT)."""
    if len(servers) > 1:
        raise click.BadParameter("a Majordomo client or worker talks to one broker")
    if not servers:
        return DEFAULT_MDP_SERVER
    server = servers[0]
    return server if "://" in server else f"tcp://{server}"


def load_mdp_worker(target: str, version: int | None) -> MdpWorker:
    """The MdpWorker at MODULE:ATTR, or one running the tasks of the Worker there."""
    from jobwire.sdk.zmq import MdpJob, MdpWorker
    from jobwire.sdk.zmq.common import version_of

    obj = load_object(target)
    if isinstance(obj, MdpWorker):
        if version is not None:
            obj.version = version_of(version)
        return obj
    if isinstance(obj, Worker):
        worker = MdpWorker(version=version or 1, grace_period=obj.grace_period)
        for task in obj.tasks.values():  # the task API is the same: jobs have the same surface
            worker.tasks[task.name] = cast(Task[MdpJob], task)
        return worker
    raise click.BadParameter(f"{target} is a {type(obj).__name__}, not a jobwire worker")


def load_ojs_worker(target: str) -> OjsWorker:
    """The OjsWorker at MODULE:ATTR, or one running the tasks of the Worker there."""
    from jobwire.sdk.ojs_worker import OjsJob, OjsWorker

    obj = load_object(target)
    if isinstance(obj, OjsWorker):
        return obj
    if isinstance(obj, Worker):
        worker = OjsWorker(concurrency=obj.concurrency, grace_period=obj.grace_period)
        for task in obj.tasks.values():  # the task API is the same: jobs have the same surface
            worker.tasks[task.name] = cast(Task[OjsJob], task)
        return worker
    raise click.BadParameter(f"{target} is a {type(obj).__name__}, not a jobwire worker")


@click.command("worker")
@click.argument("target", metavar="MODULE:ATTR")
@servers_option
@mdp_option
@version_option
@click.option(
    "--heartbeat",
    type=float,
    help="With --mdp: the broker's heartbeat interval; with --ojs: seconds between heartbeats.",
)
@click.option(
    "-c",
    "--concurrency",
    type=click.IntRange(min=1),
    help="Jobs held at once (with --mdp: requests at once per task).",
)
@click.option("--grace-period", type=float, help="Seconds SIGTERM waits for running jobs.")
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
)
@click.option(
    "--wmp",
    "wmp_managers",
    multiple=True,
    metavar="ENDPOINT",
    help="Serve the tasks over the Worker-Manager Protocol to this manager or device "
    "(tcp://...) instead of Gearman; repeat for several.",
)
@click.option("--role", "roles", multiple=True, help="A WMP role of this worker; repeatable.")
@click.option(
    "--ojs",
    "ojs_url",
    metavar="URL",
    help="Fetch Open Job Spec jobs over HTTP from this server (http://HOST:PORT) instead of "
    "Gearman.",
)
@click.option(
    "--queue",
    "queues",
    multiple=True,
    help="With --ojs: a queue to fetch from, in order; repeatable (default: the task names, "
    "then default).",
)
@security_options
def worker_command(
    target: str,
    servers: Sequence[str],
    mdp: bool,
    mdp_version: int | None,
    heartbeat: float | None,
    concurrency: int | None,
    grace_period: float | None,
    log_level: str,
    wmp_managers: Sequence[str],
    roles: Sequence[str],
    ojs_url: str | None,
    queues: Sequence[str],
    token: str | None,
    tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
) -> None:
    """Run the Worker object found at MODULE:ATTR.

    With --mdp (or when MODULE:ATTR is an MdpWorker) it serves Majordomo requests: an
    MdpWorker as it is, a Gearman Worker's tasks through a new MdpWorker. With --ojs (or when
    MODULE:ATTR is an OjsWorker) it fetches Open Job Spec jobs over HTTP, the same way.

    When MODULE:ATTR is a RotaWorker, it serves Rota jobs over its /work WebSocket.

    --token and --tls-* authenticate to a server run with --auth and TLS (not with --mdp or
    --wmp, whose security is CURVE).

    SIGTERM/SIGINT stop it gracefully, SIGTSTP makes it quiet, SIGCONT resumes it.
    """
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from jobwire.sdk.ojs_worker import OjsWorker
    from jobwire.sdk.ws_worker import RotaWorker
    from jobwire.sdk.zmq import MdpWorker

    tls = tls_context(tls_ca, tls_cert, tls_key)
    if isinstance(load_object(target), RotaWorker):
        if mdp or wmp_managers or ojs_url is not None:
            raise click.UsageError("a RotaWorker serves /work: no --mdp, --wmp or --ojs")
        rota_worker = cast(RotaWorker, load_object(target))
        secure(rota_worker, tls, token)
        if concurrency is not None:
            rota_worker.concurrency = concurrency
        if grace_period is not None:
            rota_worker.grace_period = grace_period
        rota_worker.run()
        return
    if (tls is not None or token is not None) and (mdp or wmp_managers):
        raise click.UsageError("--token and --tls-* are for Gearman, --ojs and Rota workers")
    if ojs_url is not None or isinstance(load_object(target), OjsWorker):
        if mdp or wmp_managers:
            raise click.UsageError("--ojs cannot be combined with --mdp or --wmp")
        ojs_worker = load_ojs_worker(target)
        if ojs_url is not None:
            ojs_worker.url = ojs_url
        if queues:
            ojs_worker.queues = list(queues)
        if concurrency is not None:
            ojs_worker.concurrency = concurrency
        if grace_period is not None:
            ojs_worker.grace_period = grace_period
        if heartbeat is not None:
            ojs_worker.heartbeat = heartbeat
        secure(ojs_worker, tls, token)
        ojs_worker.run()
        return
    if queues:
        raise click.UsageError("--queue is an --ojs option")
    if mdp or isinstance(load_object(target), MdpWorker):
        mdp_worker = load_mdp_worker(target, mdp_version)
        if servers:
            mdp_worker.endpoint = mdp_endpoint(servers)
        if concurrency is not None:
            mdp_worker.concurrency = concurrency
        if grace_period is not None:
            mdp_worker.grace_period = grace_period
        if heartbeat is not None:
            mdp_worker.heartbeat = heartbeat
        mdp_worker.run()
        return
    worker = load_worker(target)
    if wmp_managers:
        from jobwire.sdk.wmp import WmpWorker

        WmpWorker.from_worker(
            worker,
            wmp_managers,
            slots=concurrency or worker.concurrency,
            roles=roles,
            grace_period=grace_period if grace_period is not None else worker.grace_period,
        ).run()
        return
    if servers:
        worker.servers = list(servers)
    if concurrency is not None:
        worker.concurrency = concurrency
    if grace_period is not None:
        worker.grace_period = grace_period
    secure(worker, tls, token)
    worker.run()


@click.command("submit")
@click.argument("function")
@click.argument("data", required=False)
@click.option("-b", "--background", is_flag=True, help="Queue it; print the job handle.")
@click.option(
    "--priority",
    type=click.Choice(["normal", "high", "low"]),
    default="normal",
    show_default=True,
)
@click.option("--unique", help="Unique key: jobs with the same key are coalesced.")
@click.option("--timeout", type=float, help="Seconds to wait for the result.")
@servers_option
@mdp_option
@version_option
@security_options
def submit_command(
    function: str,
    data: str | None,
    background: bool,
    priority: str,
    unique: str | None,
    timeout: float | None,
    servers: Sequence[str],
    mdp: bool,
    mdp_version: int | None,
    token: str | None,
    tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
) -> None:
    """Submit a job to FUNCTION with DATA (standard input when DATA is absent).

    Prints the result's bytes as they are, or the job handle with -b.

    With --mdp, FUNCTION is a Majordomo service and DATA the request's one frame: prints each
    frame of the reply on a line of its own, or with -b stores the request with Titanic and
    prints its uuid. --timeout is then the Lazy Pirate timeout of each of 3 attempts (2.5 s).
    """
    tls = tls_context(tls_ca, tls_cert, tls_key)
    payload = data.encode() if data is not None else sys.stdin.buffer.read()
    if mdp:
        if unique is not None or priority != "normal":
            raise click.UsageError("--unique and --priority are Gearman options")
        if tls is not None or token is not None:
            raise click.UsageError("--token and --tls-* are Gearman options")
        submit_mdp(function, payload, background, timeout, mdp_endpoint(servers), mdp_version)
        return
    try:
        with Client(servers or [DEFAULT_SERVER], tls=tls, token=token) as client:
            if background:
                click.echo(
                    client.submit_background(  # type: ignore[call-overload]
                        function,
                        payload,
                        unique=unique,
                        priority=priority,
                        wait=True,
                    )
                )
            else:
                with progress_bar(function) as on_status:
                    result = client.submit(
                        function,
                        payload,
                        unique=unique,
                        priority=priority,  # type: ignore[arg-type]
                        timeout=timeout,
                        on_status=on_status,
                    )
                sys.stdout.buffer.write(result)
                sys.stdout.buffer.flush()
    except JobwireError as exc:
        raise click.ClickException(str(exc)) from exc


@contextlib.contextmanager
def progress_bar(function: str) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar fed by the job's WORK_STATUS updates while stdout is a terminal (on
    it, before the result); None otherwise, so piped output is the result's bytes alone."""
    if not sys.stdout.isatty():
        yield None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
    ) as progress:
        task = progress.add_task(function, total=None)

        def on_status(numerator: int, denominator: int) -> None:
            progress.update(task, completed=numerator, total=denominator or None)

        yield on_status


def submit_mdp(
    service: str,
    payload: bytes,
    background: bool,
    timeout: float | None,
    endpoint: str,
    version: int | None,
) -> None:
    from jobwire.sdk.zmq import MdpClient, TitanicClient

    try:
        with MdpClient(endpoint, version=version or 1, timeout=timeout or 2.5) as client:
            if background:
                click.echo(TitanicClient(client=client).request(service, payload))
                return
            frames = client.request(service, payload)
    except JobwireError as exc:
        raise click.ClickException(str(exc)) from exc
    out = sys.stdout.buffer
    for frame in frames:
        out.write(frame + b"\n")
    out.flush()


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Plain aligned columns; numbers right-aligned, the last column left ragged."""
    cells = [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in [list(headers), *cells]) for i in range(len(headers))]
    numeric = [all(isinstance(row[i], int) for row in rows) for i in range(len(headers))]
    lines = []
    for row in [list(headers), *cells]:
        parts = [
            cell.rjust(width) if numeric[i] else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


@click.command("status")
@servers_option
@security_options
def status_command(
    servers: Sequence[str],
    token: str | None,
    tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
) -> None:
    """Show each server's queues and workers (admin `status` and `workers`)."""
    tls = tls_context(tls_ca, tls_cert, tls_key)
    failed = False
    for number, server in enumerate(servers or [DEFAULT_SERVER]):
        if number:
            click.echo()
        click.echo(f"== {server}")
        try:
            functions = admin.status(server, tls=tls, token=token)
            connections = [
                row for row in admin.workers(server, tls=tls, token=token) if row.functions
            ]
        except JobwireError as exc:
            click.echo(f"error: {exc}", err=True)
            failed = True
            continue
        click.echo(
            format_table(
                ["FUNCTION", "TOTAL", "RUNNING", "WORKERS"],
                [
                    (row.name, row.total, row.running, row.workers)
                    for row in sorted(functions, key=lambda row: row.name)
                ],
            )
        )
        click.echo()
        click.echo(
            format_table(
                ["FD", "IP", "CLIENT-ID", "FUNCTIONS"],
                [(row.fd, row.ip, row.client_id, " ".join(row.functions)) for row in connections],
            )
        )
    if failed:
        sys.exit(1)


COMMANDS = [worker_command, submit_command, status_command]
