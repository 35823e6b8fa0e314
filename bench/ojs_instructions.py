"""Instructions per OJS request: the server under callgrind, against the hello-world ceiling.

    .venv/bin/python bench/ojs_instructions.py                      # push, memory and SQLite
    .venv/bin/python bench/ojs_instructions.py --stores memory --requests 4000
    PYTHONPATH=/tmp/old/src .venv/bin/python bench/ojs_instructions.py   # another checkout

`bench/ojs_http.py` measures requests/s, which on a shared machine moves by tens of percent
between runs; this counts the user-space instructions the server process executes per
request (callgrind), which do not move with the load. The ceiling is the same hello-world
aiohttp handler as `ojs_http.py`'s (the same stack: aiohttp on uvloop, no access log).

Each server runs under callgrind, takes an unmeasured warm-up, has its counters zeroed,
serves `--requests` pushes (`POST /ojs/v1/jobs`, the body of `ojs_http.py`) over 16
keep-alive connections, each waiting for its reply before the next request, and has its
counters dumped. Every reply must be 201 (200 for the hello world). The SQLite store's syncer
and checkpoint processes are not traced: only the server's own loop.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import OUT, free_port, managed_processes
from instructions import _callgrind_control, _listening, _total
from ojs_http import CONNECTIONS, CONTENT_TYPE, HELLO, PUSH_BODY

#: Seconds a server may take to listen under valgrind (Python imports slowly there, and a
#: shared machine slows it further).
START_DEADLINE = 600.0


def push_request(port: int) -> bytes:
    body = PUSH_BODY.encode()
    head = (
        f"POST /ojs/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: {CONTENT_TYPE}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _connection(port: int, request: bytes, count: int, statuses: set[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(count):
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            if status not in statuses:
                rest = await reader.read(4096)
                raise RuntimeError(f"status {status}: {(head + rest).decode(errors='replace')}")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
    finally:
        writer.close()


def drive(port: int, requests: int, statuses: set[int]) -> None:
    """`requests` pushes over CONNECTIONS connections, one in flight per connection."""
    request = push_request(port)
    each, extra = divmod(requests, CONNECTIONS)

    async def main() -> None:
        await asyncio.gather(
            *(
                _connection(port, request, each + (1 if n < extra else 0), statuses)
                for n in range(CONNECTIONS)
            )
        )

    asyncio.run(main())


def measure(target: str, store: str, requests: int) -> float:
    """Instructions per push of `target` ("jobwire" or "hello")."""
    (OUT / "servers").mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"cg-ojs-{target}-", dir=OUT / "servers"))
    port = free_port()
    out = workdir / "callgrind.out"
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no"]
    if target == "hello":
        server = [sys.executable, "-c", HELLO, str(port)]
        statuses = {200}
    else:
        where = "memory" if store == "memory" else f"sqlite:{workdir / 'jobs.db'}"
        server = [sys.executable, "-m", "jobwire", "serve", "-L", "127.0.0.1"]
        server += ["--port", str(free_port()), "--http-port", str(port), "--zmq-port", "0"]
        # Count the work per request: a loop polling between requests adds its idle turns.
        server += ["--store", where, "--busy-poll", "0"]
        statuses = {201}
    with managed_processes() as procs:
        with open(workdir / "server.log", "wb") as log:
            proc = procs.spawn([*cmd, *server], stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
        try:
            end = time.monotonic() + START_DEADLINE
            while not _listening(port):
                if proc.poll() is not None or time.monotonic() > end:
                    raise RuntimeError(f"{target} did not start under valgrind (see {workdir})")
                time.sleep(0.2)
            drive(port, max(requests // 4, CONNECTIONS), statuses)  # warm-up
            _callgrind_control("-z", str(proc.pid))
            drive(port, requests, statuses)
            _callgrind_control("-d", str(proc.pid))
            dumps = sorted(workdir.glob("callgrind.out.*"), key=lambda p: p.stat().st_mtime)
            if not dumps:
                raise RuntimeError(f"callgrind wrote no dump in {workdir}")
            return _total(dumps[-1]) / requests
        finally:
            procs.stop(proc)
            for path in workdir.glob("jobs.db*"):
                path.unlink(missing_ok=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="memory,sqlite")
    parser.add_argument("--requests", type=int, default=3_000)
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    hello = measure("hello", "", args.requests)
    print(f"  hello world            {hello:>10,.0f} instr/request", flush=True)
    rows = []
    for store in args.stores.split(","):
        per = measure("jobwire", store.strip(), args.requests)
        rows.append((store, per))
        print(f"  jobwire {store:<14} {per:>10,.0f} instr/request", flush=True)
    print()
    print(f"{'server':<22} {'instr/request':>14}  x hello  own (over hello)")
    print(f"{'hello world':<22} {hello:>14,.0f}  {1:>7.2f}  -")
    for store, per in rows:
        print(f"{'jobwire ' + store:<22} {per:>14,.0f}  {per / hello:>7.2f}  {per - hello:,.0f}")
    print(f"# PYTHONPATH={os.environ.get('PYTHONPATH', '')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
