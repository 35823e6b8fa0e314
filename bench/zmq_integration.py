"""Which way of putting a ZeroMQ socket on the event loop is faster: pyzmq's `zmq.asyncio`,
or the socket's descriptor in `loop.add_reader` with non-blocking drains (jobwire's
`RouterSocket`, src/jobwire/server/zmq/sockets.py)?

    .venv/bin/python bench/zmq_integration.py                 # both, on uvloop and asyncio
    .venv/bin/python bench/zmq_integration.py --rounds 5 --duration 5

The workload is the same for both: one bound ROUTER that echoes every message to its
sender, on the same loop (uvloop, as `jobwire serve` runs, and the standard asyncio loop),
each in its own process; the load comes from another process with 4 DEALER sockets, 100
messages in flight each (16-byte, one frame), through pyzmq's blocking API. Reported:
echoed messages per second, and the server's CPU time per message (user + system, all
threads, from /proc): the steadier figure on a busy machine. Integrations alternate
within each round. Measurement, not a test.

The children run with `python -P`: this folder's zmq.py (`make bench-zmq`) would otherwise
shadow pyzmq.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
PAYLOAD = b"x" * 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------- servers


async def serve_asyncio(endpoint: str) -> None:
    import zmq.asyncio

    import zmq

    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.setsockopt(zmq.RCVHWM, 100_000)
    sock.bind(endpoint)
    print("ready", flush=True)
    while True:
        frames = await sock.recv_multipart()
        await sock.send_multipart(frames)


async def serve_add_reader(endpoint: str) -> None:
    import zmq
    from jobwire.server.zmq.sockets import RouterSocket

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    loop = asyncio.get_running_loop()
    router: RouterSocket | None = None

    def echo(identity: bytes, frames: list[bytes]) -> None:
        assert router is not None
        router.send(identity, frames)

    router = RouterSocket(ctx, loop, endpoint, echo, max_message=1 << 20)
    print("ready", flush=True)
    await asyncio.Event().wait()


def serve(mode: str, endpoint: str, loop_name: str) -> None:
    main = serve_asyncio if mode == "zmq.asyncio" else serve_add_reader
    if loop_name == "uvloop":
        import uvloop

        uvloop.run(main(endpoint))
    else:
        asyncio.run(main(endpoint))


# ---------------------------------------------------------------------------- load


def load(endpoint: str, clients: int, window: int, duration: float) -> None:
    """Blocking DEALERs; each keeps `window` messages in flight. Prints one JSON line."""
    import zmq

    ctx = zmq.Context()
    socks = []
    for _ in range(clients):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(endpoint)
        socks.append(s)
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
        for _ in range(window):
            s.send(PAYLOAD)
    done = 0
    start = time.perf_counter()
    warm_end = start + 1.0
    end = warm_end + duration
    counted = 0
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        for s, _ in poller.poll(100):
            while True:
                try:
                    s.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                done += 1
                if now >= warm_end:
                    counted += 1
                s.send(PAYLOAD)
    print(json.dumps({"messages": counted, "seconds": duration}), flush=True)


# ---------------------------------------------------------------------------- driver


def run_one(mode: str, loop_name: str, duration: float) -> dict[str, float]:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    child = [sys.executable, "-P", str(HERE)]
    server = subprocess.Popen(
        [*child, "--serve", mode, "--endpoint", endpoint, "--loop", loop_name],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "ready":
            raise SystemExit(f"the {mode} server did not start")
        before = cpu_seconds(server.pid)
        gen = subprocess.run(
            [*child, "--load", "--endpoint", endpoint, "--duration", str(duration)],
            capture_output=True,
            text=True,
            check=True,
        )
        cpu = cpu_seconds(server.pid) - before
        data = json.loads(gen.stdout.strip().splitlines()[-1])
    finally:
        server.kill()
        server.wait()
    rate = data["messages"] / data["seconds"]
    # The server's CPU covers the warm-up second too: per message over all it echoed.
    total = data["messages"] + rate  # about one more second's worth
    return {"msgs_per_s": rate, "cpu_us_per_msg": cpu / total * 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--loops", default="uvloop,asyncio")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--load", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--loop", default="uvloop", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.endpoint, args.loop)
        return 0
    if args.load:
        load(args.endpoint, 4, 100, args.duration)
        return 0

    modes = ["zmq.asyncio", "add_reader"]
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    print(f"loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    for round_no in range(1, args.rounds + 1):
        for loop_name in args.loops.split(","):
            for mode in modes if round_no % 2 else reversed(modes):
                r = run_one(mode, loop_name, args.duration)
                results.setdefault((loop_name, mode), []).append(r)
                print(
                    f"round {round_no} {loop_name:8s} {mode:12s} {r['msgs_per_s']:>9,.0f} msg/s"
                    f"  {r['cpu_us_per_msg']:.1f} us CPU/msg",
                    flush=True,
                )
    print(f"loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print()
    print("| loop | integration | msgs/s (best) | msgs/s (median) | server CPU us/msg (median) |")
    print("|---|---|---|---|---|")
    for (loop_name, mode), runs in results.items():
        rates = sorted(r["msgs_per_s"] for r in runs)
        cpus = sorted(r["cpu_us_per_msg"] for r in runs)
        print(
            f"| {loop_name} | {mode} | {rates[-1]:,.0f} | {rates[len(rates) // 2]:,.0f} "
            f"| {cpus[len(cpus) // 2]:.1f} |"
        )
    for loop_name in args.loops.split(","):
        a = results.get((loop_name, "add_reader"))
        b = results.get((loop_name, "zmq.asyncio"))
        if a and b:
            ra = sorted(r["msgs_per_s"] for r in a)[len(a) // 2]
            rb = sorted(r["msgs_per_s"] for r in b)[len(b) // 2]
            print(f"{loop_name}: add_reader / zmq.asyncio = {ra / rb:.2f}x (medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
