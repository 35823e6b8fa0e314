"""`TitanicClient` against jobwire's Titanic: request, pending, wait, close, unknown."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jobwire.sdk.errors import Timeout
from jobwire.sdk.zmq import MdpClient, ServiceError, TitanicClient
from tests.sdk.zmq_support import PATIENT, endpoint, fresh_worker, serving
from tests.servers import ServerProcess, start_jobwire


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = start_jobwire(["--mdp-heartbeat", "1"], zmq=True)
    yield proc
    assert proc.stop() == 0, proc.log()


def test_round_trip(server: ServerProcess) -> None:
    with TitanicClient(endpoint(server), **PATIENT) as titanic:
        uuid = titanic.request("echo", b"stored", b"frames")
        assert len(uuid) == 32 and int(uuid, 16) >= 0
        assert titanic.reply(uuid) is None  # pending: nobody serves echo yet
        with serving(fresh_worker(server, "echo")):
            assert titanic.wait(uuid, poll=0.05, timeout=30) == [b"stored", b"frames"]
        assert titanic.reply(uuid) == [b"stored", b"frames"]  # idempotent
        titanic.close(uuid)
        with pytest.raises(ServiceError) as raised:
            titanic.reply(uuid)
        assert (raised.value.service, raised.value.status) == ("titanic.reply", 400)
        titanic.close("f" * 32)  # unknown: 200 all the same


def test_a_failed_job_and_a_deadline(server: ServerProcess) -> None:
    with MdpClient(endpoint(server), version=2, **PATIENT) as client:
        titanic = TitanicClient(client=client)
        waiting = titanic.request("nobody-serves-titanic", "x")
        with pytest.raises(Timeout):
            titanic.wait(waiting, poll=0.01, timeout=0.1)
        titanic.close(waiting)
        with serving(fresh_worker(server, "raise")):
            uuid = titanic.request("raise", "titanic")
            with pytest.raises(ServiceError) as raised:
                titanic.wait(uuid, poll=0.05, timeout=30)
        assert raised.value.status == 500 and "bad input: titanic" in raised.value.text
        titanic.close(uuid)
