"""The peers' side of bench/e2e.py: Dramatiq, Celery, RQ and arq tasks, brokers and clients.

Imported only from bench/.venv-peers (which bench/e2e.py creates), by the peers' own worker
commands (`dramatiq e2e_peers`, `celery -A e2e_peers worker`, `rq worker` running
`e2e_peers.noop`, `arq e2e_peers.WorkerSettings`) and by e2e.py's client subprocesses
(`python -c "import e2e_peers; e2e_peers.main()" PHASE ...`). Which library is set up is chosen
by $E2E_SYSTEM (dramatiq-rabbitmq, dramatiq-redis, celery-redis, rq, arq): only that one is
imported. Every setting comes from the environment e2e.py passes down:

    E2E_SYSTEM      which peer
    E2E_REDIS_URL   redis://127.0.0.1:6379/N: the dedicated database (broker and results)
    E2E_AMQP_URL    amqp://guest:guest@127.0.0.1:5672/%2F
    E2E_QUEUE       the queue name (jobwire_e2e)
    E2E_ARQ_POLL    arq poll_delay in seconds, worker and result wait (unset: arq's 0.5 s)
    E2E_RQ_PLAIN    rq: enqueue with Queue.enqueue() in a loop instead of enqueue_many

Each no-op task does one thing: `record()` (bench/e2e.py), a 16-byte write into this
process's shared-memory counter, which is how e2e.py sees the last completion without adding
broker traffic. `noop` is the throughput task (no result stored where the library lets the
task say so); `noop_result` stores its result in the usual result backend, for the
submit-and-wait round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from e2e import record, time_round_trips

SYSTEM = os.environ.get("E2E_SYSTEM", "")
FAMILY = SYSTEM.split("-")[0]
REDIS_URL = os.environ.get("E2E_REDIS_URL", "redis://127.0.0.1:6379/13")
AMQP_URL = os.environ.get("E2E_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
QUEUE = os.environ.get("E2E_QUEUE", "jobwire_e2e")
ARQ_POLL = float(os.environ["E2E_ARQ_POLL"]) if os.environ.get("E2E_ARQ_POLL") else None
RQ_PLAIN = bool(os.environ.get("E2E_RQ_PLAIN"))
WAIT_S = 30  # how long one submit-and-wait may take before the run is called broken


def _redis_parts() -> tuple[str, int, int]:
    url = urlparse(REDIS_URL)
    return url.hostname or "127.0.0.1", url.port or 6379, int(url.path.strip("/") or 0)


# ---------------------------------------------------------------------------- dramatiq

if FAMILY == "dramatiq":
    import dramatiq
    from dramatiq.results import Results
    from dramatiq.results.backends import RedisBackend

    if SYSTEM == "dramatiq-rabbitmq":
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        broker: Any = RabbitmqBroker(url=AMQP_URL)
    else:
        from dramatiq.brokers.redis import RedisBroker

        broker = RedisBroker(url=REDIS_URL)
    broker.add_middleware(Results(backend=RedisBackend(url=REDIS_URL)))
    dramatiq.set_broker(broker)

    @dramatiq.actor(queue_name=QUEUE)
    def noop() -> None:
        record()

    @dramatiq.actor(queue_name=QUEUE, store_results=True)
    def noop_result() -> int:
        record()
        return 0


# ---------------------------------------------------------------------------- celery

elif FAMILY == "celery":
    from celery import Celery

    app = Celery("e2e_peers", broker=REDIS_URL, backend=REDIS_URL)
    app.conf.task_default_queue = QUEUE
    app.conf.broker_connection_retry_on_startup = True

    @app.task(name="e2e.noop", ignore_result=True)
    def noop() -> None:
        record()

    @app.task(name="e2e.noop_result")
    def noop_result() -> int:
        record()
        return 0


# ---------------------------------------------------------------------------- rq and arq

elif FAMILY in ("rq", "arq"):

    def noop() -> None:  # rq: imported by the worker as e2e_peers.noop
        record()

    def noop_result() -> int:
        record()
        return 0

    if FAMILY == "arq":
        from arq.connections import RedisSettings

        async def arq_noop(ctx: dict[str, Any]) -> int:
            record()
            return 0

        def arq_settings() -> Any:
            host, port, db = _redis_parts()
            return RedisSettings(host=host, port=port, database=db)

        class WorkerSettings:
            functions = [arq_noop]
            redis_settings = arq_settings()
            queue_name = QUEUE
            max_jobs = int(os.environ.get("E2E_SLOTS", "16"))
            if ARQ_POLL is not None:
                poll_delay = ARQ_POLL


# ---------------------------------------------------------------------------- clients


def _redis_client() -> Any:
    import redis

    return redis.Redis.from_url(REDIS_URL)


def prepare(slots: int) -> None:
    """Connect, make sure the workers are there, and (RabbitMQ) start from empty queues."""
    if SYSTEM == "dramatiq-rabbitmq":
        broker.flush_all()
    if FAMILY == "rq":
        from rq import Queue, Worker

        conn = _redis_client()
        queue = Queue(QUEUE, connection=conn)
        end = time.monotonic() + 60
        while Worker.count(queue=queue) < slots:
            if time.monotonic() > end:
                raise SystemExit(f"only {Worker.count(queue=queue)} of {slots} rq workers came up")
            time.sleep(0.1)


def cleanup() -> None:
    """Delete what this run left in RabbitMQ (Redis: e2e.py flushes the dedicated database)."""
    if SYSTEM == "dramatiq-rabbitmq":
        channel = broker.channel
        for name in (QUEUE, f"{QUEUE}.DQ", f"{QUEUE}.XQ"):
            channel.queue_delete(name)
        broker.close()


def submitter(n: int) -> Callable[[], None]:
    """A callable that enqueues `n` no-op jobs the library's usual way, connection already open."""
    if FAMILY == "dramatiq":
        if SYSTEM == "dramatiq-rabbitmq":
            broker.channel  # noqa: B018 - opens the connection
        else:
            broker.client.ping()

        def go() -> None:
            send = noop.send
            for _ in range(n):
                send()

        return go
    if FAMILY == "celery":

        def go() -> None:
            delay = noop.delay
            for _ in range(n):
                delay()

        return go
    if FAMILY == "rq":
        from rq import Queue

        conn = _redis_client()
        conn.ping()
        queue = Queue(QUEUE, connection=conn)

        def plain() -> None:  # the plain loop: a MULTI/EXEC round trip per job
            enqueue = queue.enqueue
            for _ in range(n):
                enqueue(noop)

        def go() -> None:  # enqueue_many: one pipeline per 1,000 jobs, RQ's bulk API
            left = n
            while left:
                chunk = min(left, 1000)
                queue.enqueue_many([Queue.prepare_data(noop) for _ in range(chunk)])
                left -= chunk

        return plain if RQ_PLAIN else go
    if FAMILY == "arq":
        from arq import create_pool

        loop = asyncio.new_event_loop()
        pool = loop.run_until_complete(create_pool(arq_settings(), default_queue_name=QUEUE))

        async def enqueue_all() -> None:
            for _ in range(n):
                await pool.enqueue_job("arq_noop")

        def go() -> None:
            loop.run_until_complete(enqueue_all())

        return go
    raise SystemExit(f"unknown E2E_SYSTEM {SYSTEM!r}")


def round_tripper() -> Callable[[], object]:
    """A callable that submits one job and waits for its result through the result backend."""
    if FAMILY == "dramatiq":
        backend = broker.get_results_backend()  # type: ignore[attr-defined]

        def once() -> object:
            message = noop_result.send()
            return backend.get_result(message, block=True, timeout=WAIT_S * 1000)

        return once
    if FAMILY == "celery":

        def once() -> object:
            return noop_result.delay().get(timeout=WAIT_S)

        return once
    if FAMILY == "rq":
        from rq import Queue

        queue = Queue(QUEUE, connection=_redis_client())

        def once() -> object:
            result = queue.enqueue(noop_result).latest_result(timeout=WAIT_S)
            if result is None:
                raise SystemExit("rq: no result within the wait")
            return result.return_value

        return once
    if FAMILY == "arq":
        from arq import create_pool

        loop = asyncio.new_event_loop()
        pool = loop.run_until_complete(create_pool(arq_settings(), default_queue_name=QUEUE))
        poll = ARQ_POLL if ARQ_POLL is not None else 0.5  # Job.result's own default

        async def one() -> object:
            job = await pool.enqueue_job("arq_noop")
            assert job is not None
            return await job.result(timeout=WAIT_S, poll_delay=poll)

        def once() -> object:
            return loop.run_until_complete(one())

        return once
    raise SystemExit(f"unknown E2E_SYSTEM {SYSTEM!r}")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="bench/e2e.py peer client (internal)")
    parser.add_argument("phase", choices=["prepare", "submit", "latency", "cleanup"])
    parser.add_argument("--jobs", type=int, default=0)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--budget", type=float, default=30.0)
    parser.add_argument("--warm", type=int, default=20)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    out: dict[str, Any] = {}
    if args.phase == "prepare":
        prepare(args.slots)
    elif args.phase == "cleanup":
        cleanup()
    elif args.phase == "submit":
        go = submitter(args.jobs)
        cpu0, t0 = _cpu(), time.monotonic()
        go()
        out = {"t0": t0, "t_enqueued": time.monotonic(), "cpu_s": _cpu() - cpu0}
    else:
        out = time_round_trips(round_tripper(), args)
    print(json.dumps(out), flush=True)
    return 0
