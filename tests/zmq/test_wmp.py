"""The WMP manager through real sockets, with raw DEALER workers: the flow with one
manager, READY rules, one WAKE per job, NO, locks and leases timing out, roles, CANCEL
from OJS and Gearman clients, and progress reaching a Gearman client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import zmq
from jobwire.protocols.zmq import wmp
from tests.interop.gearman_raw import Cmd, GearmanSocket, admin, status
from tests.ojs.dsl import Runner
from tests.servers import ServerProcess
from tests.zmq.wmp_support import RawWorker, endpoint, start_manager, wait_until


@pytest.fixture
def manager(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    marker = request.node.get_closest_marker("server_args")
    server = start_manager(list(marker.args) if marker else [])
    yield server
    code = server.stop()
    assert code == 0, f"jobwire exited with {code}:\n{server.log()}"


@pytest.fixture
def context() -> Iterator[zmq.Context[Any]]:
    made: zmq.Context[Any] = zmq.Context()
    yield made
    made.destroy(linger=0)


def raw(context: zmq.Context[Any], server: ServerProcess) -> RawWorker:
    return RawWorker(context, endpoint(server))


def take(worker: RawWorker, slot: str = "0") -> wmp.Message:
    """WAKE, GIVE, TAKE for `slot`."""
    wake = worker.expect(wmp.WAKE)
    assert wake.get("slot") == slot
    worker.send(wmp.GIVE, {"slot": slot})
    return worker.expect(wmp.TAKE)


def test_flow_with_one_manager_and_progress_reaching_a_gearman_client(
    manager: ServerProcess, context: zmq.Context[Any]
) -> None:
    worker = raw(context, manager)
    worker.ready(functions="echo,other", heartbeat=5)
    with GearmanSocket(manager) as client:
        client.send(Cmd.SUBMIT_JOB, "echo", "", b"hello")
        handle = client.expect(Cmd.JOB_CREATED).args[0]
        job = take(worker)
        assert job.get("job") == handle.decode() and job.get("function") == "echo"
        assert job.get("attempt") == "1" and job.get("manager") and job.payload == (b"hello",)
        worker.send(wmp.STATUS, {"job": job.get("job"), "progress": "1/4"}, [b"part"])
        worker.send(wmp.DONE, {"job": job.get("job"), "slot": "0"}, [b"HELLO"])
        assert client.expect(Cmd.WORK_STATUS).args == (handle, b"1", b"4")
        assert client.expect(Cmd.WORK_DATA).args == (handle, b"part")
        assert client.expect(Cmd.WORK_COMPLETE).args == (handle, b"HELLO")
    # HEARTBEAT is answered.
    worker.send(wmp.HEARTBEAT)
    assert worker.recv().command == wmp.HEARTBEAT


def test_a_worker_failure_reaches_the_gearman_client(
    manager: ServerProcess, context: zmq.Context[Any]
) -> None:
    worker = raw(context, manager)
    worker.ready()
    with GearmanSocket(manager) as client:
        client.send(Cmd.SUBMIT_JOB, "echo", "", b"x")
        client.expect(Cmd.JOB_CREATED)
        job = take(worker)
        worker.send(wmp.DONE, {"job": job.get("job"), "error": "boom"})
        assert client.expect(Cmd.WORK_FAIL)


@pytest.mark.server_args("--wakeup-fallback", "0")
def test_a_remembered_ready_is_ignored_and_one_job_wakes_one_worker(
    manager: ServerProcess, context: zmq.Context[Any]
) -> None:
    workers = [raw(context, manager) for _ in range(3)]
    for worker in workers:
        worker.ready()
        worker.ready()  # the same path and slot: ignored
    wait_until(lambda: status(manager).get("echo", (0, 0, 0))[2] == 3, "three slots known")
    with GearmanSocket(manager) as client:
        client.send(Cmd.SUBMIT_JOB_BG, "echo", "", b"one")
        client.expect(Cmd.JOB_CREATED)
    wait_until(lambda: any(w.sock.poll(0) for w in workers), "a worker woken")
    woken = [w for w in workers if w.sock.poll(0)]
    assert len(woken) == 1
    job = take(woken[0])
    woken[0].send(wmp.DONE, {"job": job.get("job")}, [b"ONE"])
    # Neither the duplicate READY nor the other workers got a WAKE.
    assert all(w.quiet_for(0.3) for w in workers)


@pytest.mark.server_args("-w", "0")
def test_no_when_another_worker_took_the_job(
    manager: ServerProcess, context: zmq.Context[Any]
) -> None:
    first, second = raw(context, manager), raw(context, manager)
    first.ready()
    second.ready()
    wait_until(lambda: status(manager).get("echo", (0, 0, 0))[2] == 2, "two slots known")
    with GearmanSocket(manager) as client:
        client.send(Cmd.SUBMIT_JOB_BG, "echo", "", b"one")
        client.expect(Cmd.JOB_CREATED)
    assert first.expect(wmp.WAKE).get("slot") == "0"
    assert second.expect(wmp.WAKE).get("slot") == "0"
    first.send(wmp.GIVE, {"slot": "0"})
    assert first.expect(wmp.TAKE).payload == (b"one",)
    second.send(wmp.GIVE, {"slot": "0"})
    no = second.expect(wmp.NO)
    assert no.get("slot") == "0" and no.get("manager")
    # A GIVE from a path the manager never saw: NO too.
    stranger = raw(context, manager)
    stranger.send(wmp.GIVE, {"slot": "7"})
    assert stranger.expect(wmp.NO).get("slot") == "7"


def test_a_woken_worker_that_never_gives_leaves_the_job_to_another(
    manager: ServerProcess, context: zmq.Context[Any]
) -> None:
    """Default wake-up fallback: the job does not stay with a worker that stays silent."""
    first, second = raw(context, manager), raw(context, manager)
    first.ready()
    second.ready()
    wait_until(lambda: status(manager).get("echo", (0, 0, 0))[2] == 2, "two slots known")
    with GearmanSocket(manager) as client:
        client.send(Cmd.SUBMIT_JOB_BG, "echo", "", b"one")
        client.expect(Cmd.JOB_CREATED)
    # Whichever is woken first ignores it; the other is woken after the fallback.
    for worker in (first, second):
        worker.expect(wmp.WAKE)
    second.send(wmp.GIVE, {"slot": "0"})
    job = second.expect(wmp.TAKE)
    second.send(wmp.DONE, {"job": job.get("job")}, [b"ONE"])
    wait_until(lambda: status(manager).get("echo", (1, 0, 0))[0] == 0, "the job done")


def test_a_lease_that_runs_out_is_cancelled_and_requeued_with_its_attempt(
    manager: ServerProcess, context: zmq.Context[Any]
) -> None:
    slow, spare = raw(context, manager), raw(context, manager)
    slow.ready(lease=0.5)
    with GearmanSocket(manager) as client:
        client.send(Cmd.SUBMIT_JOB, "echo", "", b"work")
        handle = client.expect(Cmd.JOB_CREATED).args[0]
        job = take(slow)
        cancel = slow.expect(wmp.CANCEL)  # no DONE within the lease
        assert cancel.get("job") == job.get("job") and cancel.get("reason") == "lease expired"
        spare.ready()
        again = take(spare)
        assert again.get("job") == handle.decode() and again.get("attempt") == "2"
        slow.send(wmp.DONE, {"job": job.get("job")}, [b"LATE"])  # dropped: taken back
        spare.send(wmp.DONE, {"job": again.get("job")}, [b"WORK"])
        assert client.expect(Cmd.WORK_COMPLETE).args == (handle, b"WORK")


def test_status_renews_the_lease(manager: ServerProcess, context: zmq.Context[Any]) -> None:
    worker = raw(context, manager)
    # The lease is 10 s and the work lasts 12 s with a STATUS every 0.4 s: only a stall of
    # over 9 s between two of them could let the lease run out (a busy machine's hiccups
    # are far shorter), so the check is about renewal, not about speed.
    worker.ready(lease=10)
    with GearmanSocket(manager) as client:
        client.send(Cmd.SUBMIT_JOB, "echo", "", b"work")
        handle = client.expect(Cmd.JOB_CREATED).args[0]
        job = take(worker)
        for step in range(30):
            worker.send(wmp.STATUS, {"job": job.get("job"), "progress": f"{step}/30"})
            assert worker.quiet_for(0.4), "no CANCEL while the worker reports progress"
        worker.send(wmp.DONE, {"job": job.get("job")}, [b"WORK"])
        packets = client.results_until_done()
        assert packets[-1].args == (handle, b"WORK")


def test_roles_wake_only_matching_workers(
    manager: ServerProcess, context: zmq.Context[Any]
) -> None:
    plain, gpu = raw(context, manager), raw(context, manager)
    plain.ready()
    gpu.ready(roles="gpu,eu")
    wait_until(lambda: status(manager).get("echo", (0, 0, 0))[2] == 2, "two slots known")
    with GearmanSocket(manager) as client:
        client.send(Cmd.SUBMIT_JOB_BG, "echo@eu+gpu", "", b"needs both")
        client.expect(Cmd.JOB_CREATED)
        job = take(gpu)
        assert job.get("function") == "echo@eu+gpu"
        gpu.send(wmp.DONE, {"job": job.get("job")}, [b"ok"])
        assert plain.quiet_for(0.3)
        gpu.ready(roles="gpu,eu")  # the slot is free again
        client.send(Cmd.SUBMIT_JOB_BG, "echo@gpu", "", b"needs gpu")
        client.expect(Cmd.JOB_CREATED)
        job = take(gpu)
        assert job.get("function") == "echo@gpu"
        gpu.send(wmp.DONE, {"job": job.get("job")}, [b"ok"])
        assert plain.quiet_for(0.3)
        # A job needing a role nobody has waits; a job needing none goes to either.
        client.send(Cmd.SUBMIT_JOB_BG, "echo@fpga", "", b"nobody")
        client.expect(Cmd.JOB_CREATED)
        assert plain.quiet_for(0.3) and gpu.quiet_for(0.1)
        # The order of a worker's roles does not matter; the job's are sorted.
        gpu.ready(roles="gpu,eu")
        client.send(Cmd.SUBMIT_JOB_BG, "echo@eu", "", b"needs eu")
        client.expect(Cmd.JOB_CREATED)
        assert take(gpu).get("function") == "echo@eu"
        assert plain.quiet_for(0.2)


def test_cancel_reaches_the_worker_when_an_ojs_client_cancels(
    manager: ServerProcess, context: zmq.Context[Any]
) -> None:
    worker = raw(context, manager)
    worker.ready()
    http = Runner(f"http://127.0.0.1:{manager.http_port}")
    job_id = http.request("POST", "/ojs/v1/jobs", {"type": "echo", "args": ["x"]}).body["job"]["id"]
    job = take(worker)
    assert job.get("job") == job_id and job.payload == (b'["x"]',)
    assert http.request("DELETE", f"/ojs/v1/jobs/{job_id}").status == 200
    cancel = worker.expect(wmp.CANCEL)
    assert cancel.get("job") == job_id and cancel.get("reason") == "cancelled"
    assert cancel.get("manager") == job.get("manager")


def test_cancel_reaches_the_worker_when_a_gearman_admin_cancels(
    manager: ServerProcess, context: zmq.Context[Any]
) -> None:
    worker = raw(context, manager)
    worker.ready()
    with GearmanSocket(manager) as client:
        client.send(Cmd.SUBMIT_JOB, "echo", "", b"x")
        handle = client.expect(Cmd.JOB_CREATED).args[0]
        job = take(worker)
        assert admin(manager, f"cancel job {handle.decode()}").startswith("OK")
        assert worker.expect(wmp.CANCEL).get("job") == job.get("job")
        assert client.expect(Cmd.WORK_FAIL).args == (handle,)


def test_a_ready_for_a_slot_that_holds_a_job_hands_the_job_back(
    manager: ServerProcess, context: zmq.Context[Any]
) -> None:
    worker = raw(context, manager)
    worker.ready()
    with GearmanSocket(manager) as client:
        client.send(Cmd.SUBMIT_JOB_BG, "echo", "", b"x")
        client.expect(Cmd.JOB_CREATED)
    job = take(worker)
    worker.ready()  # the worker forgot it (restarted with the same identity)
    again = take(worker)
    assert again.get("job") == job.get("job") and again.get("attempt") == "2"


def test_disconnect_requeues_what_the_worker_held(
    manager: ServerProcess, context: zmq.Context[Any]
) -> None:
    leaving, staying = raw(context, manager), raw(context, manager)
    leaving.ready()
    with GearmanSocket(manager) as client:
        client.send(Cmd.SUBMIT_JOB_BG, "echo", "", b"x")
        client.expect(Cmd.JOB_CREATED)
    job = take(leaving)
    leaving.send(wmp.DISCONNECT)
    staying.ready()
    assert take(staying).get("job") == job.get("job")
