"""`jobwire worker`, `jobwire submit` and `jobwire status`: the SDK on the command line."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Sequence

import click

from jobwire.sdk import admin
from jobwire.sdk.client import Client
from jobwire.sdk.errors import JobwireError
from jobwire.sdk.worker import Worker

DEFAULT_SERVER = "127.0.0.1:4730"

servers_option = click.option(
    "--server",
    "servers",
    multiple=True,
    metavar="HOST[:PORT]",
    help=f"A Gearman server; repeat for several (default {DEFAULT_SERVER}).",
)


def load_worker(target: str) -> Worker:
    """The Worker at MODULE:ATTR (ATTR may be dotted)."""
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
    if not isinstance(obj, Worker):
        raise click.BadParameter(f"{target} is a {type(obj).__name__}, not a jobwire Worker")
    return obj


@click.command("worker")
@click.argument("target", metavar="MODULE:ATTR")
@servers_option
@click.option("-c", "--concurrency", type=click.IntRange(min=1), help="Jobs held at once.")
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
def worker_command(
    target: str,
    servers: Sequence[str],
    concurrency: int | None,
    grace_period: float | None,
    log_level: str,
    wmp_managers: Sequence[str],
    roles: Sequence[str],
) -> None:
    """Run the Worker object found at MODULE:ATTR.

    SIGTERM/SIGINT stop it gracefully, SIGTSTP makes it quiet, SIGCONT resumes it.
    """
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
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
def submit_command(
    function: str,
    data: str | None,
    background: bool,
    priority: str,
    unique: str | None,
    timeout: float | None,
    servers: Sequence[str],
) -> None:
    """Submit a job to FUNCTION with DATA (standard input when DATA is absent).

    Prints the result's bytes as they are, or the job handle with -b.
    """
    payload = data.encode() if data is not None else sys.stdin.buffer.read()
    try:
        with Client(servers or [DEFAULT_SERVER]) as client:
            if background:
                click.echo(
                    client.submit_background(
                        function,
                        payload,
                        unique=unique,
                        priority=priority,  # type: ignore[arg-type]
                    )
                )
            else:
                result = client.submit(
                    function,
                    payload,
                    unique=unique,
                    priority=priority,  # type: ignore[arg-type]
                    timeout=timeout,
                )
                sys.stdout.buffer.write(result)
                sys.stdout.buffer.flush()
    except JobwireError as exc:
        raise click.ClickException(str(exc)) from exc


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
def status_command(servers: Sequence[str]) -> None:
    """Show each server's queues and workers (admin `status` and `workers`)."""
    failed = False
    for number, server in enumerate(servers or [DEFAULT_SERVER]):
        if number:
            click.echo()
        click.echo(f"== {server}")
        try:
            functions = admin.status(server)
            connections = [row for row in admin.workers(server) if row.functions]
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
