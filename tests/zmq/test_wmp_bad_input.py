"""Bad input on the WMP endpoints: what is not WMP is dropped, WMP that breaks the rules is
answered ERROR (docs/wmp.md), and the manager and the device keep serving."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import zmq
from jobwire.protocols.zmq import wmp
from tests.interop.gearman_raw import Cmd, GearmanSocket
from tests.servers import ServerProcess
from tests.zmq.wmp_support import Process, RawWorker, endpoint, start_device, start_manager


@pytest.fixture
def manager() -> Iterator[ServerProcess]:
    server = start_manager(http=False)
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture
def device(manager: ServerProcess) -> Iterator[Process]:
    made = start_device([endpoint(manager)])
    yield made
    made.stop()


@pytest.fixture
def context() -> Iterator[zmq.Context[Any]]:
    made: zmq.Context[Any] = zmq.Context()
    yield made
    made.destroy(linger=0)


DROPPED = [
    pytest.param([b"", b"WMP02", wmp.READY, b""], id="wrong-signature"),
    pytest.param([b"", b"MDPW01", b"\x01", b"echo"], id="majordomo"),
    pytest.param([b"", b""], id="empty-body"),
    pytest.param([b"WMP01", wmp.READY, b"slot=0"], id="no-delimiter"),
    pytest.param([b"x"] * 40, id="too-many-hops"),
]

ANSWERED = [
    pytest.param([b"", wmp.SIGNATURE], "too few frames", id="signature-only"),
    pytest.param([b"", wmp.SIGNATURE, wmp.READY], "too few frames", id="no-header-frame"),
    pytest.param([b"", wmp.SIGNATURE, b"JUMP", b""], "unknown command", id="unknown-command"),
    pytest.param([b"", wmp.SIGNATURE, wmp.READY, b"slot"], "bad header", id="header-no-equals"),
    pytest.param(
        [b"", wmp.SIGNATURE, wmp.READY, b"Slot=0\nfunctions=echo"], "bad header", id="header-key"
    ),
    pytest.param(
        [b"", wmp.SIGNATURE, wmp.READY, b"slot=0\nslot=1"], "twice", id="duplicate-header"
    ),
    pytest.param([b"", wmp.SIGNATURE, wmp.READY, b"\xff"], "UTF-8", id="header-not-utf8"),
    pytest.param([b"", wmp.SIGNATURE, wmp.TAKE, b""], "not sent to a manager", id="take-up"),
]

MANAGER_ONLY = [
    pytest.param([b"", wmp.SIGNATURE, wmp.READY, b"slot=0"], "functions", id="no-functions"),
    pytest.param(
        [b"", wmp.SIGNATURE, wmp.READY, b"functions=a\nroles=a,b,c,d,e"], "roles", id="roles"
    ),
    pytest.param([b"", wmp.SIGNATURE, wmp.READY, b"functions=a\nlease=soon"], "number", id="lease"),
]


def serves(manager: ServerProcess, worker: RawWorker) -> None:
    """A full flow still works on the same socket."""
    worker.ready()
    with GearmanSocket(manager) as client:
        client.send(Cmd.SUBMIT_JOB, "echo", "", b"ok")
        handle = client.expect(Cmd.JOB_CREATED).args[0]
        wake = worker.expect(wmp.WAKE)
        worker.send(wmp.GIVE, {"slot": "0", "via": wake.get("via")} if wake.get("via") else {})
        take = worker.expect(wmp.TAKE)
        done = {"job": take.get("job")}
        if take.get("via"):
            done["via"] = take.get("via")
        worker.send(wmp.DONE, done, [b"OK"])
        assert client.expect(Cmd.WORK_COMPLETE).args == (handle, b"OK")


@pytest.mark.parametrize("frames", DROPPED)
@pytest.mark.parametrize("through_device", [False, True])
def test_what_is_not_wmp_is_dropped(
    manager: ServerProcess,
    device: Process,
    context: zmq.Context[Any],
    frames: list[bytes],
    through_device: bool,
) -> None:
    worker = RawWorker(context, device.endpoint if through_device else endpoint(manager))
    worker.send_frames(frames)
    assert worker.quiet_for(0.3)
    serves(manager, worker)


@pytest.mark.parametrize(("frames", "reason"), ANSWERED)
@pytest.mark.parametrize("through_device", [False, True])
def test_broken_wmp_is_answered_error(
    manager: ServerProcess,
    device: Process,
    context: zmq.Context[Any],
    frames: list[bytes],
    reason: str,
    through_device: bool,
) -> None:
    worker = RawWorker(context, device.endpoint if through_device else endpoint(manager))
    worker.send_frames(frames)
    assert reason in worker.expect(wmp.ERROR).get("reason")
    serves(manager, worker)


@pytest.mark.parametrize(("frames", "reason"), MANAGER_ONLY)
def test_a_bad_ready_is_answered_error_through_the_device_too(
    manager: ServerProcess,
    device: Process,
    context: zmq.Context[Any],
    frames: list[bytes],
    reason: str,
) -> None:
    for target in (endpoint(manager), device.endpoint):
        worker = RawWorker(context, target)
        worker.send_frames(frames)
        error = worker.expect(wmp.ERROR)
        assert reason in error.get("reason")
        serves(manager, worker)


def test_bad_progress_and_unknown_jobs(manager: ServerProcess, context: zmq.Context[Any]) -> None:
    worker = RawWorker(context, endpoint(manager))
    worker.ready()
    with GearmanSocket(manager) as client:
        client.send(Cmd.SUBMIT_JOB, "echo", "", b"x")
        handle = client.expect(Cmd.JOB_CREATED).args[0]
        worker.expect(wmp.WAKE)
        worker.send(wmp.GIVE, {"slot": "0"})
        job = worker.expect(wmp.TAKE).get("job")
        worker.send(wmp.STATUS, {"job": job, "progress": "half"})
        assert "progress" in worker.expect(wmp.ERROR).get("reason")
        worker.send(wmp.DONE, {"job": "H:nope:1"}, [b"?"])  # not held: dropped
        worker.send(wmp.STATUS, {"job": "H:nope:1", "progress": "1/2"})
        assert worker.quiet_for(0.3)
        worker.send(wmp.DONE, {"job": job}, [b"X"])
        assert client.expect(Cmd.WORK_COMPLETE).args == (handle, b"X")
