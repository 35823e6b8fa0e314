"""The `jobwire` command line."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from jobwire import __version__
from jobwire.gearmand_compat import (
    GEARMAND_VERSION,
    QUEUE_TYPES,
    GearmandCommand,
    daemonize,
    enable_coredump,
    queue_store,
    set_file_descriptors,
    switch_user,
)
from jobwire.limits_cli import limit_options
from jobwire.server.limits import Limits
from jobwire.store import DEFAULT_STORE

if TYPE_CHECKING:
    from jobwire.server.auth import Security

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


def _peer_listen(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """`--peer-listen`: "off", or an address the node can listen on."""
    if value == "off":
        return value
    from jobwire.store.peerlink import split_address

    try:
        _host, port = split_address(value)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise click.BadParameter(f"{value!r}: expected HOST, HOST:PORT, [IPV6]:PORT or off")
    return value


def _version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        from jobwire import native
        from jobwire.server.zmq import wholemessages

        click.echo(
            f"jobwire {__version__}, hot path {native.status()}, zeromq {wholemessages.status()}"
        )
        ctx.exit()


#: Gearman job handles are at most 64 bytes (libgearman's buffer): PREFIX, ":" and up to 19
#: digits.
MAX_HANDLE_PREFIX = 64 - 1 - 19


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


def _setup_logging(log_file: str, verbose: str, syslog: bool = False) -> None:
    level = _PY_LEVEL[verbose]
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    if log_file == "none":
        logging.basicConfig(level=logging.CRITICAL + 1)
    elif log_file == "stderr":
        logging.basicConfig(level=level, format=fmt, stream=sys.stderr)
    else:
        logging.basicConfig(level=level, format=fmt, filename=log_file)
    if syslog:
        from logging.handlers import SysLogHandler

        # The local syslog socket, else syslog over UDP on this host.
        address: str | tuple[str, int] = "/dev/log"
        if not Path("/dev/log").exists():
            address = ("localhost", 514)
        handler = SysLogHandler(address=address, facility=SysLogHandler.LOG_DAEMON)
        handler.setFormatter(logging.Formatter("jobwire[%(process)d]: %(name)s: %(message)s"))
        handler.setLevel(level)
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(min(root.level, level))


@main.command(cls=GearmandCommand, context_settings={"help_option_names": ["-h", "--help"]})
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
    "--no-dashboard",
    "no_dashboard",
    is_flag=True,
    help="Serve no dashboard at / on the HTTP port (the APIs and /metrics stay).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0, max=65535),
    default=0,
    show_default=True,
    help="Also serve /metrics (Prometheus) on this port; 0: only on the HTTP port.",
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
    "--event-log-size",
    type=click.IntRange(min=0),
    default=10_000,
    show_default=True,
    help="Job events kept for GET /ojs/v1/events, the dashboard and the snapshot in the "
    "store; 0 keeps none (the counters of /metrics go on).",
)
@click.option(
    "--retain-finished",
    type=float,
    default=None,
    help="Seconds finished jobs stay visible to status queries [default: 3600 with HTTP, else 0].",
)
@click.option(
    "--store",
    default=DEFAULT_STORE,
    show_default=True,
    envvar="JOBWIRE_STORE",
    help="Job store: memory, sqlite:PATH or postgresql://USER:PASS@HOST:PORT/DB "
    "(also $JOBWIRE_STORE).",
)
@click.option(
    "--node-lease",
    type=click.FloatRange(min=0.3),
    default=15.0,
    show_default=True,
    help="postgresql store: seconds a node's lease lasts (renewed every third of it); the "
    "jobs of a node whose lease ran out are requeued by the other nodes.",
)
@click.option(
    "--cluster-poll",
    type=click.FloatRange(min=0.05),
    default=5.0,
    show_default=True,
    help="postgresql store: seconds between two looks for shared work when no notification "
    "came (wake-ups come by LISTEN/NOTIFY; this covers a lost one).",
)
@click.option(
    "--peer-listen",
    default="127.0.0.1",
    callback=_peer_listen,
    show_default=True,
    metavar="HOST[:PORT]|off",
    help="postgresql store: where this node listens for the other nodes' links, which carry "
    "foreground jobs to a node with a free worker without going through the database; "
    "0.0.0.0 for nodes on other machines (the address PostgreSQL sees is advertised); "
    "'off': foreground jobs go by the shared queue.",
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
    "--zmq-port",
    type=click.IntRange(min=0, max=65535),
    default=5555,
    show_default=True,
    help="ZeroMQ port of the Majordomo broker (MDP 0.1/0.2, MMI, Titanic); 0 disables it.",
)
@click.option("--zmq-listen", default=None, help="ZeroMQ address [default: --listen].")
@click.option(
    "--mdp-heartbeat",
    type=click.FloatRange(min=0, min_open=True),
    default=2.5,
    show_default=True,
    help="Seconds between Majordomo heartbeats.",
)
@click.option(
    "--mdp-liveness",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Heartbeats a Majordomo or Pirate worker may miss before it is dead.",
)
@click.option(
    "--mdp-request-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="Seconds a Majordomo request for a service nobody serves waits for a worker.",
)
@click.option("--ppp-frontend", default=None, help="Paranoid Pirate client endpoint (tcp://...).")
@click.option("--ppp-backend", default=None, help="Paranoid Pirate worker endpoint (tcp://...).")
@click.option(
    "--ppp-function", default="ppp", show_default=True, help="The function of PPP requests."
)
@click.option(
    "--freelance-port",
    type=click.IntRange(min=0, max=65535),
    default=0,
    show_default=True,
    help="ZeroMQ port of the Freelance server (RFC 10); 0 disables it.",
)
@click.option(
    "--freelance-endpoint",
    default=None,
    help="The Freelance server's public endpoint, its identity [default: tcp://ADDR:PORT].",
)
@click.option(
    "--bstar",
    type=click.Choice(["primary", "backup"]),
    default=None,
    help="Run as one server of a Binary Star pair (with --bstar-local and --bstar-remote).",
)
@click.option("--bstar-local", default=None, help="Endpoint this server publishes its state on.")
@click.option("--bstar-remote", default=None, help="The peer's state endpoint.")
@click.option(
    "--bstar-heartbeat",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Seconds between state messages; the peer is dead after two.",
)
@click.option(
    "--wmp-port",
    type=click.IntRange(min=0, max=65535),
    default=0,
    show_default=True,
    help="ZeroMQ port of the Worker-Manager Protocol manager (docs/wmp.md); 0 disables it.",
)
@click.option(
    "--wmp-heartbeat",
    type=click.FloatRange(min=0, min_open=True),
    default=2.5,
    show_default=True,
    help="Seconds between WMP heartbeats of a worker that announces no interval.",
)
@click.option(
    "--wmp-lease",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="Seconds a WMP worker may hold a job without DONE or STATUS, unless its READY says.",
)
@click.option("--wmp-id", default=None, help="The WMP manager's identity [default: host/endpoint].")
@click.option(
    "--rota-heartbeat-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    show_default=True,
    help="Seconds a /work WebSocket worker may stay silent before its jobs are requeued.",
)
@click.option(
    "--rota-beat-interval",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Seconds without a message to a /work worker after which the server sends a beat.",
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
# Security (docs/security.md).
@click.option(
    "--tls-cert",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="PEM certificate (chain): TLS on the Gearman port, HTTPS/WSS on the HTTP port. "
    "Re-read on SIGHUP.",
)
@click.option(
    "--tls-key", type=click.Path(path_type=Path, dir_okay=False), default=None, help="Its key."
)
@click.option(
    "--tls-client-ca",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Require client certificates signed by these CAs (mutual TLS); a certificate's "
    "subject names its principal in --auth.",
)
@click.option(
    "--auth",
    "auth_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="TOML file of principals (token hash, certificate subject or CURVE key) and their "
    "roles: client, worker, admin. Without it anyone may do anything.",
)
@click.option(
    "--insecure",
    is_flag=True,
    help="Listen on a non-loopback address without --auth (refused otherwise).",
)
@click.option(
    "--zmq-curve-secret",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="ZeroMQ certificate (public and secret key; `jobwire auth curve-keypair`): CURVE "
    "on every ZeroMQ endpoint.",
)
@click.option(
    "--zmq-curve-clients",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Client public keys (Z85, one a line) allowed to connect, besides the --auth "
    "principals' curve_public_key; none at all: any key (encryption only).",
)
@click.option(
    "--rate-limit",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="N",
    help="HTTP requests a second per principal (per peer address without --auth); more are "
    "answered 429 with Retry-After. Default: no limit.",
)
# gearmand's own flags (jobwire.gearmand_compat; README "Command line").
@click.option(
    "-d",
    "--daemon",
    is_flag=True,
    help="Detach and run in the background; exits 0 once the server listens, 1 if it "
    "could not start.",
)
@click.option("-u", "--user", default=None, help="Switch to this user after start-up (as root).")
@click.option(
    "-t",
    "--threads",
    type=click.IntRange(min=0),
    default=4,
    show_default=True,
    help="Accepted for gearmand and ignored: one event loop serves every connection.",
)
@click.option(
    "-V",
    "--version",
    "show_version",
    is_flag=True,
    help="Print the version (as gearmand does) and exit.",
)
@click.option("--syslog", is_flag=True, help="Also log to syslog (facility daemon).")
@click.option(
    "-q",
    "--queue-type",
    default="builtin",
    show_default=True,
    help=f"gearmand's queue: {' or '.join(QUEUE_TYPES)}; builtin is --store memory, "
    "libsqlite3 is --store sqlite:<--libsqlite3-db> [default: --store's default].",
)
@click.option("--libsqlite3-db", default=None, help="The libsqlite3 queue's database file.")
@click.option(
    "--libsqlite3-table",
    default=None,
    help="Accepted for gearmand and ignored: jobwire keeps its own tables.",
)
@click.option(
    "--store-queue-on-shutdown",
    is_flag=True,
    help="Accepted for gearmand and ignored: the sqlite store writes every job as it comes.",
)
@click.option(
    "-R",
    "--round-robin",
    is_flag=True,
    help="Accepted for gearmand: jobwire always takes a worker's functions in turn by "
    "priority and age.",
)
@click.option(
    "--config-file",
    default=None,
    metavar="PATH",
    help="Read options from PATH (gearmand's format: options as on the command line, "
    "whitespace-separated); the command line wins.",
)
@click.option(
    "--hashtable-buckets",
    type=click.IntRange(min=1),
    default=991,
    show_default=True,
    help="Accepted for gearmand and ignored: jobwire's tables grow as needed.",
)
@click.option(
    "-f",
    "--file-descriptors",
    type=click.IntRange(min=1),
    default=None,
    help="Set the limit on open files (RLIMIT_NOFILE) [default: the user's].",
)
@click.option(
    "--coredump", is_flag=True, help="Leave a core file (and tracebacks) on a fatal signal."
)
@click.option(
    "-r",
    "--protocol",
    multiple=True,
    help="gearmand's protocol modules: http serves HTTP on --http-port; gear is always on.",
)
@click.option("--ssl", is_flag=True, help="gearmand's: TLS with --ssl-certificate and --ssl-key.")
@click.option("--ssl-ca-file", default=None, help="gearmand's name for --tls-client-ca.")
@click.option("--ssl-certificate", default=None, help="gearmand's name for --tls-cert.")
@click.option("--ssl-key", default=None, help="gearmand's name for --tls-key.")
@click.option("--check-args", is_flag=True, hidden=True, help="Check the options and exit.")
@limit_options
@click.pass_context
def serve(
    ctx: click.Context,
    limits: Limits,
    listen: str,
    port: int,
    http_port: int,
    no_dashboard: bool,
    metrics_port: int,
    allow_reset: bool,
    heartbeat_timeout: float,
    cron_catch_up: str,
    event_log_size: int,
    retain_finished: float | None,
    store: str,
    node_lease: float,
    cluster_poll: float,
    peer_listen: str,
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
    zmq_port: int,
    zmq_listen: str | None,
    mdp_heartbeat: float,
    mdp_liveness: int,
    mdp_request_timeout: float,
    ppp_frontend: str | None,
    ppp_backend: str | None,
    ppp_function: str,
    freelance_port: int,
    freelance_endpoint: str | None,
    bstar: str | None,
    bstar_local: str | None,
    bstar_remote: str | None,
    bstar_heartbeat: float,
    wmp_port: int,
    wmp_heartbeat: float,
    wmp_lease: float,
    wmp_id: str | None,
    rota_heartbeat_timeout: float,
    rota_beat_interval: float,
    rota_max_message: int,
    rota_logs: bool,
    rota_spec_file: Path | None,
    cors_origins: tuple[str, ...],
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_client_ca: Path | None,
    auth_file: Path | None,
    insecure: bool,
    zmq_curve_secret: Path | None,
    zmq_curve_clients: Path | None,
    rate_limit: float | None,
    daemon: bool,
    user: str | None,
    threads: int,
    show_version: bool,
    syslog: bool,
    queue_type: str,
    libsqlite3_db: str | None,
    libsqlite3_table: str | None,
    store_queue_on_shutdown: bool,
    round_robin: bool,
    config_file: str | None,
    hashtable_buckets: int,
    file_descriptors: int | None,
    coredump: bool,
    protocol: tuple[str, ...],
    ssl: bool,
    ssl_ca_file: str | None,
    ssl_certificate: str | None,
    ssl_key: str | None,
    check_args: bool,
) -> None:
    """Run the job server.

    Takes gearmand's command line too (README, "Command line"): a bad argument exits 1.
    """
    from jobwire import native
    from jobwire.engine import EngineConfig
    from jobwire.server.app import ServerConfig, run
    from jobwire.server.gearman import GearmanOptions
    from jobwire.server.ojs.app import OJSOptions
    from jobwire.server.rota import RotaOptions
    from jobwire.server.zmq import ZmqOptions

    verbose = verbose.upper()
    # Check everything first (--check-args stops after this), as gearmand does.
    if job_handle_prefix is not None and len(job_handle_prefix.encode()) > MAX_HANDLE_PREFIX:
        raise click.BadParameter(
            f"at most {MAX_HANDLE_PREFIX} bytes: handles (PREFIX:N, N up to 19 digits) must "
            "fit Gearman's 64 bytes",
            param_hint="--job-handle-prefix",
        )
    if bstar and not (bstar_local and bstar_remote):
        raise click.UsageError("--bstar needs --bstar-local and --bstar-remote")
    if ctx.get_parameter_source("queue_type") is not click.core.ParameterSource.DEFAULT:
        store_given = ctx.get_parameter_source("store") is not click.core.ParameterSource.DEFAULT
        store = queue_store(queue_type, libsqlite3_db, store, store_given)
    for name in protocol:
        if name.lower() == "http":
            http_port = http_port or 8080  # gearmand's --http-port default
        elif name.lower() != "gear":
            raise click.BadParameter(
                f"jobwire has no protocol module {name!r}: Gearman is always served, HTTP "
                "with -r http (or --http-port); OJS, Rota and ZeroMQ are built in",
                param_hint="--protocol",
            )
    if check_args:
        ctx.exit(0)
    if show_version:
        click.echo(
            f"\njobwire {__version__} (gearmand {GEARMAND_VERSION} command line), "
            f"hot path {native.status()}"
        )
        ctx.exit(0)
    if ssl:  # gearmand's spelling
        tls_cert = tls_cert or (Path(ssl_certificate) if ssl_certificate else None)
        tls_key = tls_key or (Path(ssl_key) if ssl_key else None)
        tls_client_ca = tls_client_ca or (Path(ssl_ca_file) if ssl_ca_file else None)
        if tls_cert is None or tls_key is None:
            raise click.ClickException(
                "--ssl needs the server's TLS certificate and key: --ssl-certificate and "
                "--ssl-key (or --tls-cert and --tls-key)"
            )
    security = _security(tls_cert, tls_key, tls_client_ca, auth_file, rate_limit)
    curve = None
    if zmq_curve_clients is not None and zmq_curve_secret is None:
        raise click.UsageError("--zmq-curve-clients needs --zmq-curve-secret")
    if zmq_curve_secret is not None:
        from jobwire.server.zmq.curve import CurveOptions

        try:
            curve = CurveOptions.load(zmq_curve_secret, zmq_curve_clients, security.auth)
        except (OSError, ValueError) as exc:
            raise click.ClickException(str(exc)) from exc
    if file_descriptors is not None:
        set_file_descriptors(file_descriptors)
    if user is not None:
        switch_user(user)
    ready = daemonize() if daemon else None
    if coredump:
        enable_coredump()
    _setup_logging(log_file, verbose, syslog)
    from jobwire.server.zmq import wholemessages

    logging.getLogger("jobwire").info(
        "jobwire %s, hot path %s, zeromq %s", __version__, native.status(), wholemessages.status()
    )
    if threads != 4:
        logging.getLogger("jobwire").info("--threads %d ignored: one event loop", threads)
    if store.startswith("sqlite:"):
        Path(store.removeprefix("sqlite:")).parent.mkdir(parents=True, exist_ok=True)
    config = ServerConfig(
        bstar=bstar,
        bstar_local=bstar_local or "",
        bstar_remote=bstar_remote or "",
        bstar_heartbeat=bstar_heartbeat,
        listen=listen,
        port=port,
        http_port=http_port,
        dashboard=not no_dashboard,
        metrics_port=metrics_port or None,
        store=store,
        node_lease=node_lease,
        cluster_poll=cluster_poll,
        peer_listen=None if peer_listen == "off" else peer_listen,
        fsync=fsync,
        checkpoint_bytes=checkpoint_every,
        backlog=backlog,
        busy_poll=busy_poll / 1e6,
        pid_file=pid_file,
        limits=limits,
        on_ready=ready,
        security=security,
        insecure=insecure,
        engine=EngineConfig(
            job_retries=job_retries or None,
            worker_wakeup=worker_wakeup,
            wakeup_fallback=wakeup_fallback,
            id_prefix=job_handle_prefix or "",
            retain_finished=(3600.0 if http_port else 0.0)
            if retain_finished is None
            else retain_finished,
        ),
        ojs=OJSOptions(
            allow_reset=allow_reset,
            heartbeat_timeout=heartbeat_timeout,
            cron_catch_up=cron_catch_up,
            cors_origins=tuple(cors_origins),
            event_log_size=event_log_size,
        ),
        rota=RotaOptions(
            heartbeat_timeout=rota_heartbeat_timeout,
            beat_interval=rota_beat_interval,
            max_message=rota_max_message,
            logs=rota_logs,
            spec_file=rota_spec_file,
        ),
        zmq=ZmqOptions(
            endpoint=f"tcp://{zmq_listen or listen}:{zmq_port}" if zmq_port else None,
            heartbeat=mdp_heartbeat,
            liveness=mdp_liveness,
            request_timeout=mdp_request_timeout,
            max_message=max_packet_size,
            ppp_frontend=ppp_frontend,
            ppp_backend=ppp_backend,
            ppp_function=ppp_function,
            freelance_bind=(
                f"tcp://{zmq_listen or listen}:{freelance_port}" if freelance_port else None
            ),
            freelance_endpoint=freelance_endpoint,
            wmp_bind=f"tcp://{zmq_listen or listen}:{wmp_port}" if wmp_port else None,
            wmp_heartbeat=wmp_heartbeat,
            wmp_lease=wmp_lease,
            wmp_identity=wmp_id,
            curve=curve,
            auth=security.auth if curve is not None else None,
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


def _security(
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_client_ca: Path | None,
    auth_file: Path | None,
    rate_limit: float | None,
) -> Security:
    """Read the --auth file and the TLS files now: a mistake stops the start, with why."""
    import ssl as ssl_module

    from jobwire.server.auth import Authenticator, AuthFileError, Security, TLSFiles

    security = Security(rate=rate_limit)
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if tls_client_ca is not None and tls_cert is None:
        raise click.UsageError("--tls-client-ca needs --tls-cert and --tls-key")
    if tls_cert is not None and tls_key is not None:
        security.tls = TLSFiles(tls_cert, tls_key, tls_client_ca)
        try:
            security.context = security.tls.server_context()
        except (OSError, ssl_module.SSLError) as exc:
            raise click.ClickException(f"cannot use the TLS files: {exc}") from exc
    if auth_file is not None:
        try:
            security.auth = Authenticator.from_file(auth_file)
        except AuthFileError as exc:
            raise click.ClickException(str(exc)) from exc
    return security


@main.group("auth")
def auth_group() -> None:
    """Make tokens and their hashes for --auth files (docs/security.md)."""


@auth_group.command("new-token")
def new_token_command() -> None:
    """Print a fresh random token and, on a second line, its token_sha256."""
    from jobwire.server.auth import hash_token, new_token

    token = new_token()
    click.echo(token)
    click.echo(hash_token(token))


@auth_group.command("hash-token")
@click.argument("token", required=False)
def hash_token_command(token: str | None) -> None:
    """Print the token_sha256 of TOKEN (read from standard input when not given, so that it
    stays out of the shell's history)."""
    from jobwire.server.auth import hash_token

    if token is None:
        token = sys.stdin.readline().strip()
    if not token:
        raise click.UsageError("no token given")
    click.echo(hash_token(token))


@auth_group.command("curve-keypair")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.argument("name")
def curve_keypair_command(directory: Path, name: str) -> None:
    """Write a ZeroMQ CURVE key pair: DIRECTORY/NAME.key (public) and NAME.key_secret; print
    the public key (for curve_public_key or --zmq-curve-clients)."""
    import zmq.auth

    directory.mkdir(parents=True, exist_ok=True)
    public_file, _ = zmq.auth.create_certificates(directory, name)
    public, _ = zmq.auth.load_certificate(public_file)
    click.echo(public.decode())


# `jobwire worker | submit | status` live with the SDK (src/jobwire/sdk/cli.py).
from jobwire.sdk.cli import status_command, submit_command, worker_command  # noqa: E402

main.add_command(worker_command)
main.add_command(submit_command)
main.add_command(status_command)

from jobwire.ojs_admin_cli import worker_state_command  # noqa: E402

main.add_command(worker_state_command)

from jobwire.sdk.spec_cli import spec_command  # noqa: E402

main.add_command(spec_command)

from jobwire.device import device_command  # noqa: E402

main.add_command(device_command)

from jobwire.db_cli import db_command  # noqa: E402

main.add_command(db_command)

from jobwire.top import top_command  # noqa: E402

main.add_command(top_command)
