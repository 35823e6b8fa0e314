"""Majordomo brokers side by side in one run: jobwire against the ZeroMQ Guide's reference
brokers and majortomo; one table.

    make bench-zmq                                    # everything, two rounds (best shown)
    .venv/bin/python bench/zmq.py --rounds 3 --duration 8
    .venv/bin/python bench/zmq.py --brokers jobwire-memory,zguide-c --scenarios serial

Brokers (each round starts each one afresh on a free port, for each scenario):
- jobwire-memory, jobwire-sqlite: `jobwire serve --store memory|sqlite:FILE --http-port 0
  --zmq-port P` (Gearman on another free port), with MDP 0.1 clients and workers, as the
  reference brokers get; jobwire-memory-0.2 is the same server with MDP 0.2 clients and
  workers (RFC 18), which the reference brokers do not speak. `--base OTHER/.venv/bin/jobwire`
  adds jobwire-base, another build as jobwire-memory runs, right after it in each round.
- zguide-py: the Guide's examples/Python/mdbroker.py (with MDP.py and zhelpers.py) under
  this bench's own venv's pyzmq; the copy is patched to bind the endpoint given on its
  command line (it binds tcp://*:5555) and for Python 3 in destroy().
- zguide-c: the Guide's examples/C/mdbroker.c (with mdp.h) built with `cc -O2` against
  Debian's libczmq 4: its czmq 1/2 calls (zctx, zsocket) are replaced by the zsock ones and
  it binds the endpoint given on its command line.
- majortomo: `python -m majortomo.broker` 0.2.0 from PyPI, as shipped (it logs every reply
  at INFO; the log goes to a file). It is not RFC 18: it keeps 0.1's empty first frame with
  MDPC02/MDPW02 headers, clients send REQUEST as 0x02 and get PARTIAL/FINAL as 0x03/0x04
  without a service frame. mdpbench speaks that variant to it (`--client-proto majortomo`),
  with the same pipelining as for the others; majortomo's own client allows one request in
  flight, its broker queues any number.

Everything fetched or built goes into bench/.zmq-peers/ (ignored by git):
- the Guide's sources from $ZGUIDE_DIR (a checkout or a bare clone), else
  bench/.zmq-peers/zguide, else /work/.mirror/booksbyus+zguide/repo; if none exists:
  `git clone --depth 1 https://github.com/booksbyus/zguide bench/.zmq-peers/zguide`;
- a venv, bench/.zmq-peers/venv, with pyzmq, majortomo==0.2.0 and six (majortomo 0.2.0
  imports six but does not declare it);
- mdpbench (bench/mdpbench/mdpbench.c) and the C broker need libzmq3-dev and libczmq-dev:
  when they are missing and this runs as root, it installs them with apt-get.

Scenarios (mdpbench, C on libzmq: see bench/mdpbench/mdpbench.c):
- async: 4 DEALER clients x 100 requests in flight, 4 echo workers; requests/s and latency
  over --duration seconds after 1 s of warm-up.
- serial: 1 client, 1 request in flight, 1 worker: the round trip's p50.

The ratios are the ones issue 34 sets as targets: jobwire's requests/s against 5x the Python
reference broker's and against the C one's, and its serial p50 against the C broker's, all
from this run. `cpu us/req` is the broker process's CPU time (all threads, user + system)
per request during the run: the steadier figure on a busy machine. Raw mdpbench JSON lines
go to bench/out/zmq-results.jsonl. Measurement, not a test: nothing asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import (
    OUT,
    REPO,
    Processes,
    ServerUnavailable,
    free_port,
    jobwire_path,
    machine_info,
    managed_processes,
    proc_counters,
)

PEERS = REPO / "bench" / ".zmq-peers"
VENV = PEERS / "venv"
MDPBENCH_SRC = REPO / "bench" / "mdpbench" / "mdpbench.c"
ZGUIDE_MIRROR = Path("/work/.mirror/booksbyus+zguide/repo")
ZGUIDE_CLONE = "git clone --depth 1 https://github.com/booksbyus/zguide bench/.zmq-peers/zguide"
MAJORTOMO = "majortomo==0.2.0"
#: Appended to every `jobwire serve` (--jobwire-args).
JOBWIRE_ARGS: list[str] = []

# ---------------------------------------------------------------------------- patches

#: (file, [(old, new), ...]): each `old` must occur exactly once in the Guide's file.
PY_PATCHES: dict[str, list[tuple[str, str]]] = {
    "mdbroker.py": [
        # bind the endpoint given as the last argument, not tcp://*:5555
        (
            '    broker.bind("tcp://*:5555")',
            '    broker.bind(sys.argv[-1] if sys.argv[-1].startswith("tcp://") '
            'else "tcp://*:5555")',
        ),
        # Python 3: dict views cannot be indexed
        (
            "self.delete_worker(self.workers.values()[0], True)",
            "self.delete_worker(list(self.workers.values())[0], True)",
        ),
    ],
}
C_PATCHES: dict[str, list[tuple[str, str]]] = {
    "mdbroker.c": [
        # czmq 4 has no zctx/zsocket: one zsock_t owns the socket (and the default context)
        (
            "    zctx_t *ctx;                //  Our context\n    void *socket;",
            "    zsock_t *socket;",
        ),
        (
            "    self->ctx = zctx_new ();\n    self->socket = zsocket_new (self->ctx, ZMQ_ROUTER);",
            "    self->socket = zsock_new (ZMQ_ROUTER);",
        ),
        ("        zctx_destroy (&self->ctx);", "        zsock_destroy (&self->socket);"),
        (
            "    zsocket_bind (self->socket, endpoint);",
            '    zsock_bind (self->socket, "%s", endpoint);',
        ),
        (
            "            { self->socket,  0, ZMQ_POLLIN, 0 } };",
            "            { zsock_resolve (self->socket),  0, ZMQ_POLLIN, 0 } };",
        ),
        ("    if (zctx_interrupted)", "    if (zsys_interrupted)"),
        # bind the endpoint given as the second argument (`mdbroker -q tcp://...`)
        (
            '    s_broker_bind (self, "tcp://*:5555");',
            '    s_broker_bind (self, argc > 2 ? argv [2] : "tcp://*:5555");',
        ),
    ],
}


def patched(text: str, edits: list[tuple[str, str]], name: str) -> str:
    for old, new in edits:
        if text.count(old) != 1:
            raise SystemExit(f"{name}: cannot apply the patch (the Guide's file changed): {old!r}")
        text = text.replace(old, new)
    return text


# ---------------------------------------------------------------------------- fetching


def zguide_dir() -> Path:
    env = os.environ.get("ZGUIDE_DIR")
    for candidate in ([Path(env)] if env else []) + [PEERS / "zguide", ZGUIDE_MIRROR]:
        if candidate.is_dir():
            return candidate
    raise SystemExit(f"the ZeroMQ Guide's sources are needed: set ZGUIDE_DIR, or {ZGUIDE_CLONE}")


def zguide_file(path: str) -> str:
    """A file of the Guide, from a checkout or from a (bare) git repository's HEAD."""
    root = zguide_dir()
    if (root / path).is_file():
        return (root / path).read_text()
    return subprocess.run(
        ["git", "-C", str(root), "show", f"HEAD:{path}"], capture_output=True, text=True, check=True
    ).stdout


def zguide_rev() -> str:
    root = zguide_dir()
    done = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() if done.returncode == 0 else str(root)


def ensure_debian_packages() -> None:
    """libzmq3-dev and libczmq-dev; apt-get install them when missing and we are root."""
    missing = [
        pkg
        for pkg, lib in (("libzmq3-dev", "libzmq"), ("libczmq-dev", "libczmq"))
        if subprocess.run(["pkg-config", "--exists", lib]).returncode != 0
    ]
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise SystemExit(f"needed: apt-get install {' '.join(missing)}")
    print("installing:", *missing, flush=True)
    subprocess.run(["apt-get", "install", "-y", "-q", *missing], check=True)


def build_c(src: Path, binary: Path, libs: list[str]) -> Path:
    if binary.exists() and binary.stat().st_mtime >= src.stat().st_mtime:
        return binary
    cmd = [os.environ.get("CC", "cc"), "-O2", "-o", str(binary), str(src), *libs]
    print("building:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return binary


def build_mdpbench() -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    return build_c(MDPBENCH_SRC, OUT / "mdpbench", ["-lzmq", "-lm"])


def prepare_zguide_c() -> Path:
    dest = PEERS / "mdbroker-c"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "mdp.h").write_text(zguide_file("examples/C/mdp.h"))
    text = patched(zguide_file("examples/C/mdbroker.c"), C_PATCHES["mdbroker.c"], "mdbroker.c")
    src = dest / "mdbroker.c"
    if not src.exists() or src.read_text() != text:
        src.write_text(text)
    return build_c(src, dest / "mdbroker", ["-lczmq", "-lzmq"])


def prepare_zguide_py() -> Path:
    dest = PEERS / "mdbroker-py"
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("mdbroker.py", "MDP.py", "zhelpers.py"):
        text = zguide_file(f"examples/Python/{name}")
        (dest / name).write_text(patched(text, PY_PATCHES.get(name, []), name))
    return dest / "mdbroker.py"


def peers_python() -> Path:
    python = VENV / "bin" / "python"
    if not python.exists():
        print("creating", VENV, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    check = "import zmq, majortomo.broker"
    if subprocess.run([str(python), "-c", check], capture_output=True).returncode != 0:
        pip = [str(python), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, "pyzmq", MAJORTOMO, "six"], check=True)
    return python


def peer_versions(python: Path) -> dict[str, str]:
    code = (
        "import zmq, importlib.metadata as m; "
        "print(zmq.__version__, zmq.zmq_version(), m.version('majortomo'))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True).stdout.split()
    czmq = subprocess.run(
        ["pkg-config", "--modversion", "libczmq", "libzmq"], capture_output=True, text=True
    ).stdout.split()
    return {
        "peers_pyzmq": out[0] if out else "?",
        "peers_libzmq": out[1] if len(out) > 1 else "?",
        "majortomo": out[2] if len(out) > 2 else "?",
        "debian_czmq": czmq[0] if czmq else "?",
        "debian_libzmq": czmq[1] if len(czmq) > 1 else "?",
        "zguide": zguide_rev(),
    }


# ---------------------------------------------------------------------------- brokers


@dataclass(frozen=True)
class Broker:
    name: str
    kind: str  # jobwire | zguide-py | zguide-c | majortomo
    store: str = "memory"
    proto: str = "mdp1"  # what mdpbench's clients and workers speak to it
    binary: str | None = None  # another build's `jobwire` (--base); None: jobwire_path()


BROKERS = [
    Broker("jobwire-memory", "jobwire"),
    Broker("jobwire-sqlite", "jobwire", store="sqlite"),
    Broker("jobwire-memory-0.2", "jobwire", proto="mdp2"),
    Broker("zguide-py", "zguide-py"),
    Broker("zguide-c", "zguide-c"),
    Broker("majortomo", "majortomo", proto="majortomo"),
]
BROKER_NAMES = [b.name for b in BROKERS]


@dataclass
class Paths:
    peers_python: Path
    zguide_py: Path | None
    zguide_c: Path | None


def broker_command(broker: Broker, port: int, workdir: Path, paths: Paths) -> list[str]:
    endpoint = f"tcp://127.0.0.1:{port}"
    if broker.kind == "jobwire":
        store = "memory" if broker.store == "memory" else f"sqlite:{workdir / 'jobwire.db'}"
        return [
            broker.binary or jobwire_path(), "serve", "-L", "127.0.0.1", "--port", str(free_port()),
            "--store", store, "--http-port", "0", "--zmq-port", str(port), *JOBWIRE_ARGS,
        ]  # fmt: skip
    if broker.kind == "zguide-py":
        assert paths.zguide_py is not None
        return [str(paths.peers_python), str(paths.zguide_py), endpoint]
    if broker.kind == "zguide-c":
        assert paths.zguide_c is not None
        return [str(paths.zguide_c), "-q", endpoint]
    return [str(paths.peers_python), "-m", "majortomo.broker", "-b", endpoint]


def start_broker(
    procs: Processes, broker: Broker, paths: Paths
) -> tuple[subprocess.Popen[bytes], int, Path]:
    (OUT / "servers").mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"{broker.name}-", dir=OUT / "servers"))
    port = free_port()
    cmd = broker_command(broker, port, workdir, paths)
    with open(workdir / "server.log", "wb") as log:
        proc = procs.spawn(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        if proc.poll() is not None:
            tail = (workdir / "server.log").read_text(errors="replace").strip().splitlines()
            raise ServerUnavailable(tail[-1] if tail else f"exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, port, workdir
        except OSError:
            time.sleep(0.05)
    procs.stop(proc)
    raise ServerUnavailable(f"{broker.name} did not listen on {port}")


# ---------------------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    args: tuple[str, ...]


SCENARIOS = [
    Scenario("async", "4 clients x 100 in flight, 4 echo workers",
             ("--clients", "4", "--pipeline", "100", "--workers", "4")),
    Scenario("serial", "1 client, 1 in flight, 1 worker",
             ("--clients", "1", "--pipeline", "1", "--workers", "1")),
]  # fmt: skip
SCENARIO_NAMES = [s.name for s in SCENARIOS]


@dataclass
class Result:
    data: dict[str, Any] = field(default_factory=dict)
    ok: bool = False
    cpu_us_per_req: float | None = None
    note: str = ""

    @property
    def rate(self) -> float:
        return float(self.data.get("requests_per_s", 0.0)) if self.ok else 0.0


def run_one(
    procs: Processes, mdpbench: Path, broker: Broker, scenario: Scenario, paths: Paths,
    duration: float,
) -> Result:  # fmt: skip
    try:
        proc, port, workdir = start_broker(procs, broker, paths)
    except ServerUnavailable as exc:
        return Result(note=f"unavailable: {exc}")
    try:
        time.sleep(0.3)  # let it settle (the SQLite store's syncer starts with the server)
        cmd = [
            str(mdpbench), "--endpoint", f"tcp://127.0.0.1:{port}", *scenario.args,
            "--client-proto", broker.proto, "--worker-proto", broker.proto,
            "--duration", str(duration), "--warmup", "1",
        ]  # fmt: skip
        before = proc_counters(proc.pid)
        bench = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 120)
        after = proc_counters(proc.pid)
        data: dict[str, Any] = {}
        for line in reversed(bench.stdout.splitlines()):
            if line.startswith("{"):
                data = json.loads(line)
                break
        result = Result(data, ok=bench.returncode == 0 and bool(data.get("complete")))
        replies = data.get("replies") or 0
        if before and after and replies:
            result.cpu_us_per_req = (after - before).cpu_s / replies * 1e6
        if not result.ok:
            result.note = (bench.stderr.strip().splitlines() or ["failed"])[-1][:120]
        if proc.poll() is not None:
            result.ok = False
            result.note = f"the broker exited ({proc.returncode})"
        return result
    finally:
        procs.stop(proc, grace=5)
        for path in workdir.glob("jobwire.db*"):
            path.unlink(missing_ok=True)


# ---------------------------------------------------------------------------- output


def best(results: list[Result], scenario: str) -> Result | None:
    ok = [r for r in results if r.ok]
    if not ok:
        return results[-1] if results else None
    if scenario == "serial":
        return min(ok, key=lambda r: r.data["p50_ms"])
    return max(ok, key=lambda r: r.rate)


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render(
    brokers: list[Broker], best_of: dict[tuple[str, str], Result | None], rounds: int
) -> str:
    def get(name: str, scenario: str) -> Result | None:
        result = best_of.get((name, scenario))
        return result if result and result.ok else None

    py = get("zguide-py", "async")
    c = get("zguide-c", "async")
    c_serial = get("zguide-c", "serial")
    head = [
        "broker", "req/s (4x100, 4 workers)", "p50 ms", "p99 ms", "cpu us/req",
        "serial p50 ms", "serial p99 ms", "x zguide-py", "x zguide-c", "serial p50 / C's",
    ]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for broker in brokers:
        a = get(broker.name, "async")
        s = get(broker.name, "serial")
        cells = [
            broker.name,
            f"{a.rate:,.0f}" if a else _why(best_of.get((broker.name, "async"))),
            fmt(a.data["p50_ms"] if a else None, ".2f"),
            fmt(a.data["p99_ms"] if a else None, ".2f"),
            fmt(a.cpu_us_per_req if a else None, ".1f"),
            fmt(s.data["p50_ms"] if s else None, ".3f")
            if s
            else _why(best_of.get((broker.name, "serial"))),
            fmt(s.data["p99_ms"] if s else None, ".3f"),
            fmt(a.rate / py.rate if a and py else None, ".2f"),
            fmt(a.rate / c.rate if a and c else None, ".2f"),
            fmt(s.data["p50_ms"] / c_serial.data["p50_ms"] if s and c_serial else None, ".2f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"best of {rounds} round(s) each; serial: the round with the lowest p50")
    for name in ("jobwire-memory", "jobwire-base", "jobwire-sqlite"):
        a, s = get(name, "async"), get(name, "serial")
        if not (a and s and py and c and c_serial):
            continue
        checks = [
            (f">= 5x zguide-py ({a.rate / py.rate:.2f}x)", a.rate >= 5 * py.rate),
            (f">= zguide-c ({a.rate / c.rate:.2f}x)", a.rate >= c.rate),
            (
                f"serial p50 <= zguide-c's ({s.data['p50_ms']:.3f} vs "
                f"{c_serial.data['p50_ms']:.3f} ms)",
                s.data["p50_ms"] <= c_serial.data["p50_ms"],
            ),
        ]
        text = "; ".join(f"{what}: {'met' if ok else 'NOT met'}" for what, ok in checks)
        lines.append(f"targets, {name}: {text}")
    return "\n".join(lines)


def _why(result: Result | None) -> str:
    if result is None:
        return "-"
    return f"failed: {result.note}" if result.note else "failed"


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--brokers", default=",".join(BROKER_NAMES), help=f"comma list of {', '.join(BROKER_NAMES)}"
    )
    parser.add_argument("--scenarios", default=",".join(SCENARIO_NAMES))
    parser.add_argument("--rounds", type=int, default=2, help="rounds per broker; best shown")
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per run")
    parser.add_argument("--results", type=Path, default=OUT / "zmq-results.jsonl")
    parser.add_argument("--jobwire-args", default="", help="more `jobwire serve` flags")
    parser.add_argument(
        "--base",
        metavar="JOBWIRE",
        help="another build's `jobwire` script: a broker"
        " jobwire-base (memory store, MDP 0.1), run right after jobwire-memory in each round",
    )
    args = parser.parse_args(argv)  # fmt: skip
    JOBWIRE_ARGS.extend(args.jobwire_args.split())

    wanted = args.brokers.split(",")
    unknown = set(wanted) - set(BROKER_NAMES)
    if unknown:
        parser.error(f"unknown broker(s): {', '.join(sorted(unknown))}")
    brokers = [b for b in BROKERS if b.name in wanted]
    if args.base:
        base = Broker("jobwire-base", "jobwire", binary=args.base)
        after = next((i + 1 for i, b in enumerate(brokers) if b.name == "jobwire-memory"), 0)
        brokers.insert(after, base)
    scenarios = [s for s in SCENARIOS if s.name in args.scenarios.split(",")]

    ensure_debian_packages()
    mdpbench = build_mdpbench()
    kinds = {b.kind for b in brokers}
    paths = Paths(
        peers_python=peers_python() if kinds & {"zguide-py", "majortomo"} else Path(sys.executable),
        zguide_py=prepare_zguide_py() if "zguide-py" in kinds else None,
        zguide_c=prepare_zguide_c() if "zguide-c" in kinds else None,
    )
    info = machine_info() | (peer_versions(paths.peers_python) if kinds - {"jobwire"} else {})
    info.pop("gearmand", None)
    print(json.dumps(info), flush=True)

    results: dict[tuple[str, str], list[Result]] = {}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with managed_processes() as procs, open(args.results, "a") as sink:
        for round_no in range(1, args.rounds + 1):
            for broker in brokers:  # alternate the brokers within each round
                for scenario in scenarios:
                    result = run_one(procs, mdpbench, broker, scenario, paths, args.duration)
                    results.setdefault((broker.name, scenario.name), []).append(result)
                    record = {"broker": broker.name, "scenario": scenario.name,
                              "round": round_no, "ok": result.ok, "note": result.note,
                              "cpu_us_per_req": result.cpu_us_per_req, **result.data,
                              "loadavg": os.getloadavg()[0], "time": time.time()}  # fmt: skip
                    sink.write(json.dumps(record) + "\n")
                    sink.flush()
                    d = result.data
                    cpu = fmt(result.cpu_us_per_req, ".1f")
                    print(
                        f"round {round_no} {broker.name:20s} {scenario.name:7s} "
                        + (f"{d['requests_per_s']:>10,.0f} req/s p50 {d['p50_ms']:.3f} ms "
                           f"p99 {d['p99_ms']:.3f} ms cpu/req {cpu} us"
                           if result.ok else f"FAILED {result.note}"),
                        flush=True,
                    )  # fmt: skip
    best_of = {key: best(runs, key[1]) for key, runs in results.items()}
    print()
    print(f"loadavg at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(render(brokers, best_of, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
