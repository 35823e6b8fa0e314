"""Process plumbing shared by the benchmark scripts (bench/run.py, bench/memory.py).

Builds gearbench, starts servers on free ports (each in its own process and session), runs
gearbench against them, and makes sure every process started here dies when the script
exits: normally, on an exception, on Ctrl-C or on SIGTERM (and, on Linux, even if this
script is killed outright, through PR_SET_PDEATHSIG).

This is measurement code, not a test: nothing here asserts on time.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "out"
START_DEADLINE = 30.0
#: Appended to every `jobwire serve`; override with $JOBWIRE_ARGS (split on whitespace).
JOBWIRE_EXTRA_ARGS = os.environ.get("JOBWIRE_ARGS", "--http-port 0 --zmq-port 0").split()
STOP_GRACE = 15.0


# ---------------------------------------------------------------------------- processes


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it if this script dies without cleaning up."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the try/finally cleanup still applies
        pass


class Processes:
    """Every child process started by a script; `kill_all()` ends them, newest first."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, cmd: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            list(cmd), start_new_session=True, preexec_fn=_die_with_parent, **kwargs
        )
        self._procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes], grace: float = STOP_GRACE) -> int:
        """SIGTERM, then SIGKILL after `grace` seconds; returns the exit status."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
        with contextlib.suppress(ValueError):
            self._procs.remove(proc)
        return proc.returncode

    def kill_all(self) -> None:
        for proc in reversed(self._procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        self._procs.clear()


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def managed_processes() -> Iterator[Processes]:
    """A `Processes` whose children are all killed when the block exits, however it exits."""
    previous = {
        sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)
    }
    procs = Processes()
    try:
        yield procs
    finally:
        procs.kill_all()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# ---------------------------------------------------------------------------- gearbench


def gearbench_source() -> Path:
    """$GEARBENCH_SRC, or ../shared/bench/gearbench.c next to the repository."""
    env = os.environ.get("GEARBENCH_SRC")
    return Path(env).resolve() if env else REPO.parent / "shared" / "bench" / "gearbench.c"


def build_gearbench(out: Path = OUT) -> Path:
    """Compile gearbench with `cc -O2` into bench/out/ (again only if the source is newer)."""
    src = gearbench_source()
    if not src.is_file():
        raise SystemExit(f"gearbench source not found at {src} (set GEARBENCH_SRC)")
    out.mkdir(parents=True, exist_ok=True)
    binary = out / "gearbench"
    if binary.exists() and binary.stat().st_mtime >= src.stat().st_mtime:
        return binary
    cc = os.environ.get("CC", "cc")
    cmd = [cc, "-O2", "-o", str(binary), str(src)]
    print("building:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return binary


@dataclass
class BenchResult:
    """One gearbench run: its JSON line (or whatever it managed to print) and exit status."""

    args: list[str]
    returncode: int
    data: dict[str, Any]
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and bool(self.data.get("complete"))

    @property
    def jobs_per_s(self) -> float | None:
        value = self.data.get("jobs_per_s")
        return float(value) if value is not None else None


def run_gearbench(
    procs: Processes,
    binary: Path,
    port: int,
    args: Sequence[str],
    *,
    timeout: float,
) -> BenchResult:
    """Run gearbench to completion against 127.0.0.1:`port`; `timeout` is its own --timeout."""
    cmd = [str(binary), "--host", "127.0.0.1", "--port", str(port), *args]
    cmd += ["--timeout", str(timeout)]
    proc = procs.spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = proc.communicate(timeout=timeout + 30)
    except subprocess.TimeoutExpired:
        procs.stop(proc, grace=1)
        return BenchResult(cmd, -1, {}, "gearbench did not exit")
    procs.stop(proc)
    data: dict[str, Any] = {}
    for line in reversed(stdout.decode(errors="replace").splitlines()):
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                data = json.loads(line)
                break
    return BenchResult(cmd, proc.returncode, data, stderr.decode(errors="replace").strip())


# ---------------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gearmand_path() -> str:
    found = shutil.which("gearmand")
    if found:
        return found
    if os.path.exists("/usr/sbin/gearmand"):
        return "/usr/sbin/gearmand"
    raise ServerUnavailable("gearmand is not installed (apt-get install gearman-job-server)")


def jobwire_path() -> str:
    """The `jobwire` script next to this interpreter (the venv's), else the one on PATH."""
    env = os.environ.get("JOBWIRE_BIN")
    if env:
        return env
    local = Path(sys.executable).parent / "jobwire"
    if local.exists():
        return str(local)
    found = shutil.which("jobwire")
    if found:
        return found
    raise ServerUnavailable("jobwire is not installed (make install)")


#: When set (see `use_jobwire_rev`), jobwire runs from this source tree, not the working tree.
_jobwire_src: Path | None = None


def use_jobwire_rev(rev: str) -> str:
    """Serve jobwire from commit `rev`'s src/ (exported into bench/out/) with this interpreter.

    The working tree may be mid-edit; a commit is a fixed thing to measure. Dependencies still
    come from the venv. Returns the short commit id.
    """
    global _jobwire_src
    short = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dest = OUT / f"jobwire-{short}"
    if not (dest / "src" / "jobwire").is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", short, "src"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    _jobwire_src = dest / "src"
    return short


class ServerUnavailable(Exception):
    """The server could not be started in this build or on this machine."""


@dataclass(frozen=True)
class ServerSpec:
    """How to start one server configuration."""

    name: str
    kind: str  # "gearmand" or "jobwire"
    threads: int | None = None  # gearmand -t; None: its default
    store: str = "memory"  # jobwire: "memory" or "sqlite"
    pure: bool = False  # jobwire: run the hot modules' .py sources, not the compiled build
    #: jobwire: also the HTTP listener (on a free port): the OJS service, its event log and
    #: metrics, the dashboard, as most servers run (the "-http" servers).
    http: bool = False
    args: tuple[str, ...] = ()  # jobwire: more options for `jobwire serve`

    def command(self, port: int, workdir: Path) -> list[str]:
        if self.kind == "gearmand":
            cmd = [gearmand_path(), "-L", "127.0.0.1", "-p", str(port), "-l", "none"]
            if self.threads is not None:
                cmd += ["-t", str(self.threads)]
            return cmd
        store = "memory" if self.store == "memory" else f"sqlite:{workdir / 'jobwire.db'}"
        exe = [sys.executable, "-m", "jobwire"] if _jobwire_src else [jobwire_path()]
        cmd = [*exe, "serve", "-L", "127.0.0.1", "--port", str(port), "--store", store]
        # Gearman only, like gearmand: no HTTP listener (it would also fight over port 8080
        # between servers, and with HTTP on, finished jobs are retained for status queries),
        # unless the spec asks for it (the last --http-port given wins).
        cmd = [*cmd, *JOBWIRE_EXTRA_ARGS]
        if self.http:
            cmd += ["--http-port", str(free_port())]
        return [*cmd, *self.args]


GEARMAND_DEFAULT = ServerSpec("gearmand", "gearmand")
GEARMAND_T1 = ServerSpec("gearmand -t1", "gearmand", threads=1)
JOBWIRE_MEMORY = ServerSpec("jobwire-memory", "jobwire", store="memory")
JOBWIRE_SQLITE = ServerSpec("jobwire-sqlite", "jobwire", store="sqlite")
JOBWIRE_MEMORY_PURE = ServerSpec("jobwire-memory-pure", "jobwire", store="memory", pure=True)
#: With the HTTP listener (metrics and the event log on): compare with the two above in one run.
JOBWIRE_MEMORY_HTTP = ServerSpec("jobwire-memory-http", "jobwire", store="memory", http=True)
JOBWIRE_SQLITE_HTTP = ServerSpec("jobwire-sqlite-http", "jobwire", store="sqlite", http=True)
#: HTTP on without the event log: /metrics counting alone, against the "-http" servers (both)
#: and the plain ones (neither).
NO_EVENT_LOG = ("--event-log-size", "0")
JOBWIRE_MEMORY_METRICS = ServerSpec(
    "jobwire-memory-metrics", "jobwire", store="memory", http=True, args=NO_EVENT_LOG
)
JOBWIRE_SQLITE_METRICS = ServerSpec(
    "jobwire-sqlite-metrics", "jobwire", store="sqlite", http=True, args=NO_EVENT_LOG
)


@dataclass
class Server:
    spec: ServerSpec
    proc: subprocess.Popen[bytes]
    port: int
    workdir: Path
    command: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, lines: int = 5) -> str:
        path = self.workdir / "server.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").strip().splitlines()[-lines:])


def start_server(procs: Processes, spec: ServerSpec, label: str = "") -> Server:
    """Start `spec` on a free port in a fresh work directory; wait until it accepts."""
    (OUT / "servers").mkdir(parents=True, exist_ok=True)
    prefix = f"{spec.name.replace(' ', '')}-{label}-" if label else f"{spec.name}-"
    workdir = Path(tempfile.mkdtemp(prefix=prefix, dir=OUT / "servers"))
    port = free_port()
    cmd = spec.command(port, workdir)
    env = None
    if spec.kind == "jobwire" and _jobwire_src is not None:
        env = os.environ | {"PYTHONPATH": str(_jobwire_src)}
    if spec.pure:
        env = (env or dict(os.environ)) | {"JOBWIRE_PURE": "1"}
    with open(workdir / "server.log", "wb") as log:
        proc = procs.spawn(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, env=env)
    server = Server(spec, proc, port, workdir, cmd)
    end = time.monotonic() + START_DEADLINE
    while time.monotonic() < end:
        if proc.poll() is not None:
            procs.stop(proc)
            reason = server.log_tail(1) or f"exited with status {proc.returncode}"
            raise ServerUnavailable(reason)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server
        except OSError:
            time.sleep(0.02)
    procs.stop(proc)
    raise ServerUnavailable(f"did not listen on port {port} within {START_DEADLINE:.0f}s")


def stop_server(procs: Processes, server: Server, keep_files: bool = False) -> int:
    code = procs.stop(server.proc)
    if not keep_files:  # keep the log, drop the (possibly large) database files
        for path in server.workdir.glob("jobwire.db*"):
            path.unlink(missing_ok=True)
    return code


# ---------------------------------------------------------------------------- probes


def rss_kib(pid: int) -> int:
    """VmRSS of `pid` in KiB, from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


@dataclass(frozen=True)
class ProcCounters:
    """CPU time (all threads) and read/write syscall counts of a process, from /proc."""

    cpu_s: float
    syscr: int
    syscw: int

    def __sub__(self, other: ProcCounters) -> ProcCounters:
        return ProcCounters(
            self.cpu_s - other.cpu_s, self.syscr - other.syscr, self.syscw - other.syscw
        )


def proc_counters(pid: int) -> ProcCounters | None:
    """None when /proc does not tell (not Linux, or the process is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        io = Path(f"/proc/{pid}/io").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # fields[0] is the state, field 3 of stat(5)
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    values = dict(line.split(": ", 1) for line in io.splitlines() if ": " in line)
    return ProcCounters(cpu, int(values.get("syscr", 0)), int(values.get("syscw", 0)))


def admin_status(port: int, timeout: float = 30.0) -> dict[str, tuple[int, int, int]]:
    """The admin `status` command: function -> (queued, running, workers)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(b"status\n")
        buf = b""
        while not (buf == b".\n" or buf.endswith(b"\n.\n")):
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
    result: dict[str, tuple[int, int, int]] = {}
    for line in buf.decode(errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) == 4:
            result[parts[0]] = (int(parts[1]), int(parts[2]), int(parts[3]))
    return result


_ECHO = """import socket, sys
peer = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while data := peer.recv(64):
    peer.sendall(data)
"""


def wakeup_us(rounds: int = 2_000) -> float:
    """p50 of a 1-byte TCP ping-pong with another process over loopback, in microseconds.

    What waking a peer costs on this machine right now: a serial round trip through a server
    is a few of these, so it says how busy the host was when a run's latencies were taken.
    """
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        child = subprocess.Popen([sys.executable, "-c", _ECHO, str(port)])
        listener.settimeout(30)
        conn, _ = listener.accept()
    samples = []
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        clock = time.perf_counter
        for _ in range(rounds):
            start = clock()
            conn.sendall(b"x")
            conn.recv(64)
            samples.append(clock() - start)
    child.wait(timeout=30)
    return statistics.median(samples[rounds // 10 :]) * 1e6


def machine_info() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    rev = ""
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        rev = subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    gearmand = ""
    with contextlib.suppress(OSError, subprocess.CalledProcessError, ServerUnavailable):
        gearmand = subprocess.run(
            [gearmand_path(), "--version"], capture_output=True, text=True, check=True
        ).stdout.strip()
    build = ""  # whether the hot path runs compiled (`jobwire --version`)
    with contextlib.suppress(OSError, subprocess.CalledProcessError, ServerUnavailable):
        exe = [sys.executable, "-m", "jobwire"] if _jobwire_src else [jobwire_path()]
        env = os.environ | {"PYTHONPATH": str(_jobwire_src)} if _jobwire_src else None
        build = subprocess.run(
            [*exe, "--version"], capture_output=True, text=True, check=True, env=env
        ).stdout.strip()
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "kernel": os.uname().release,
        "python": sys.version.split()[0],
        "jobwire_rev": rev,
        "jobwire_build": build,
        "gearmand": gearmand,
        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "wakeup_us": round(wakeup_us(), 1),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def ensure_venv(venv: Path, requirements: Sequence[str]) -> None:
    """A bench venv holding the peers' pinned packages (made once; a stamp file remembers
    what it holds, so a changed pin installs again)."""
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    wanted = "\n".join(requirements)
    if stamp.exists() and stamp.read_text() == wanted and python.exists():
        return
    print(f"setting up {venv} ...", flush=True)
    if not python.exists():
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *requirements], check=True)
    stamp.write_text(wanted)
