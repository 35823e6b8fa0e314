"""Observability (the OJS observability extension): `GET /metrics` in the Prometheus text
exposition format, `GET /ready`, and `GET /health` beside `/ojs/v1/health`.

The metrics cost the hot path one dict increment per job event, and only when the HTTP
listener is on: the engine records each transition in its event log (`EventLog.observe`),
which counts it by type and queue (`EventLog.counts`). Everything else (queue depth, workers
by protocol and state) is read from the engine when Prometheus scrapes, by a collector
(`EngineCollector`) in a registry of this service's own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from jobwire.engine.worker import WorkerState
from jobwire.server.ojs.http import reply

if TYPE_CHECKING:
    from jobwire.server.ojs.app import OJSService

#: Counters: metric name -> (help, the job events it sums).
COUNTERS = {
    "jobwire_jobs_submitted": (
        "Jobs submitted, by queue (every protocol)",
        ("job.enqueued", "job.scheduled"),
    ),
    "jobwire_jobs_started": ("Jobs handed to a worker (each attempt), by queue", ("job.started",)),
    "jobwire_jobs_completed": ("Jobs completed, by queue", ("job.completed",)),
    "jobwire_jobs_failed": ("Jobs failed for good (discarded), by queue", ("job.discarded",)),
    "jobwire_jobs_retried": ("Failed attempts to be run again, by queue", ("job.retrying",)),
    "jobwire_jobs_cancelled": ("Jobs cancelled, by queue", ("job.cancelled",)),
}


class EngineCollector(Collector):
    """The engine's figures, read when scraped."""

    def __init__(self, service: OJSService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        service = self.service
        counts = service.events.counts
        for name, (text, events) in COUNTERS.items():
            family = CounterMetricFamily(name, text, labels=["queue"])
            totals: Counter[str] = Counter()
            for event in events:
                totals.update(counts.get(event, {}))
            for queue, value in sorted(totals.items()):
                family.add_metric([queue], value)
            yield family
        depth = GaugeMetricFamily(
            "jobwire_queue_depth", "Jobs ready in the queue", labels=["queue"]
        )
        paused = GaugeMetricFamily(
            "jobwire_queue_paused", "1 while the queue is paused", labels=["queue"]
        )
        for queue, info in sorted(service.engine.queues.items()):
            depth.add_metric([queue], info.available)
            paused.add_metric([queue], 1 if info.paused else 0)
        yield depth
        yield paused
        dead = GaugeMetricFamily("jobwire_dead_letter_jobs", "Jobs in the dead letter queue")
        dead.add_metric([], len(service.dead_letter))
        yield dead
        workers = GaugeMetricFamily(
            "jobwire_workers",
            "Connected workers, by protocol and state",
            labels=["protocol", "state"],
        )
        live = Counter(
            (s.protocol, s.state.value)
            for s in service.engine.workers.values()
            if s.state is not WorkerState.TERMINATED
        )
        for (protocol, state), value in sorted(live.items()):
            workers.add_metric([protocol, state], value)
        yield workers


def add_routes(router: web.UrlDispatcher, service: OJSService) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(service))

    async def metrics(request: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def ready(request: web.Request) -> web.Response:
        """Ready to take requests: the store answers and this server is the active one."""
        runtime = service.runtime
        if runtime.gate is not None and not runtime.admit():
            return reply({"status": "not_ready", "reason": "passive server of a pair"}, 503)
        return reply({"status": "ready"})

    router.add_get("/metrics", metrics)
    router.add_get("/ready", ready)
    router.add_get("/health", service.health)
