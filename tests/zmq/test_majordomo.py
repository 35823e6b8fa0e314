"""The Majordomo broker through real ZeroMQ sockets: both versions on one socket, every
command, MMI, DISCONNECT rules, heartbeats and expiry, unserved requests, bad input."""

from __future__ import annotations

import time

import pytest

import zmq
from jobwire.protocols.zmq import mdp
from jobwire.protocols.zmq.mdp import Version
from jobwire.server.zmq.majordomo import ERROR_MARK
from tests.interop.gearman_raw import status
from tests.servers import ServerProcess
from tests.zmq.support import (
    DEADLINE,
    Zmq,
    call,
    take_request,
    take_request_beating,
    wait_until,
)

V1, V2 = Version.V1, Version.V2


def serve_one(worker_version: Version, peers: Zmq, service: bytes = b"echo") -> None:
    """A worker that answers one request with its body upper-cased."""
    worker = peers.worker(service, worker_version)
    request = take_request(worker)
    worker.send(mdp.worker_reply(worker_version, request.client, [b.upper() for b in request.body]))


def test_v1_client_with_req_and_v1_worker(peers: Zmq) -> None:
    worker = peers.worker(b"echo")
    client = peers.peer(zmq.REQ)
    client.send(mdp.request(V1, b"echo", [b"hello"])[1:])  # REQ adds the empty frame
    request = take_request(worker)
    assert request.version is V1 and request.body == (b"hello",)
    worker.send(mdp.worker_reply(V1, request.client, [b"HELLO"]))
    assert client.recv() == [mdp.CLIENT_V1, b"echo", b"HELLO"]


def test_v1_client_with_dealer(peers: Zmq) -> None:
    worker = peers.worker(b"echo")
    client = peers.peer(zmq.DEALER)
    client.send(mdp.request(V1, b"echo", [b"a", b"b"]))
    request = take_request(worker)
    assert request.body == (b"a", b"b")  # the frames come through as sent
    worker.send(mdp.worker_reply(V1, request.client, [b"A", b"B"]))
    assert client.recv() == [b"", mdp.CLIENT_V1, b"echo", b"A", b"B"]


def test_v2_partial_then_final_in_order(peers: Zmq) -> None:
    worker = peers.worker(b"stream", V2)
    client = peers.peer(zmq.DEALER)
    client.send(mdp.request(V2, b"stream", [b"go"]))
    request = take_request(worker)
    assert request.version is V2
    for part in (b"1", b"2", b"3"):
        worker.send(mdp.worker_reply(V2, request.client, [part], final=False))
    worker.send(mdp.worker_reply(V2, request.client, [b"done"]))
    replies = [mdp.decode_reply(client.recv()) for _ in range(4)]
    assert [(r.body, r.final) for r in replies] == [
        ((b"1",), False),
        ((b"2",), False),
        ((b"3",), False),
        ((b"done",), True),
    ]
    assert all(r.service == b"stream" and r.version is V2 for r in replies)


@pytest.mark.parametrize(("client_version", "worker_version"), [(V1, V2), (V2, V1)])
def test_both_versions_on_one_socket(
    peers: Zmq, client_version: Version, worker_version: Version
) -> None:
    client = peers.peer(zmq.DEALER)
    client.send(mdp.request(client_version, b"echo", [b"x"]))
    serve_one(worker_version, peers)
    reply = mdp.decode_reply(client.recv())
    assert (reply.version, reply.body, reply.final) == (client_version, (b"X",), True)


def test_mmi_service_is_200_only_while_a_worker_serves_it(peers: Zmq) -> None:
    """The Python reference broker answers 200 for a service that was only requested, or
    whose worker left; the C one checks for workers. Here: workers only."""
    client = peers.peer(zmq.DEALER)
    client.send(mdp.request(V2, b"lonely", [b"x"]))  # requested, never served
    assert call(client, b"mmi.service", [b"lonely"]) == [b"404"]
    worker = peers.worker(b"lonely")
    wait_until(lambda: call(client, b"mmi.service", [b"lonely"]) == [b"200"], "mmi 200")
    assert call(client, b"mmi.services", [b""])[0] == b"200"
    take_request(worker)  # the waiting request
    worker.send(mdp.disconnect(V1))
    wait_until(lambda: call(client, b"mmi.service", [b"lonely"]) == [b"404"], "mmi 404 again")
    assert call(client, b"mmi.other", [b"x"]) == [b"501"]


def test_mmi_services_lists_every_served_name(peers: Zmq) -> None:
    peers.worker(b"alpha")
    peers.worker(b"beta", V2)
    client = peers.peer(zmq.DEALER)
    wait_until(
        lambda: call(client, b"mmi.services", [b""]) == [b"200", b"alpha", b"beta"], "listed"
    )


@pytest.mark.parametrize("version", [V1, V2])
def test_second_ready_gets_disconnect(peers: Zmq, version: Version) -> None:
    worker = peers.worker(b"echo", version)
    worker.send(mdp.ready(version, b"echo"))
    assert worker.recv_until(lambda f: f == mdp.disconnect(version)) == mdp.disconnect(version)
    client = peers.peer(zmq.DEALER)
    wait_until(lambda: call(client, b"mmi.service", [b"echo"]) == [b"404"], "forgotten")


def test_ready_for_an_mmi_name_gets_disconnect(peers: Zmq) -> None:
    """The C reference broker accepts READY for `mmi.*`; RFC 8 says disconnect."""
    worker = peers.worker(b"mmi.service")
    assert worker.recv() == mdp.disconnect(V1)


@pytest.mark.parametrize(
    "frames",
    [
        mdp.worker_reply(V1, b"H:x:1", [b"late"]),
        mdp.heartbeat(V1),
        mdp.worker_reply(V2, b"H:x:1", [b"late"]),
        mdp.heartbeat(V2),
    ],
)
def test_commands_from_an_unknown_worker_get_disconnect(peers: Zmq, frames: list[bytes]) -> None:
    stranger = peers.peer(zmq.DEALER)
    stranger.send(frames)
    version = V1 if frames[0] == b"" else V2
    assert stranger.recv() == mdp.disconnect(version)


@pytest.mark.server_args("--mdp-heartbeat", "0.2")
def test_idle_workers_get_heartbeats(peers: Zmq) -> None:
    worker = peers.worker(b"echo", V2)
    assert worker.recv() == mdp.heartbeat(V2)
    worker.send(mdp.heartbeat(V2))
    assert worker.recv() == mdp.heartbeat(V2)


@pytest.mark.server_args("--mdp-heartbeat", "0.1")
def test_a_silent_idle_worker_expires(peers: Zmq) -> None:
    peers.worker(b"quiet")
    client = peers.peer(zmq.DEALER)
    wait_until(lambda: call(client, b"mmi.service", [b"quiet"]) == [b"404"], "expired")


@pytest.mark.server_args("--mdp-heartbeat", "0.5")
def test_a_silent_busy_worker_expires_and_its_request_runs_elsewhere(peers: Zmq) -> None:
    """The reference brokers never expire a busy worker: its request would be lost. Here the
    job goes back to the queue with the attempt counted, and another worker answers."""
    stuck = peers.worker(b"work")
    client = peers.peer(zmq.DEALER)
    client.send(mdp.request(V1, b"work", [b"job"]))
    first = take_request(stuck)  # then silence: no heartbeat, no reply
    healthy = peers.worker(b"work")
    second = take_request_beating(healthy, V1)  # only after the stuck one expired
    assert second.client == first.client and second.body == (b"job",)
    healthy.send(mdp.worker_reply(V1, second.client, [b"ok"]))
    assert mdp.decode_reply(client.recv()).body == (b"ok",)


@pytest.mark.server_args("--mdp-request-timeout", "0.3")
def test_a_request_nobody_serves_expires_with_the_error_reply(peers: Zmq) -> None:
    client = peers.peer(zmq.DEALER)
    body = call(client, b"nobody", [b"x"], V2)
    assert body[:2] == [ERROR_MARK, b"404"]


@pytest.mark.parametrize(
    "frames",
    [
        [b"", b"MDPX01", b"echo", b"x"],  # wrong header
        [b"MDPW02", b"\x09"],  # unknown command byte
        [b"", mdp.CLIENT_V1, b"echo"],  # too few frames
        [b"", mdp.WORKER_V1, b"\x01"],  # READY without a service
        [b"junk"],
        [b""],
    ],
)
def test_invalid_messages_are_dropped_and_others_still_served(
    peers: Zmq, frames: list[bytes]
) -> None:
    bad = peers.peer(zmq.DEALER)
    bad.send(frames)
    assert bad.quiet_for(0.3)  # no answer to an invalid message
    client = peers.peer(zmq.DEALER)
    client.send(mdp.request(V1, b"echo", [b"still"]))
    serve_one(V1, peers)
    assert mdp.decode_reply(client.recv()).body == (b"STILL",)


def test_an_invalid_message_from_a_worker_drops_the_worker(peers: Zmq) -> None:
    worker = peers.worker(b"fragile")
    client = peers.peer(zmq.DEALER)
    wait_until(lambda: call(client, b"mmi.service", [b"fragile"]) == [b"200"], "registered")
    worker.send([b"", mdp.WORKER_V1, b"\x07"])
    wait_until(lambda: call(client, b"mmi.service", [b"fragile"]) == [b"404"], "dropped")


@pytest.mark.server_args("--max-packet-size", "4096")
def test_a_message_over_the_size_limit_is_refused_and_others_are_served(peers: Zmq) -> None:
    big = peers.peer(zmq.DEALER)
    big.send(mdp.request(V1, b"echo", [b"x" * 10_000]))  # libzmq drops the connection
    worker = peers.worker(b"echo")
    assert big.quiet_for(0.3)
    client = peers.peer(zmq.DEALER)
    client.send(mdp.request(V1, b"echo", [b"small"]))
    request = take_request(worker)
    assert request.body == (b"small",)  # the big one never became a job


def test_many_identities_that_never_register_are_not_remembered(peers: Zmq) -> None:
    """10,000 peers that connect, send a heartbeat or a junk frame, and go: the server keeps
    no state for them (they get DISCONNECT or nothing) and goes on serving others."""
    pid = peers.server.proc.pid
    before = _rss(pid)
    for index in range(10_000):
        stranger = peers.context.socket(zmq.DEALER)
        stranger.setsockopt(zmq.LINGER, 0)
        stranger.setsockopt(zmq.IDENTITY, b"id-%d" % index)
        stranger.connect(peers.endpoint)
        stranger.send_multipart(mdp.heartbeat(V1) if index % 2 else [b"junk"])
        if index % 2:
            assert stranger.poll(int(DEADLINE * 1000)), "no DISCONNECT"
        stranger.close(linger=0)
    client = peers.peer(zmq.DEALER)
    client.send(mdp.request(V2, b"echo", [b"after"]))
    serve_one(V1, peers)
    assert mdp.decode_reply(client.recv()).body == (b"AFTER",)
    assert _rss(pid) - before < 64 * 1024 * 1024


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.server_args("--mdp-heartbeat", "0.5")
def test_a_dead_worker_behind_a_live_one_expires_too(server: ServerProcess, peers: Zmq) -> None:
    """The reference brokers purge only from the front of the idle list: a live worker that
    has waited longer shields a dead one behind it, which then gets requests and loses them.
    Here every worker is checked."""
    live = peers.worker(b"svc")
    peers.worker(b"svc")  # then silent
    end = time.monotonic() + DEADLINE
    # Both registered first: else the count of 1 could be the live one alone, before the
    # silent one's READY arrived.
    while time.monotonic() < end and status(server).get("svc", (0, 0, 0))[2] != 2:
        live.send(mdp.heartbeat(V1))
        time.sleep(0.05)
    while time.monotonic() < end and status(server).get("svc", (0, 0, 0))[2] != 1:
        live.send(mdp.heartbeat(V1))  # the older worker stays alive
        time.sleep(0.05)
    assert status(server)["svc"][2] == 1
    client = peers.peer(zmq.DEALER)
    client.send(mdp.request(V1, b"svc", [b"x"]))
    request = take_request_beating(live, V1)
    live.send(mdp.worker_reply(V1, request.client, [b"from the live one"]))
    assert mdp.decode_reply(client.recv()).body == (b"from the live one",)
