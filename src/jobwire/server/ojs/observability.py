"""Observability (the OJS observability extension): `GET /metrics` in the Prometheus text
exposition format, `GET /ready`, and `GET /health` beside `/ojs/v1/health`.

Counting on the hot path is plain integer arithmetic in objects the server already has:
the engine records each job transition in its event log (`EventLog.observe`), which counts
it by type, queue and function and puts the job's wait or run time in a histogram; the
store counts its batches, log bytes and commit latency (`SQLiteStore.commit_times`); the
listeners count errors by kind (`jobwire.server.errors.ERRORS`). Nothing is
formatted until Prometheus scrapes: then a collector (`EngineCollector`) reads those
numbers, and the engine's state (queue depth by priority, workers by protocol and state,
connections by listener), into families of a registry of this service's own.
`serve --metrics-port` serves the same registry on a port of its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from jobwire.engine.events import Histogram, TimeHistogram
from jobwire.engine.job import PRIORITY_HIGH, PRIORITY_LOW, origin_name
from jobwire.engine.worker import WorkerState
from jobwire.server.errors import ERRORS
from jobwire.server.ojs.http import reply

if TYPE_CHECKING:
    from jobwire.server.ojs.app import OJSService

#: Counters: metric name -> (help, the job events it sums: `Tally.by_event`).
COUNTERS = {
    "jobwire_jobs_submitted": (
        "Jobs submitted, by queue, function and the protocol they came in by",
        ("job.enqueued", "job.scheduled"),
    ),
    "jobwire_jobs_started": ("Jobs handed to a worker (each attempt)", ("job.started",)),
    "jobwire_jobs_completed": ("Jobs completed", ("job.completed",)),
    "jobwire_jobs_failed": ("Jobs failed for good after running", ("job.discarded",)),
    "jobwire_jobs_expired": ("Jobs discarded before they ran (expired)", ("job.expired",)),
    "jobwire_jobs_retried": ("Failed attempts to be run again", ("job.retrying",)),
    "jobwire_jobs_cancelled": ("Jobs cancelled", ("job.cancelled",)),
}
#: The job counters' labels: `protocol` is the job's origin (`Job.origin`), so a job started
#: by an OJS worker but submitted over Gearman counts as protocol="gearman".
JOB_LABELS = ["queue", "function", "protocol"]


#: The engine's integer priorities as the label values Gearman and OJS users know.
def priority_name(priority: int) -> str:
    if priority >= PRIORITY_HIGH:
        return "high"
    if priority <= PRIORITY_LOW:
        return "low"
    return "normal"


def histogram(name: str, text: str, hist: Histogram | TimeHistogram) -> HistogramMetricFamily:
    """A histogram family from per-bucket counts (cumulated here, at scrape time)."""
    cumulative = list(accumulate(hist.counts))
    buckets = [(_bound(b), c) for b, c in zip(hist.bounds, cumulative, strict=False)]
    buckets.append(("+Inf", cumulative[-1]))
    return HistogramMetricFamily(name, text, buckets=buckets, sum_value=hist.total)


def _bound(value: float) -> str:
    return repr(float(value))


class EngineCollector(Collector):
    """The engine's, the store's and the listeners' figures, read when scraped."""

    def __init__(self, service: OJSService) -> None:
        self.service = service
        #: Listener name -> a function giving its open connections (`add_listener`).
        self.listeners: dict[str, Callable[[], int]] = {}

    def collect(self) -> Iterator[Metric]:
        yield from self._jobs()
        yield from self._queues()
        yield from self._workers()
        yield from self._store()
        yield from self._cluster()
        connections = GaugeMetricFamily(
            "jobwire_connections", "Open connections, by listener", labels=["listener"]
        )
        for name, count in sorted(self.listeners.items()):
            connections.add_metric([name], count())
        yield connections
        errors = CounterMetricFamily(
            "jobwire_errors", "Errors answered or met, by kind", labels=["kind"]
        )
        for kind, value in sorted(ERRORS.items()):
            errors.add_metric([kind], value)
        yield errors

    def _jobs(self) -> Iterator[Metric]:
        events = self.service.events
        tallies = [
            (tally.queue, tally.function, origin_name(tally.origin), tally.by_event())
            for tally in events.tallies()
        ]
        for name, (text, kinds) in COUNTERS.items():
            family = CounterMetricFamily(name, text, labels=JOB_LABELS)
            totals: Counter[tuple[str, str, str]] = Counter()
            for queue, function, protocol, counts in tallies:
                value = sum(counts[kind] for kind in kinds)
                if value:
                    totals[queue, function, protocol] += value
            for labels, value in sorted(totals.items()):
                family.add_metric(list(labels), value)
            yield family
        by_protocol = CounterMetricFamily(
            "jobwire_jobs_started_by_protocol",
            "Jobs handed to a worker, by the worker's protocol",
            labels=["protocol"],
        )
        for protocol, value in sorted(events.started_by_protocol.items()):
            by_protocol.add_metric([protocol], value)
        yield by_protocol
        yield histogram(
            "jobwire_job_wait_seconds",
            "Seconds from submission to a worker taking the job (each attempt)",
            events.wait_times,
        )
        yield histogram(
            "jobwire_job_run_seconds",
            "Seconds from a worker taking a job to its end (completed, failed, retried)",
            events.run_times,
        )

    def _queues(self) -> Iterator[Metric]:
        service = self.service
        engine = service.engine
        depth = GaugeMetricFamily(
            "jobwire_queue_depth",
            "Jobs ready in the queue, by priority",
            labels=["queue", "priority"],
        )
        paused = GaugeMetricFamily(
            "jobwire_queue_paused", "1 while the queue is paused", labels=["queue"]
        )
        for name, info in sorted(engine.queues.items()):
            by_priority: Counter[str] = Counter()
            for lane in info.lanes.values():
                for level in lane.levels:
                    by_priority[priority_name(level.priority)] += len(level.jobs)
            for priority in ("high", "normal", "low"):
                depth.add_metric([name, priority], by_priority[priority])
            paused.add_metric([name], 1 if info.paused else 0)
        yield depth
        yield paused
        running = GaugeMetricFamily(
            "jobwire_function_running", "Jobs running, by function", labels=["function"]
        )
        scheduled = GaugeMetricFamily(
            "jobwire_function_scheduled",
            "Jobs waiting for their time (scheduled or to be retried), by function",
            labels=["function"],
        )
        for name, fn in sorted(engine.functions.items()):
            running.add_metric([name], fn.running)
            scheduled.add_metric([name], fn.scheduled)
        yield running
        yield scheduled
        dead = GaugeMetricFamily("jobwire_dead_letter_jobs", "Jobs in the dead letter queue")
        dead.add_metric([], len(service.dead_letter))
        yield dead

    def _workers(self) -> Iterator[Metric]:
        workers = GaugeMetricFamily(
            "jobwire_workers",
            "Connected workers, by protocol and state",
            labels=["protocol", "state"],
        )
        live = Counter(
            (s.protocol, s.state.value)
            for s in self.service.engine.workers.values()
            if s.state is not WorkerState.TERMINATED
        )
        for (protocol, state), value in sorted(live.items()):
            workers.add_metric([protocol, state], value)
        yield workers

    def _store(self) -> Iterator[Metric]:
        store: Any = self.service.runtime.store
        if not hasattr(store, "commit_times"):  # the memory store: nothing to tell
            return
        yield histogram(
            "jobwire_store_commit_seconds",
            "Seconds from handing a batch to the redo log to its write (and fsync) being done",
            store.commit_times,
        )
        yield CounterMetricFamily(
            "jobwire_store_batches",
            "Batches (group commits) handed to the redo log",
            value=store.batches,
        )
        yield CounterMetricFamily(
            "jobwire_store_batch_jobs",
            "Job writes in those batches (divided by the batches: the mean batch size)",
            value=store.write_count,
        )
        yield CounterMetricFamily(
            "jobwire_store_fsyncs", "fsyncs of the redo log", value=store.fsyncs()
        )
        yield CounterMetricFamily(
            "jobwire_store_log_bytes", "Bytes written to the redo log", value=store.log_bytes_total
        )
        yield GaugeMetricFamily(
            "jobwire_store_redo_log_bytes",
            "Redo-log bytes not yet checkpointed into the database",
            value=store.redo_log_bytes(),
        )
        yield histogram(
            "jobwire_store_checkpoint_seconds", "Seconds a checkpoint took", store.checkpoint_times
        )
        yield GaugeMetricFamily(
            "jobwire_store_last_checkpoint_timestamp_seconds",
            "When the latest checkpoint ended (0: none since start)",
            value=store.checkpoint_at,
        )

    def _cluster(self) -> Iterator[Metric]:
        cluster: Any = self.service.runtime.cluster
        if cluster is None:  # not a node of a cluster (postgresql store)
            return
        yield GaugeMetricFamily(
            "jobwire_cluster_peers", "Other live nodes, as of the last heartbeat", cluster.peers
        )
        links = cluster.links
        yield GaugeMetricFamily(
            "jobwire_cluster_jobs_acknowledged",
            "Foreground jobs of this node's clients that another node acknowledged over a peer"
            " link and has not ended",
            links.acknowledged if links is not None else 0,
        )
        for name, text, value in (
            ("claimed", "Jobs this node claimed from the shared queue", cluster.claimed),
            ("released", "New jobs this node wrote to the shared queue", cluster.released),
            ("given", "Queued jobs this node gave to the shared queue when asked", cluster.given),
            (
                "requeued",
                "Jobs of dead nodes this node put back in the shared queue",
                cluster.requeued,
            ),
            (
                "handed",
                "Foreground jobs this node handed to another node over a peer link",
                links.handed if links is not None else 0,
            ),
            (
                "taken",
                "Foreground jobs other nodes handed to this node over a peer link",
                links.taken if links is not None else 0,
            ),
        ):
            yield CounterMetricFamily(f"jobwire_cluster_jobs_{name}", text, value=value)


def make_registry(service: OJSService) -> tuple[CollectorRegistry, EngineCollector]:
    registry = CollectorRegistry(auto_describe=False)
    collector = EngineCollector(service)
    registry.register(collector)
    return registry, collector


def metrics_handler(registry: CollectorRegistry) -> Callable[[web.Request], Any]:
    async def metrics(request: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    return metrics


def add_routes(router: web.UrlDispatcher, service: OJSService) -> None:
    async def ready(request: web.Request) -> web.Response:
        """Ready to take requests: the store answers and this server is the active one."""
        runtime = service.runtime
        if runtime.gate is not None and not runtime.admit():
            return reply({"status": "not_ready", "reason": "passive server of a pair"}, 503)
        return reply({"status": "ready"})

    router.add_get("/metrics", metrics_handler(service.metrics_registry))
    router.add_get("/ready", ready)
    router.add_get("/health", service.health)


async def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> web.AppRunner:
    """`serve --metrics-port`: `/metrics` alone, on a listener of its own."""
    app = web.Application()
    app.router.add_get("/metrics", metrics_handler(registry))
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_address=True).start()
    return runner
