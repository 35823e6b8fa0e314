"""Helpers for the OjsWorker tests: a plain OJS HTTP client, workers in-process or as
processes, and the `hold` task's markers. Tests wait for conditions they can observe, up to a
generous deadline; no outcome depends on timing."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from jobwire.sdk.ojs_worker import OjsWorker
from tests.interop.gearman_raw import DEADLINE, wait_until
from tests.sdk import fixtures_ojs
from tests.sdk.support import REPO, child_env
from tests.servers import ServerProcess


class Ojs:
    """A plain HTTP client of a server's `/ojs/v1`."""

    def __init__(self, server: ServerProcess) -> None:
        self.url = f"http://127.0.0.1:{server.http_port}"

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + "/ojs/v1" + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=DEADLINE) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def push(self, job_type: str, args: list[Any], **options: Any) -> str:
        body: dict[str, Any] = {"type": job_type, "args": args}
        if options:
            body["options"] = options
        status, reply = self.call("POST", "/jobs", body)
        assert status == 201 or status == 200, reply
        return str(reply["job"]["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        status, reply = self.call("GET", f"/jobs/{job_id}")
        assert status == 200, reply
        job: dict[str, Any] = reply["job"]
        return job

    def wait_job(self, job_id: str, state: str) -> dict[str, Any]:
        return wait_until(
            lambda: (job := self.job(job_id))["state"] == state and job,
            f"job {job_id} {state}",
        )

    def worker(self, worker_id: str) -> dict[str, Any] | None:
        status, reply = self.call("GET", "/workers?protocol=ojs")
        assert status == 200, reply
        for row in reply["workers"]:
            if row["worker_id"] == worker_id:
                return dict(row)
        return None

    def worker_of_pid(self, pid: int) -> dict[str, Any] | None:
        status, reply = self.call("GET", "/workers?protocol=ojs")
        assert status == 200, reply
        rows = [row for row in reply["workers"] if row["pid"] == pid]
        return dict(rows[-1]) if rows else None

    def direct(self, worker_id: str, state: str) -> None:
        status, reply = self.call("POST", f"/admin/workers/{worker_id}/state", {"state": state})
        assert status == 200, reply


def new_worker(server: ServerProcess, **options: Any) -> OjsWorker:
    """An OjsWorker with the fixture tasks and quick test settings."""
    settings = dict(fixtures_ojs.SETTINGS)
    settings.update(options)
    worker = OjsWorker(f"http://127.0.0.1:{server.http_port}", **settings)
    worker.tasks = dict(fixtures_ojs.worker.tasks)
    return worker


@contextmanager
def serving(worker: OjsWorker) -> Iterator[threading.Thread]:
    """`worker` serving in a background thread (no signals there); stopped on exit."""
    thread = threading.Thread(target=worker.run, name="test-ojs-worker", daemon=True)
    thread.start()
    try:
        wait_until(lambda: worker.registrations >= 1, "the worker registered")
        yield thread
    finally:
        worker.stop()
        worker.stop()  # skip the grace period: what still runs is given back
        thread.join(DEADLINE)
        assert not thread.is_alive(), "worker did not stop"


class Markers:
    """The folder where `hold` tasks mark their start and wait for their release."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="jobwire-ojs-"))

    def args(self, name: str) -> list[str]:
        return [str(self.dir), name]

    def wait_started(self, name: str) -> None:
        wait_until(lambda: any(self.dir.glob(f"{name}.started.*")), f"{name} started")

    def release(self, name: str) -> None:
        (self.dir / f"{name}.release").touch()


class WorkerProcess:
    """`python -m jobwire worker --ojs URL tests.sdk.fixtures_ojs:worker`, log kept."""

    def __init__(self, server: ServerProcess) -> None:
        self.log_path = Path(tempfile.mkstemp(prefix="jobwire-ojs-worker-", suffix=".log")[1])
        command = [
            sys.executable,
            "-m",
            "jobwire",
            "worker",
            "--ojs",
            f"http://127.0.0.1:{server.http_port}",
            "tests.sdk.fixtures_ojs:worker",
            "--log-level",
            "DEBUG",
        ]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=child_env()
            )

    def wait(self) -> int:
        try:
            return self.proc.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker did not exit:\n{self.log()}") from None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
