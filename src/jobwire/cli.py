"""The `jobwire` command line."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from jobwire import __version__
from jobwire.store import DEFAULT_STORE

# The server stack (aiohttp, uvloop) is imported inside `serve`, so the client-side
# commands (submit, status, worker) start quickly.

LEVELS = ["FATAL", "ALERT", "CRITICAL", "ERROR", "WARNING", "NOTICE", "INFO", "DEBUG"]
_PY_LEVEL = {
    "FATAL": logging.CRITICAL,
    "ALERT": logging.CRITICAL,
    "CRITICAL": logging.CRITICAL,
    "ERROR": logging.ERROR,
    "WARNING": logging.WARNING,
    "NOTICE": logging.INFO,
    "INFO": logging.INFO,
    "DEBUG": logging.DEBUG,
}


def _version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        from jobwire import native

        click.echo(f"jobwire {__version__}, hot path {native.status()}")
        ctx.exit()


@click.group()
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_version,
    help="Show the version and whether the hot path runs compiled, then exit.",
)
def main() -> None:
    """jobwire: one job server for Gearman, Open Job Spec and more."""


def _setup_logging(log_file: str, verbose: str) -> None:
    level = _PY_LEVEL[verbose]
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    if log_file == "none":
        logging.basicConfig(level=logging.CRITICAL + 1)
    elif log_file == "stderr":
        logging.basicConfig(level=level, format=fmt, stream=sys.stderr)
    else:
        logging.basicConfig(level=level, format=fmt, filename=log_file)


@main.command()
@click.option(
    "-L", "--listen", default="127.0.0.1", show_default=True, help="Address to listen on."
)
@click.option(
    "-p",
    "--port",
    default=4730,
    show_default=True,
    envvar="GEARMAND_PORT",
    help="Gearman TCP port.",
)
@click.option(
    "--http-port", default=8080, show_default=True, help="HTTP port (OJS, /work); 0 disables HTTP."
)
@click.option(
    "--allow-reset",
    is_flag=True,
    help="Serve POST /ojs/v1/admin/reset, which wipes all jobs (for conformance test runners).",
)
@click.option(
    "--heartbeat-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds an OJS worker that registered or beat may stay silent before it is "
    "declared dead and its jobs are requeued.",
)
@click.option(
    "--cron-catch-up",
    type=click.Choice(["skip", "once"]),
    default="skip",
    show_default=True,
    help="Cron runs missed while the server was down: skip them, or run each entry once at "
    "start-up.",
)
@click.option(
    "--retain-finished",
    type=float,
    default=None,
    help="Seconds finished jobs stay visible to status queries [default: 3600 with HTTP, else 0].",
)
@click.option(
    "--store", default=DEFAULT_STORE, show_default=True, help="Job store: memory, or sqlite:PATH."
)
@click.option(
    "--fsync",
    type=click.Choice(["always", "batch", "off"]),
    default="batch",
    show_default=True,
    help="sqlite store: batch syncs every group commit to the redo log; always also writes "
    "each loop turn alone; off leaves syncing to the OS (a crash of the machine can lose jobs).",
)
@click.option(
    "--checkpoint-every",
    type=click.IntRange(min=1),
    default=None,
    metavar="BYTES",
    help="sqlite store: redo log bytes between two checkpoints into SQLite; bounds the log "
    "on disk and the replay at start [default: 16 MiB].",
)
@click.option(
    "-j",
    "--job-retries",
    default=0,
    show_default=True,
    help="Attempts before a job whose worker keeps vanishing is failed; 0: no limit.",
)
@click.option("--job-handle-prefix", default=None, help="Handles are PREFIX:N (default H:<host>).")
@click.option("--exceptions", is_flag=True, help="Forward WORK_EXCEPTION to every client.")
@click.option(
    "-w",
    "--worker-wakeup",
    default=1,
    show_default=True,
    help="Sleeping workers woken per new job; 0 wakes all of them.",
)
@click.option(
    "--wakeup-fallback",
    type=click.FloatRange(min=0),
    default=0.5,
    show_default=True,
    help="Seconds before more sleepers are woken when the woken ones left work waiting; "
    "0 disables.",
)
@click.option(
    "--max-packet-size",
    default=64 * 1024 * 1024,
    show_default=True,
    help="Largest packet accepted, in bytes.",
)
@click.option("--keepalive", is_flag=True, help="Enable TCP keepalive on accepted sockets.")
@click.option("--keepalive-idle", default=30, show_default=True)
@click.option("--keepalive-interval", default=10, show_default=True)
@click.option("--keepalive-count", default=5, show_default=True)
@click.option("-b", "--backlog", default=1024, show_default=True)
@click.option(
    "--busy-poll",
    type=click.FloatRange(min=0),
    default=100.0,
    show_default=True,
    help="Microseconds the server keeps polling for requests after a read before it sleeps: "
    "a request arriving meanwhile is seen without a wake-up; the sqlite store's syncer polls "
    "as long for the next sync after each one. 0 disables.",
)
@click.option(
    "-l",
    "--log-file",
    default="stderr",
    show_default=True,
    help="Log file path, or stderr, or none.",
)
@click.option(
    "--verbose", type=click.Choice(LEVELS, case_sensitive=False), default="ERROR", show_default=True
)
@click.option("-P", "--pid-file", type=click.Path(path_type=Path), default=None)
@click.option(
    "--rota-heartbeat-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    show_default=True,
    help="Seconds a /work WebSocket worker may stay silent before its jobs are requeued.",
)
@click.option(
    "--rota-max-message",
    type=click.IntRange(min=1024),
    default=1024 * 1024,
    show_default=True,
    help="Largest /work message in bytes; larger ones close the socket with 1009.",
)
@click.option(
    "--rota-logs",
    is_flag=True,
    help="Ask /work workers for every job's logs (else only jobs whose OJS meta.logs is true).",
)
@click.option(
    "--rota-spec-file",
    type=click.Path(path_type=Path),
    default=None,
    help="Where registered job specs are kept [default: beside an sqlite store, else memory].",
)
@click.option(
    "--cors-origin",
    "cors_origins",
    multiple=True,
    metavar="ORIGIN",
    help="Allow cross-origin requests to /ojs/v1 from ORIGIN (repeatable; * for any). "
    "Default: CORS off.",
)
def serve(
    listen: str,
    port: int,
    http_port: int,
    allow_reset: bool,
    heartbeat_timeout: float,
    cron_catch_up: str,
    retain_finished: float | None,
    store: str,
    fsync: str,
    checkpoint_every: int | None,
    job_retries: int,
    job_handle_prefix: str | None,
    exceptions: bool,
    worker_wakeup: int,
    wakeup_fallback: float,
    max_packet_size: int,
    keepalive: bool,
    keepalive_idle: int,
    keepalive_interval: int,
    keepalive_count: int,
    backlog: int,
    busy_poll: float,
    log_file: str,
    verbose: str,
    pid_file: Path | None,
    rota_heartbeat_timeout: float,
    rota_max_message: int,
    rota_logs: bool,
    rota_spec_file: Path | None,
    cors_origins: tuple[str, ...],
) -> None:
    """Run the job server."""
    from jobwire import native
    from jobwire.engine import EngineConfig
    from jobwire.server.app import ServerConfig, run
    from jobwire.server.gearman import GearmanOptions
    from jobwire.server.ojs.app import OJSOptions
    from jobwire.server.rota import RotaOptions

    verbose = verbose.upper()
    _setup_logging(log_file, verbose)
    logging.getLogger("jobwire").info("jobwire %s, hot path %s", __version__, native.status())
    if store.startswith("sqlite:"):
        Path(store.removeprefix("sqlite:")).parent.mkdir(parents=True, exist_ok=True)
    config = ServerConfig(
        listen=listen,
        port=port,
        http_port=http_port,
        store=store,
        fsync=fsync,
        checkpoint_bytes=checkpoint_every,
        backlog=backlog,
        busy_poll=busy_poll / 1e6,
        pid_file=pid_file,
        engine=EngineConfig(
            job_retries=job_retries or None,
            worker_wakeup=worker_wakeup,
            wakeup_fallback=wakeup_fallback,
            handle_prefix=job_handle_prefix or "",
            retain_finished=(3600.0 if http_port else 0.0)
            if retain_finished is None
            else retain_finished,
        ),
        ojs=OJSOptions(
            allow_reset=allow_reset,
            heartbeat_timeout=heartbeat_timeout,
            cron_catch_up=cron_catch_up,
            cors_origins=tuple(cors_origins),
        ),
        rota=RotaOptions(
            heartbeat_timeout=rota_heartbeat_timeout,
            max_message=rota_max_message,
            logs=rota_logs,
            spec_file=rota_spec_file,
        ),
        gearman=GearmanOptions(
            exceptions=exceptions,
            max_packet=max_packet_size,
            keepalive=keepalive,
            keepalive_idle=keepalive_idle,
            keepalive_interval=keepalive_interval,
            keepalive_count=keepalive_count,
            verbose=verbose,
        ),
    )
    run(config)


# `jobwire worker | submit | status` live with the SDK (src/jobwire/sdk/cli.py).
from jobwire.sdk.cli import status_command, submit_command, worker_command  # noqa: E402

main.add_command(worker_command)
main.add_command(submit_command)
main.add_command(status_command)

from jobwire.ojs_admin_cli import worker_state_command  # noqa: E402

main.add_command(worker_state_command)

from jobwire.sdk.spec_cli import spec_command  # noqa: E402

main.add_command(spec_command)
