"""WMP with real processes: SDK workers (`jobwire worker --wmp`), devices (`jobwire
device`) and several managers; many-to-many with every job done exactly once; chained
devices; cross-protocol both ways; CANCEL reaching a running task; the worker's lock
timeout and re-READY."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import zmq
from jobwire.protocols.zmq import wmp
from jobwire.sdk.wmp import WmpJob, WmpWorker
from tests.interop.gearman_raw import Cmd, GearmanSocket, status
from tests.ojs.dsl import Runner
from tests.servers import ServerProcess
from tests.zmq.wmp_support import (
    Process,
    RawWorker,
    endpoint,
    start_device,
    start_manager,
    start_worker,
    task_lines,
    wait_until,
)


class Cluster:
    """Managers, devices and workers for one test; all stopped at the end."""

    def __init__(self) -> None:
        self.managers: list[ServerProcess] = []
        self.processes: list[Process] = []

    def manager(self) -> ServerProcess:
        server = start_manager()
        self.managers.append(server)
        return server

    def device(self, managers: list[str]) -> Process:
        device = start_device(managers)
        self.processes.append(device)
        return device

    def worker(self, managers: list[str], task_log: Path, **options: Any) -> Process:
        worker = start_worker(managers, task_log, **options)
        self.processes.append(worker)
        return worker

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        for server in self.managers:
            assert server.stop() == 0, server.log()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    made = Cluster()
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture
def context() -> Iterator[zmq.Context[Any]]:
    made: zmq.Context[Any] = zmq.Context()
    yield made
    made.destroy(linger=0)


def test_sdk_worker_runs_a_gearman_job_and_its_progress_reaches_the_client(
    cluster: Cluster, tmp_path: Path
) -> None:
    manager = cluster.manager()
    cluster.worker([endpoint(manager)], tmp_path / "tasks.log")
    with GearmanSocket(manager) as client:
        client.send(Cmd.SUBMIT_JOB, "progress", "", b"go")
        handle = client.expect(Cmd.JOB_CREATED).args[0]
        assert client.expect(Cmd.WORK_STATUS).args == (handle, b"1", b"2")
        assert client.expect(Cmd.WORK_DATA).args == (handle, b"half")
        assert client.expect(Cmd.WORK_COMPLETE).args == (handle, b"done")


def test_sdk_worker_runs_an_ojs_job(cluster: Cluster, tmp_path: Path) -> None:
    manager = cluster.manager()
    cluster.worker([endpoint(manager)], tmp_path / "tasks.log")
    http = Runner(f"http://127.0.0.1:{manager.http_port}")
    job_id = http.request("POST", "/ojs/v1/jobs", {"type": "echo", "args": ["a"]}).body["job"]["id"]
    wait_until(
        lambda: http.request("GET", f"/ojs/v1/jobs/{job_id}").body["job"]["state"] == "completed",
        "the OJS job completed on the WMP worker",
    )
    assert task_lines(tmp_path / "tasks.log")[0][2] == job_id


def test_many_to_many_three_managers_two_devices_four_workers(
    cluster: Cluster, tmp_path: Path
) -> None:
    managers = [cluster.manager() for _ in range(3)]
    ends = [endpoint(m) for m in managers]
    devices = [cluster.device(ends) for _ in range(2)]
    task_log = tmp_path / "tasks.log"
    for number in range(4):
        cluster.worker([d.endpoint for d in devices], task_log, slots=2, name=f"w{number}")
    per_manager = 12
    handles: set[tuple[str, str]] = set()
    for manager in managers:
        with GearmanSocket(manager) as client:
            for n in range(per_manager):
                client.send(Cmd.SUBMIT_JOB_BG, "echo", "", f"job {n}".encode())
                handles.add((manager.address, client.expect(Cmd.JOB_CREATED).args[0].decode()))
    for manager in managers:
        wait_until(lambda m=manager: status(m).get("echo", (1, 0, 0))[0] == 0, "all jobs done")
    lines = task_lines(task_log)
    runs = Counter((line[1], line[2]) for line in lines)
    assert len(lines) == 3 * per_manager
    assert all(count == 1 for count in runs.values()), runs  # every job exactly once
    assert len({manager for manager, _ in runs}) == 3  # TAKE named each end manager
    assert Counter(manager for manager, _ in runs) == {m: per_manager for m, _ in runs}


def test_a_device_forwards_ready_to_all_managers_and_routes_the_rest_by_via(
    cluster: Cluster, context: zmq.Context[Any]
) -> None:
    first, second = cluster.manager(), cluster.manager()
    device = cluster.device([endpoint(first), endpoint(second)])
    worker = RawWorker(context, device.endpoint)
    worker.ready()
    for manager in (first, second):
        wait_until(lambda m=manager: status(m).get("echo", (0, 0, 0))[2] == 1, "READY forwarded")
    with GearmanSocket(second) as client:
        client.send(Cmd.SUBMIT_JOB, "echo", "", b"via")
        handle = client.expect(Cmd.JOB_CREATED).args[0]
        wake = worker.expect(wmp.WAKE)
        assert wake.get("via") == "1"  # the device's link to the second manager
        worker.send(wmp.GIVE, {"slot": "0", "via": wake.get("via")})
        take = worker.expect(wmp.TAKE)
        assert take.get("job") == handle.decode() and take.get("via") == "1"
        worker.send(wmp.DONE, {"job": take.get("job"), "via": take.get("via")}, [b"VIA"])
        assert client.expect(Cmd.WORK_COMPLETE).args == (handle, b"VIA")
    # A GIVE the device cannot route is answered ERROR by the device.
    worker.send(wmp.GIVE, {"slot": "0"})
    assert "via" in worker.expect(wmp.ERROR).get("reason")
    worker.send(wmp.GIVE, {"slot": "0", "via": "9"})
    assert "link 9" in worker.expect(wmp.ERROR).get("reason")


def test_chained_devices(cluster: Cluster, context: zmq.Context[Any], tmp_path: Path) -> None:
    manager = cluster.manager()
    upper = cluster.device([endpoint(manager)])
    lower = cluster.device([upper.endpoint])
    worker = RawWorker(context, lower.endpoint)
    worker.ready()
    with GearmanSocket(manager) as client:
        client.send(Cmd.SUBMIT_JOB, "echo", "", b"deep")
        handle = client.expect(Cmd.JOB_CREATED).args[0]
        wake = worker.expect(wmp.WAKE)
        assert wake.get("via") == "0.0"
        worker.send(wmp.GIVE, {"slot": "0", "via": wake.get("via")})
        take = worker.expect(wmp.TAKE)
        worker.send(wmp.DONE, {"job": take.get("job"), "via": take.get("via")}, [b"DEEP"])
        assert client.expect(Cmd.WORK_COMPLETE).args == (handle, b"DEEP")
    # And the SDK worker through the same chain.
    cluster.worker([lower.endpoint], tmp_path / "tasks.log")
    with GearmanSocket(manager) as client:
        client.send(Cmd.SUBMIT_JOB, "whoami", "", b"")
        handle = client.expect(Cmd.JOB_CREATED).args[0]
        assert client.expect(Cmd.WORK_COMPLETE).args == (handle, b"worker")


def test_cancel_stops_a_running_task_and_frees_its_slot(cluster: Cluster, tmp_path: Path) -> None:
    manager = cluster.manager()
    task_log = tmp_path / "tasks.log"
    cluster.worker([endpoint(manager)], task_log, slots=1)
    http = Runner(f"http://127.0.0.1:{manager.http_port}")
    job_id = http.request("POST", "/ojs/v1/jobs", {"type": "slow", "args": []}).body["job"]["id"]
    wait_until(lambda: len(task_lines(task_log)) == 1, "the slow task started")
    assert http.request("DELETE", f"/ojs/v1/jobs/{job_id}").status == 200
    # The one slot is free again: the next job runs.
    with GearmanSocket(manager) as client:
        client.send(Cmd.SUBMIT_JOB, "echo", "", b"next")
        handle = client.expect(Cmd.JOB_CREATED).args[0]
        assert client.expect(Cmd.WORK_COMPLETE).args == (handle, b"NEXT")


def test_roles_with_sdk_workers(cluster: Cluster, tmp_path: Path) -> None:
    manager = cluster.manager()
    task_log = tmp_path / "tasks.log"
    cluster.worker([endpoint(manager)], task_log, name="plain")
    cluster.worker([endpoint(manager)], task_log, name="gpu", roles=["gpu"])
    with GearmanSocket(manager) as client:
        for _ in range(4):
            client.send(Cmd.SUBMIT_JOB, "whoami@gpu", "", b"")
            handle = client.expect(Cmd.JOB_CREATED).args[0]
            assert client.results_until_done()[-1].args == (handle, b"gpu")


class _FakeManager:
    """A bare ROUTER that plays a manager which never answers GIVE."""

    def __init__(self, context: zmq.Context[Any]) -> None:
        self.sock: zmq.Socket[Any] = context.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"

    def expect(self, command: bytes) -> tuple[bytes, wmp.Message]:
        while True:
            assert self.sock.poll(30_000), f"no {command!r} within 30 s"
            identity, *frames = self.sock.recv_multipart()
            message = wmp.decode(wmp.split_envelope(frames)[1])
            if message.command == command:
                return identity, message

    def send(self, identity: bytes, command: bytes, headers: dict[str, object]) -> None:
        self.sock.send_multipart([identity, b"", *wmp.encode(command, headers)])


def test_the_worker_unlocks_a_slot_whose_give_is_never_answered(
    context: zmq.Context[Any],
) -> None:
    fake = _FakeManager(context)
    worker = WmpWorker([fake.endpoint], slots=1, lock_timeout=0.3, ready_base=60, heartbeat=60)

    @worker.task("echo")
    async def echo(job: WmpJob) -> bytes:
        return job.payload

    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        identity, ready = fake.expect(wmp.READY)
        assert ready.get("slot") == "0" and ready.get("functions") == "echo"
        fake.send(identity, wmp.WAKE, {"slot": "0"})
        fake.expect(wmp.GIVE)
        # No TAKE and no NO: the lock times out and the slot is READY again.
        assert fake.expect(wmp.READY)[1].get("slot") == "0"
        # A WAKE for it now is answered GIVE again, and a NO unlocks at once.
        fake.send(identity, wmp.WAKE, {"slot": "0"})
        fake.expect(wmp.GIVE)
        fake.send(identity, wmp.NO, {"slot": "0"})
        fake.expect(wmp.READY)
        # A TAKE runs the job and DONE carries the result.
        fake.send(identity, wmp.WAKE, {"slot": "0"})
        fake.expect(wmp.GIVE)
        fake.sock.send_multipart(
            [
                identity,
                b"",
                *wmp.encode(
                    wmp.TAKE,
                    {"slot": "0", "job": "j1", "manager": "m", "function": "echo"},
                    [b"abc"],
                ),
            ]
        )
        _, done = fake.expect(wmp.DONE)
        assert done.get("job") == "j1" and done.payload == (b"abc",)
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()


def test_the_worker_re_sends_ready_with_back_off(context: zmq.Context[Any]) -> None:
    fake = _FakeManager(context)
    worker = WmpWorker([fake.endpoint], slots=2, ready_base=0.1, ready_cap=0.4, heartbeat=60)

    @worker.task("echo")
    async def echo(job: WmpJob) -> bytes:
        return job.payload

    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        slots = [fake.expect(wmp.READY)[1].get("slot") for _ in range(8)]
        assert slots[:2] == ["0", "1"] and set(slots) == {"0", "1"}
    finally:
        worker.stop()
        thread.join(30)
