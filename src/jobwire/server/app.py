"""Assemble and run a jobwire server: store, engine, listeners, signals, clean shutdown."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from jobwire.engine import Engine, EngineConfig
from jobwire.ports import Store, StoredJob
from jobwire.server.auth import Security, is_loopback
from jobwire.server.gearman import GearmanOptions, GearmanServer
from jobwire.server.limits import ConnectionTable, Limits
from jobwire.server.ojs.app import OJSOptions, OJSService
from jobwire.server.ojs.edges import OJSAppRunner
from jobwire.server.ojs.http import BODY_TIMEOUT
from jobwire.server.rota import RotaOptions, RotaService
from jobwire.server.runtime import BUSY_POLL, Runtime
from jobwire.server.zmq import ZmqOptions, ZmqServer
from jobwire.store import DEFAULT_STORE, is_postgres
from jobwire.store.base import MemoryStore

if TYPE_CHECKING:
    from jobwire.store.pgcluster import ClusterNode

log = logging.getLogger("jobwire")

#: Stores with more jobs than this log their replay's progress (`replay_progress`).
REPLAY_PROGRESS_FROM = 100_000
#: Seconds between two replay progress lines.
REPLAY_PROGRESS_EVERY = 2.0


@dataclass
class ServerConfig:
    listen: str = "127.0.0.1"
    port: int = 4730
    http_port: int | None = 8080
    #: The operator's dashboard at `/` on the HTTP port (`jobwire.server.dashboard`).
    dashboard: bool = True
    #: `/metrics` on a port of its own too (None: only on the HTTP port).
    metrics_port: int | None = None
    store: str = DEFAULT_STORE
    #: postgresql store: a node's lease and the cluster's fallback poll (`store.pgcluster`).
    node_lease: float = 15.0
    cluster_poll: float = 5.0
    #: postgresql store: where the node listens for the other nodes' links, "HOST[:PORT]"
    #: (`store.peerlink`); None: no links, foreground jobs go by the shared queue.
    peer_listen: str | None = "127.0.0.1"
    fsync: str = "batch"  # always | batch | off; see jobwire.store.sqlite
    checkpoint_bytes: int | None = None  # redo log between checkpoints; None: the default
    backlog: int = 1024
    pid_file: Path | None = None
    busy_poll: float = BUSY_POLL  # seconds the loop polls on after a read (server.runtime)
    engine: EngineConfig = field(default_factory=EngineConfig)
    gearman: GearmanOptions = field(default_factory=GearmanOptions)
    ojs: OJSOptions = field(default_factory=OJSOptions)
    rota: RotaOptions = field(default_factory=RotaOptions)
    zmq: ZmqOptions = field(default_factory=lambda: ZmqOptions(endpoint=None))
    #: Binary Star: "primary" or "backup" (None: a server on its own), with the endpoint
    #: this server publishes its state on and its peer's.
    bstar: str | None = None
    bstar_local: str = ""
    bstar_remote: str = ""
    bstar_heartbeat: float = 1.0
    #: Connection and request bounds (server/limits.py, README "Limits").
    limits: Limits = field(default_factory=Limits)
    #: --auth, --tls-*, --rate-limit (`server.auth`); the default: all off.
    security: Security = field(default_factory=Security)
    #: --insecure: listen on a non-loopback address without --auth.
    insecure: bool = False
    #: Called once every listener is up (`serve --daemon` lets its starter exit then).
    on_ready: Callable[[], None] | None = None


def open_store(
    spec: str,
    fsync: str = "batch",
    checkpoint_bytes: int | None = None,
    busy_poll: float = 0.0,
    *,
    address: str = "",
    node_lease: float = 15.0,
) -> Store:
    """`memory`, `sqlite:PATH` or `postgresql://...`; `busy_poll` as the server's, for the
    sqlite store's syncer; `address` and `node_lease` for a postgresql node."""
    if spec == "memory":
        return MemoryStore()
    if is_postgres(spec):  # psycopg is imported for this store only
        from jobwire.store.postgres import PostgresStore
        from jobwire.store.sqlite import StoreError as PostgresStoreError

        try:
            return PostgresStore(spec, address=address, lease=node_lease)
        except PostgresStoreError as exc:
            raise SystemExit(f"jobwire: {exc}") from exc
    kind, _, path = spec.partition(":")
    if kind == "sqlite" and path:
        from jobwire.store.sqlite import CHECKPOINT_BYTES, SQLiteStore, StoreError

        try:
            store: Store = SQLiteStore(
                Path(path),
                fsync=fsync,
                checkpoint_bytes=checkpoint_bytes or CHECKPOINT_BYTES,
                busy_poll=busy_poll,
            )
        except StoreError as exc:
            raise SystemExit(f"jobwire: {exc}") from exc
        return store
    raise SystemExit(
        f"unknown store {spec!r}: use memory, sqlite:PATH or postgresql://USER@HOST:PORT/DB"
    )


def replay_progress(
    rows: Iterable[StoredJob], total: int, every: float = REPLAY_PROGRESS_EVERY
) -> Iterator[StoredJob]:
    """`rows`, logging every `every` seconds how many were replayed, the rate and the time
    left (checked once per 8,192 rows, so the clock costs the replay nothing)."""
    started = last = time.perf_counter()
    done = 0
    for done, row in enumerate(rows, 1):
        if not done & 8191:
            now = time.perf_counter()
            if now - last >= every:
                last = now
                rate = done / (now - started)
                left = max(0, total - done) / rate if rate else 0.0
                log.info(
                    "replaying the store: %d of %d jobs (%.0f%%), %.0f jobs/s, about %.0fs left",
                    done,
                    total,
                    100.0 * done / total if total else 100.0,
                    rate,
                    left,
                )
        yield row


def rota_options(config: ServerConfig) -> RotaOptions:
    """Registered Rota specs live beside an sqlite store unless a file is named."""
    options = config.rota
    kind, _, path = config.store.partition(":")
    if options.spec_file is None and kind == "sqlite" and path:
        options = replace(options, spec_file=Path(path).parent / "rota-specs.json")
    return options


async def serve_http(
    ojs: OJSService,
    rota: RotaService,
    host: str,
    port: int,
    security: Security | None = None,
    dashboard: bool = True,
) -> web.AppRunner:
    """One HTTP listener for the OJS binding, the Rota `/work` WebSocket and the dashboard;
    HTTPS and WSS with --tls-cert, roles with --auth (`ojs.guard`)."""
    app = ojs.app()
    rota.install(app)
    if dashboard:
        from jobwire.server.dashboard import Dashboard

        Dashboard(ojs).add_routes(app)
    table = ojs.runtime.connections
    limits = table.limits
    app[BODY_TIMEOUT] = limits.http_body_timeout
    if security is not None and (security.auth is not None or security.rate):
        from jobwire.server.ojs.guard import Guard

        # Inside the edges middleware, so that a refusal is an OJS error body.
        app.middlewares.insert(
            list(app.middlewares).index(ojs.edges_middleware) + 1, Guard(security).middleware
        )
    # Malformed HTTP that aiohttp's parser refuses is answered with an OJS error body too.
    runner = OJSAppRunner(
        app,
        connections=table,
        header_timeout=limits.http_header_timeout,
        edges=ojs.edges_middleware,
        access_log=None,
        handle_signals=False,
        max_line_size=limits.http_max_header_size,
        max_field_size=limits.http_max_header_size,
        max_headers=limits.http_max_headers,
    )
    await runner.setup()
    site = web.TCPSite(
        runner,
        host,
        port,
        reuse_address=True,
        backlog=1024,
        ssl_context=security.context if security is not None else None,
    )
    await site.start()
    return runner


#: Container allocations between young-generation collections (CPython's default: 700).
GC_YOUNG_THRESHOLD = 50_000


def tune_gc() -> None:
    """Keep the cyclic garbage collector off the job hot paths.

    Queued jobs are long-lived and never form cycles, yet every collection of the older
    generations walks all of them: with CPython's defaults that was a fifth of the CPU
    time of a pipelined enqueue. Freezing moves what start-up allocated (replayed jobs
    included) out of the collector's sight; the higher thresholds make the collector run
    per 50,000 allocations, still often enough to free the rare cycle (an exception's
    traceback) promptly.
    """
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 100)


class Server:
    """A running jobwire: call `serve()` and it returns after SIGTERM/SIGINT."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self._stop = asyncio.Event()
        self._servers: list[asyncio.base_events.Server] = []
        #: Why the server stopped on its own (a Binary Star split brain); None: asked to.
        self.failure: str | None = None
        self._cluster: ClusterNode | None = None

    async def serve(self) -> None:
        config = self.config
        loop = asyncio.get_running_loop()
        store = open_store(
            config.store,
            config.fsync,
            config.checkpoint_bytes,
            config.busy_poll,
            address=f"{config.listen}:{config.port}",
            node_lease=config.node_lease,
        )
        node = getattr(store, "node", None)  # a cluster node (postgresql store)
        engine_config = config.engine
        if node is not None:  # ids stay unique across nodes without asking each other
            engine_config = replace(engine_config, id_prefix=f"{engine_config.id_prefix}:n{node}")
        engine = Engine(engine_config, journal=store)
        started = time.perf_counter()
        # Replay allocates millions of objects that all stay alive: scanning them for
        # garbage while they are created would more than double the replay time.
        gc.disable()
        try:
            rows: Iterable[StoredJob] = store.load()
            count = getattr(store, "job_count", None)
            total = count() if count is not None else 0
            if total > REPLAY_PROGRESS_FROM:
                log.info("replaying the store: %d jobs", total)
                rows = replay_progress(rows, total)
            restored = engine.replay(rows, store.numbers_ceiling())
        except Exception as exc:  # a file we cannot replay must not be written over
            store.close()
            raise SystemExit(f"jobwire: cannot replay the store: {exc}") from exc
        finally:
            gc.enable()
        tune_gc()
        if restored:
            seconds = time.perf_counter() - started
            log.info("restored %d jobs from the store in %.2fs", restored, seconds)
        store.start()
        cluster = None
        if node is not None:
            from jobwire.store.pgcluster import ClusterNode
            from jobwire.store.postgres import PostgresStore

            assert isinstance(store, PostgresStore)
            cluster = ClusterNode(
                store,
                engine,
                poll=config.cluster_poll,
                on_fatal=self._fatal,
                peer_listen=config.peer_listen,
                peer_tls=config.security.tls,
            )
            cluster.start()
            self._cluster = cluster
        runtime = Runtime(engine, loop, config.busy_poll, store)
        runtime.cluster = cluster
        if cluster is not None:
            from jobwire.store.pgremote import RemoteJobs

            runtime.remote = RemoteJobs(cluster)
        runtime.connections = ConnectionTable(config.limits)
        if config.security.auth is not None:
            # The idle timeout then closes a connection until it authenticates, whatever it sends.
            runtime.connections.settle_on_data = False
        bstar = None
        if config.bstar:
            from jobwire.server.bstar import BinaryStarNode

            bstar = BinaryStarNode(
                runtime,
                primary=config.bstar == "primary",
                local=config.bstar_local,
                remote=config.bstar_remote,
                heartbeat=config.bstar_heartbeat,
                on_fatal=self._fatal,
            )
            try:
                bstar.start()
            except zmq_error() as exc:
                bstar.close()
                raise SystemExit(f"jobwire: cannot start binary star: {exc}") from exc
        security = config.security
        announce_security(config)
        gearman = GearmanServer(runtime, config.gearman, security.auth, security.rate_limiter())
        runtime.on_shutdown = lambda graceful: self._shutdown(engine, graceful)
        if config.pid_file is not None:
            config.pid_file.write_text(f"{os.getpid()}\n")
        # Bound now (a port in use fails the start at once), accepting only once every other
        # listener is up: a client that reaches the Gearman port finds start-up over, not the
        # HTTP stack still importing and building on the loop it is served from.
        tcp = await loop.create_server(
            gearman.protocol_factory,
            host=config.listen,
            port=config.port,
            backlog=config.backlog,
            reuse_address=True,
            ssl=security.context,
            start_serving=False,
        )
        self._servers.append(tcp)
        http = ojs = metrics = None
        if config.http_port or config.metrics_port:
            # Metrics without the HTTP listener: the event log counts, and keeps no events
            # (nobody could read them), so a job event costs only its counters.
            options = config.ojs if config.http_port else replace(config.ojs, event_log_size=0)
            ojs = OJSService(runtime, options)
            ojs.metrics.listeners["gearman"] = lambda: len(gearman.connections)
        if config.http_port and ojs is not None:  # 0 or None: no HTTP listener
            rota = RotaService(runtime, rota_options(config))
            http = await serve_http(
                ojs,
                rota,
                config.listen,
                config.http_port,
                security,
                dashboard=config.dashboard,
            )
            ojs.metrics.listeners["rota"] = lambda: len(rota.connections)
            ojs.metrics.listeners["http"] = functools.partial(_http_connections, http)
            log.info("jobwire listening on %s:%d (http)", config.listen, config.http_port)
        if config.metrics_port and ojs is not None:
            from jobwire.server.ojs.observability import serve_metrics

            metrics = await serve_metrics(ojs.metrics_registry, config.listen, config.metrics_port)
            log.info("jobwire listening on %s:%d (metrics)", config.listen, config.metrics_port)
        zmq_server = None
        zmq_options = config.zmq
        if (
            zmq_options.endpoint
            or (zmq_options.ppp_frontend and zmq_options.ppp_backend)
            or zmq_options.freelance_bind
            or zmq_options.wmp_bind
        ):
            zmq_server = ZmqServer(runtime, config.zmq)
            try:
                zmq_server.start()
            except zmq_error() as exc:
                zmq_server.close()
                raise SystemExit(f"jobwire: cannot listen for ZeroMQ: {exc}") from exc
            if ojs is not None:  # libzmq's connections, counted by the sockets' monitors
                for name in zmq_server.connections():
                    ojs.metrics.listeners[name] = functools.partial(
                        _zmq_connections, zmq_server, name
                    )
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        if security.tls is not None:
            loop.add_signal_handler(signal.SIGHUP, self._reload_tls)
        gc.freeze()  # what the listeners' start-up allocated, out of the collector's sight too
        await tcp.start_serving()
        log.info("jobwire listening on %s:%d (gearman)", config.listen, config.port)
        if config.on_ready is not None:
            config.on_ready()
        try:
            await self._stop.wait()
        finally:
            log.info("shutting down")
            for server in self._servers:
                server.close()
            # Give pending writes one turn to go out, then commit and close the store.
            for conn in list(gearman.connections.values()):
                conn.flush()
            await asyncio.sleep(0)
            if http is not None:
                await http.cleanup()
            if metrics is not None:
                await metrics.cleanup()
            if zmq_server is not None:
                zmq_server.close()
            if bstar is not None:
                bstar.close()
            if ojs is not None:
                ojs.close()
            runtime.close()
            if cluster is not None:
                await cluster.close()
            drain = getattr(store, "drain", None)
            if drain is not None:  # a store that commits on the loop: let it finish
                await drain()
            store.close()
            if config.pid_file is not None:
                config.pid_file.unlink(missing_ok=True)

    def stop(self) -> None:
        self._stop.set()

    def _reload_tls(self) -> None:
        """SIGHUP: re-read the certificate files; open connections stay as they are."""
        try:
            self.config.security.reload()
            if self._cluster is not None and self._cluster.links is not None:
                self._cluster.links.reload_tls()
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            log.error("SIGHUP: kept the old TLS certificate: %s", exc)

    def _shutdown(self, engine: Engine, graceful: bool) -> None:
        """Stop now, or (graceful) stop accepting and stop once no job runs any more."""
        loop = asyncio.get_running_loop()
        if not graceful:
            loop.call_soon(self._stop.set)  # after this turn: the OK is written first
            return
        for server in self._servers:
            server.close()  # no new connections; the open ones go on

        def check() -> None:
            if any(fn.running for fn in engine.functions.values()):
                loop.call_later(0.05, check)
            else:
                self._stop.set()

        loop.call_soon(check)

    def _fatal(self, reason: str) -> None:
        """Stop, and exit with an error once everything is closed (`run`)."""
        self.failure = reason
        self._stop.set()


def check_exposure(config: ServerConfig) -> None:
    """Refuse a non-loopback --listen without --auth, unless --insecure says so."""
    if config.security.auth is None and not config.insecure and not is_loopback(config.listen):
        raise SystemExit(
            f"jobwire: refusing to listen on {config.listen} without authentication: give "
            "--auth FILE (docs/security.md), or --insecure to accept anyone who reaches the port"
        )


def announce_security(config: ServerConfig) -> None:
    """Say at start how the server is exposed: the warning shows at every --verbose level
    (not with --log-file none)."""
    security = config.security
    say = logging.getLogger("jobwire.security")
    if logging.getLogger().level <= logging.CRITICAL:
        say.setLevel(min(logging.WARNING, logging.getLogger().getEffectiveLevel()))
    if security.auth is None:
        say.warning(
            "jobwire runs without authentication: anyone who reaches its ports may submit, "
            "run, cancel or delete jobs (--auth FILE, docs/security.md)"
        )
    else:
        say.info("authentication on: %d principals", len(security.auth.entries))
    if security.tls is None:
        say.info("TLS off: Gearman and HTTP are served in clear text")
    else:
        mutual = " with client certificates required" if security.tls.client_ca else ""
        say.info("TLS on for Gearman and HTTP%s", mutual)


def _http_connections(runner: web.AppRunner) -> int:
    server = runner.server
    return len(server.connections) if server is not None else 0


def _zmq_connections(server: ZmqServer, listener: str) -> int:
    return server.connections().get(listener, 0)


def zmq_error() -> type[Exception]:
    import zmq

    return zmq.ZMQError


def run(config: ServerConfig) -> None:
    check_exposure(config)
    server = Server(config)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        asyncio.run(server.serve())
    else:
        uvloop.run(server.serve())
    if server.failure is not None:
        raise SystemExit(f"jobwire: {server.failure}")
