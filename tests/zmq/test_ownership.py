"""Lease ownership on the ZeroMQ listeners, through real sockets: a reply, DONE or STATUS
from a worker that does not hold the request is dropped (Majordomo and Pirate have no error
to send a worker; WMP drops it as it drops a late DONE) and changes nothing: the job stays
with its holder, whose reply is the one the client gets."""

from __future__ import annotations

from typing import Any

import zmq
from jobwire.protocols.zmq import mdp, ppp, wmp
from jobwire.protocols.zmq.mdp import Version
from tests.interop.gearman_raw import Cmd, GearmanSocket, status
from tests.servers import free_port, start_jobwire
from tests.zmq.support import Zmq, take_request, zmq_peers
from tests.zmq.wmp_support import RawWorker, endpoint, start_manager, wait_until

V1 = Version.V1


def test_an_mdp_reply_from_a_worker_not_holding_the_request_is_dropped(peers: Zmq) -> None:
    holder = peers.worker(b"own")
    client = peers.peer(zmq.DEALER)
    client.send(mdp.request(V1, b"own", [b"1"]))
    request = take_request(holder)
    intruder = peers.worker(b"own")
    # The intruder names the holder's client address: not its request.
    intruder.send(mdp.worker_reply(V1, request.client, [b"forged"]))
    assert client.quiet_for(0.3), "the forged reply must not reach the client"
    assert status(peers.server)["own"][1] == 1  # still running, with its holder
    holder.send(mdp.worker_reply(V1, request.client, [b"real"]))
    assert mdp.decode_reply(client.recv()).body == (b"real",)


def test_a_ppp_reply_from_a_worker_not_holding_the_request_is_dropped() -> None:
    front, back = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    server = start_jobwire(["--ppp-frontend", front, "--ppp-backend", back, "--ppp-function", "pp"])
    try:
        with zmq_peers(server) as peers:
            holder = peers.peer(zmq.DEALER, back)
            holder.send([ppp.READY])
            client = peers.peer(zmq.DEALER, front)
            client.send([b"", b"1"])
            while (request := holder.recv()) == [ppp.HEARTBEAT]:
                pass
            intruder = peers.peer(zmq.DEALER, back)
            intruder.send([ppp.READY])
            wait_until(lambda: status(server)["pp"][2] == 2, "both workers known")
            intruder.send([*request[:2], b"forged"])
            assert client.quiet_for(0.3), "the forged reply must not reach the client"
            assert status(server)["pp"][1] == 1
            holder.send([*request[:2], b"real"])
            assert client.recv() == [b"", b"real"]
    finally:
        assert server.stop() == 0, server.log()


def test_a_wmp_done_or_status_from_a_worker_not_holding_the_job_is_dropped() -> None:
    server = start_manager()
    context: zmq.Context[Any] = zmq.Context()
    try:
        holder = RawWorker(context, endpoint(server))
        holder.ready()
        with GearmanSocket(server) as client:
            client.send(Cmd.SUBMIT_JOB, "echo", "", b"work")
            handle = client.expect(Cmd.JOB_CREATED).args[0]
            holder.expect(wmp.WAKE)
            holder.send(wmp.GIVE, {"slot": "0"})
            job = holder.expect(wmp.TAKE).get("job")
            intruder = RawWorker(context, endpoint(server))
            intruder.ready(slot="0")
            wait_until(lambda: status(server)["echo"][2] == 2, "both slots known")
            intruder.send(wmp.STATUS, {"job": job, "progress": "9/9"})
            intruder.send(wmp.DONE, {"job": job, "slot": "0"}, [b"FORGED"])
            intruder.send(wmp.HEARTBEAT)  # answered once the manager handled the two above
            assert intruder.recv().command == wmp.HEARTBEAT
            assert status(server)["echo"][1] == 1  # still running, with its holder
            holder.send(wmp.DONE, {"job": job, "slot": "0"}, [b"WORK"])
            # Only the holder's result reaches the client; the forged STATUS never did.
            packets = client.results_until_done()
            assert [(p.type, p.args) for p in packets] == [
                (Cmd.WORK_COMPLETE, (handle, b"WORK"))
            ], packets
    finally:
        context.destroy(linger=0)
        assert server.stop() == 0, server.log()
