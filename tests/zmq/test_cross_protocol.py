"""Majordomo and the other listeners share one engine: an MDP client's request runs on a
Gearman, OJS or Rota worker and the other way round, and shows in every status view."""

from __future__ import annotations

import orjson

import zmq
from jobwire.protocols.zmq import mdp
from jobwire.protocols.zmq.mdp import Version
from jobwire.server.zmq.majordomo import ERROR_MARK
from tests.interop.gearman_raw import Cmd, GearmanSocket, status
from tests.ojs.dsl import Runner
from tests.servers import ServerProcess
from tests.zmq.support import Zmq, take_request, wait_until

V1, V2 = Version.V1, Version.V2


def test_an_mdp_request_runs_on_a_gearman_worker_with_its_data_as_partials(
    server: ServerProcess, peers: Zmq
) -> None:
    client = peers.peer(zmq.DEALER)
    client.send(mdp.request(V2, b"reverse", [b"abc"]))
    wait_until(lambda: status(server).get("reverse", (0, 0, 0))[0] == 1, "the request queued")
    with GearmanSocket(server) as worker:
        worker.send(Cmd.CAN_DO, "reverse")
        worker.send(Cmd.GRAB_JOB)
        handle, function, payload = worker.expect(Cmd.JOB_ASSIGN).args
        assert (function, payload) == (b"reverse", b"abc")
        worker.send(Cmd.WORK_DATA, handle, b"partial")
        worker.send(Cmd.WORK_STATUS, handle, b"1", b"2")
        worker.send(Cmd.WORK_COMPLETE, handle, payload[::-1])
    replies = [mdp.decode_reply(client.recv()) for _ in range(3)]
    assert [(r.body, r.final) for r in replies] == [
        ((b"partial",), False),
        ((b"progress", b"1", b"2"), False),
        ((b"cba",), True),
    ]


def test_a_gearman_client_job_runs_on_an_mdp_worker(server: ServerProcess, peers: Zmq) -> None:
    worker = peers.worker(b"upper", V2)
    with GearmanSocket(server) as client:
        client.send(Cmd.SUBMIT_JOB, "upper", "", b"shout")
        handle = client.expect(Cmd.JOB_CREATED).args[0]
        request = take_request(worker)
        assert request.body == (b"shout",) and request.client == handle
        worker.send(mdp.worker_reply(V2, request.client, [b"part"], final=False))
        worker.send(mdp.worker_reply(V2, request.client, [b"SHOUT"]))
        assert client.expect(Cmd.WORK_DATA).args == (handle, b"part")
        assert client.expect(Cmd.WORK_COMPLETE).args == (handle, b"SHOUT")


def test_an_ojs_job_runs_on_an_mdp_worker_and_mdp_work_shows_in_status_views(
    server: ServerProcess, peers: Zmq
) -> None:
    http = Runner(f"http://127.0.0.1:{server.http_port}")
    pushed = http.request("POST", "/ojs/v1/jobs", {"type": "resize", "args": [64]})
    assert pushed.status == 201
    job_id = pushed.body["job"]["id"]
    worker = peers.worker(b"resize")
    request = take_request(worker)
    assert orjson.loads(request.body[0]) == [64]  # the OJS mapping rule: args as JSON
    # A waiting MDP request, and the MDP worker holding the OJS job, show everywhere.
    waiting = peers.peer(zmq.DEALER)
    waiting.send(mdp.request(V1, b"resize", [b"[1]"]))
    wait_until(lambda: status(server).get("resize") == (2, 1, 1), "gearadmin status")
    queues = http.request("GET", "/ojs/v1/queues").body["queues"]
    assert any(q["name"] == "resize" for q in queues)
    worker.send(mdp.worker_reply(V1, request.client, [b'{"ok":true}']))
    wait_until(
        lambda: http.request("GET", f"/ojs/v1/jobs/{job_id}").body["job"]["state"] == "completed",
        "the OJS job completed",
    )


def test_every_protocols_workers_show_in_the_one_worker_list(
    server: ServerProcess, peers: Zmq
) -> None:
    http = Runner(f"http://127.0.0.1:{server.http_port}")
    peers.worker(b"mdp-fn")
    with GearmanSocket(server) as gearman:
        gearman.send(Cmd.CAN_DO, "gm-fn")
        gearman.send(Cmd.ECHO_REQ, "sync")
        gearman.expect(Cmd.ECHO_RES)

        def listed() -> dict[str, list[str]]:
            workers = http.request("GET", "/ojs/v1/workers").body["workers"]
            return {w["protocol"]: w["abilities"] for w in workers}

        wait_until(lambda: listed() == {"mdp": ["mdp-fn"], "gearman": ["gm-fn"]}, "listed")
        only = http.request("GET", "/ojs/v1/workers?protocol=mdp").body["workers"]
        assert [w["worker_id"].split(":")[0] for w in only] == ["mdp"]


def test_an_mdp_workers_error_reply_fails_the_job_for_a_gearman_client(
    server: ServerProcess, peers: Zmq
) -> None:
    """MDP has no failure command: a worker's FINAL with the error body fails the job, so a
    Gearman client that asked for exceptions gets WORK_EXCEPTION, not a result."""
    worker = peers.worker(b"fragile")
    with GearmanSocket(server) as client:
        client.send(Cmd.OPTION_REQ, "exceptions")
        client.expect(Cmd.OPTION_RES)
        client.send(Cmd.SUBMIT_JOB, "fragile", "", b"x")
        handle = client.expect(Cmd.JOB_CREATED).args[0]
        request = take_request(worker)
        worker.send(mdp.worker_reply(V1, request.client, [ERROR_MARK, b"500", b"it broke"]))
        assert client.expect(Cmd.WORK_EXCEPTION).args == (handle, b"it broke")


def test_an_operator_quiets_an_mdp_worker_through_the_admin_endpoint(
    server: ServerProcess, peers: Zmq
) -> None:
    http = Runner(f"http://127.0.0.1:{server.http_port}")
    worker = peers.worker(b"held")
    wait_until(lambda: http.request("GET", "/ojs/v1/workers?protocol=mdp").body["count"] == 1, "up")
    [listed] = http.request("GET", "/ojs/v1/workers?protocol=mdp").body["workers"]
    path = f"/ojs/v1/admin/workers/{listed['worker_id']}/state"
    assert http.request("POST", path, {"state": "quiet"}).status == 200
    client = peers.peer(zmq.DEALER)
    client.send(mdp.request(V1, b"held", [b"x"]))
    wait_until(lambda: status(server).get("held", (0, 0, 0))[:2] == (1, 0), "queued, not run")
    assert worker.quiet_for(0.3)  # quiet: no request pushed
    assert http.request("POST", path, {"state": "running"}).status == 200
    request = take_request(worker)
    worker.send(mdp.worker_reply(V1, request.client, [b"ok"]))
    assert mdp.decode_reply(client.recv()).body == (b"ok",)
