"""In-process CPU cost of the Gearman hot paths, without sockets or other load.

Feeds pre-built request streams into a GearmanConnection with a fake transport and reports
microseconds of process CPU per job. Steadier than the end-to-end figures on a busy machine,
so use it to compare two versions of the code:

    .venv/bin/python bench/micro.py
    PYTHONPATH=/tmp/old/src .venv/bin/python bench/micro.py   # another checkout's src/
"""

from __future__ import annotations

import asyncio
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

from jobwire.engine import Engine, EngineConfig
from jobwire.engine.events import EventLog
from jobwire.server.app import tune_gc
from jobwire.server.gearman import GearmanConnection, GearmanOptions, GearmanServer
from jobwire.server.runtime import Runtime
from jobwire.store.sqlite import SQLiteStore

HEADER = struct.Struct(">4sII")
JOBS = 100_000
BATCH = 64  # packets per read, as a pipelining client delivers them


def request(ptype: int, *args: bytes) -> bytes:
    body = b"\0".join(args)
    return HEADER.pack(b"\0REQ", ptype, len(body)) + body


class FakeTransport:
    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


def connect(server: GearmanServer) -> GearmanConnection:
    conn = server.protocol_factory()
    conn.connection_made(FakeTransport())  # type: ignore[arg-type]
    return conn


def measure(name: str, run: Any) -> None:
    start = time.process_time()
    run()
    cpu = time.process_time() - start
    print(f"{name:<26} {cpu / JOBS * 1e6:6.2f} us/job")


def main() -> None:
    tune_gc()  # as the server does
    loop = asyncio.new_event_loop()
    engine = Engine(EngineConfig(id_prefix="H:bench"))
    runtime = Runtime(engine, loop)
    server = GearmanServer(runtime, GearmanOptions())
    client = connect(server)
    worker = connect(server)

    submits = [
        b"".join(request(18, b"f", b"", b"x" * 16) for _ in range(BATCH))
        for _ in range(JOBS // BATCH)
    ]

    # Write what a turn batched, as the loop's end-of-turn callback would.
    end_turn = runtime.flush_all

    def enqueue() -> None:
        for chunk in submits:
            client.data_received(chunk)
            end_turn()

    measure("enqueue (bg submit)", enqueue)

    worker.data_received(request(1, b"f"))
    grab = request(9)

    def drain() -> None:
        for _ in range(JOBS // BATCH * BATCH):
            worker.data_received(grab)
            end_turn()
            job = next(iter(worker.worker.jobs)) if worker.worker and worker.worker.jobs else None
            if job is not None:
                worker.data_received(request(13, job.encode(), b"ok"))
                end_turn()

    measure("drain (grab+complete)", drain)

    fg = request(7, b"f", b"", b"x" * 16)

    def foreground() -> None:
        for _ in range(JOBS // BATCH * BATCH):
            client.data_received(fg)
            end_turn()
            worker.data_received(grab)
            end_turn()
            assert worker.worker is not None
            handle = next(iter(worker.worker.jobs))
            worker.data_received(request(13, handle.encode(), b"ok"))
            end_turn()

    measure("fg (submit..complete)", foreground)
    loop.close()
    enqueue_on_loop(submits, "enqueue, memory, loop")
    enqueue_on_loop(submits, "enqueue, with event log", events=True)
    enqueue_on_loop(submits, "enqueue, sqlite no sync", durable=True)
    enqueue_on_loop(submits, "enqueue, sqlite, event log", events=True, durable=True)


def enqueue_on_loop(
    submits: list[bytes], name: str, *, events: bool = False, durable: bool = False
) -> None:
    """Enqueue with the loop running between reads, as a server does. `events`: with the
    event log the HTTP listener keeps; `durable`: the SQLite store's loop-side work (rows,
    redo log frames, held replies) without syncs (fsync policy `off` reports each frame as
    soon as it is written)."""
    loop = asyncio.new_event_loop()
    with tempfile.TemporaryDirectory() as directory:
        store = SQLiteStore(Path(directory) / "micro.db", fsync="off") if durable else None
        engine = Engine(EngineConfig(id_prefix="H:bench"), store=store)
        if events:
            # as the HTTP listener sets it
            engine.event_log = EventLog(clock=engine.clock)
        runtime = Runtime(engine, loop)
        server = GearmanServer(runtime, GearmanOptions())
        client = connect(server)

        async def turns() -> None:
            for chunk in submits:
                client.data_received(chunk)
                runtime.flush_all()
                await asyncio.sleep(0)  # the store's end-of-turn hand-off
                await asyncio.sleep(0)  # its report, which releases the replies

        measure(name, lambda: loop.run_until_complete(turns()))
        loop.run_until_complete(asyncio.sleep(0))
        if store is not None:
            store.close()
    loop.close()


if __name__ == "__main__":
    main()
