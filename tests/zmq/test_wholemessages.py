"""Whole-message receive and send (`jobwire._zmqframes`): the extension on pyzmq's own
sockets in this process, and a real server through both paths (the extension, and pyzmq's
per-frame calls that `JOBWIRE_ZMQFRAMES=0` chooses)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import zmq
from jobwire.protocols.zmq import mdp
from jobwire.protocols.zmq.mdp import Version
from tests.servers import ServerProcess, start_jobwire
from tests.zmq.support import DEADLINE, Peer, Zmq, take_request

# setup.py builds it unless JOBWIRE_PURE=1 was set at build time.
frames_ext: Any = pytest.importorskip("jobwire._zmqframes", reason="built without C extensions")

V1, V2 = Version.V1, Version.V2


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[Any], zmq.Socket[Any]]]:
    """A bound ROUTER and a DEALER (identity b"peer") connected to it, in this process."""
    from zmq.backend.cython import _zmq

    frames_ext.bind(_zmq.__file__)
    context: zmq.Context[Any] = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind("tcp://127.0.0.1:*")
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.IDENTITY, b"peer")
    dealer.connect(router.getsockopt_string(zmq.LAST_ENDPOINT))
    yield router, dealer
    dealer.close()
    router.close()
    context.term()


def receive(router: zmq.Socket[Any]) -> tuple[bytes, list[bytes]]:
    assert router.poll(int(DEADLINE * 1000)), "nothing arrived"
    message = frames_ext.recv_message(router.underlying)
    assert message is not None
    return message  # type: ignore[no-any-return]


def test_nothing_waiting_is_none(pair: tuple[zmq.Socket[Any], zmq.Socket[Any]]) -> None:
    router, _ = pair
    assert frames_ext.recv_message(router.underlying) is None


def test_a_message_arrives_whole_with_its_identity(
    pair: tuple[zmq.Socket[Any], zmq.Socket[Any]],
) -> None:
    router, dealer = pair
    sent = [b"", b"MDPC01", b"x" * 1_000_000, b"", b"\x00\xff"]
    dealer.send_multipart(sent)
    dealer.send_multipart([b"single"])
    many = [b"%d" % n for n in range(40)]  # more than the extension gathers before its list
    dealer.send_multipart(many)
    assert receive(router) == (b"peer", sent)
    assert receive(router) == (b"peer", [b"single"])  # the next one starts at its boundary
    assert receive(router) == (b"peer", many)
    assert frames_ext.recv_message(router.underlying) is None


def test_a_message_goes_out_whole(pair: tuple[zmq.Socket[Any], zmq.Socket[Any]]) -> None:
    router, dealer = pair
    dealer.send(b"hello")  # the ROUTER learns the peer
    receive(router)
    frames_ext.send_message(router.underlying, b"peer", [b"", bytearray(b"ba"), b"y" * 70_000])
    assert dealer.poll(int(DEADLINE * 1000))
    assert dealer.recv_multipart() == [b"", b"ba", b"y" * 70_000]


def test_a_bad_frame_sends_nothing_and_the_next_message_is_whole(
    pair: tuple[zmq.Socket[Any], zmq.Socket[Any]],
) -> None:
    router, dealer = pair
    dealer.send(b"hello")
    receive(router)
    with pytest.raises(TypeError):
        frames_ext.send_message(router.underlying, b"peer", [b"first", "not bytes"])
    with pytest.raises(TypeError):
        frames_ext.send_message(router.underlying, b"peer", None)
    frames_ext.send_message(router.underlying, b"peer", [b"good"])
    assert dealer.poll(int(DEADLINE * 1000))
    assert dealer.recv_multipart() == [b"good"]


def test_a_frame_without_a_simple_buffer_sends_nothing(
    pair: tuple[zmq.Socket[Any], zmq.Socket[Any]],
) -> None:
    """A strided view passes the buffer check but has no contiguous bytes: refused before
    the first frame goes out, so the next message does not continue a half-sent one."""
    router, dealer = pair
    dealer.send(b"hello")
    receive(router)
    strided = memoryview(b"abcdef")[::2]
    with pytest.raises(TypeError, match="contiguous"):
        frames_ext.send_message(router.underlying, b"peer", [b"first", bytearray(b"x"), strided])
    with pytest.raises(TypeError):
        frames_ext.send_message(router.underlying, strided, [b"first"])
    frames_ext.send_message(router.underlying, b"peer", [b"good", bytearray(b"too")])
    assert dealer.poll(int(DEADLINE * 1000))
    assert dealer.recv_multipart() == [b"good", b"too"]


def test_a_peer_at_its_high_water_mark_loses_whole_messages_only() -> None:
    """ROUTER's rule without ROUTER_MANDATORY: a message to a full peer is dropped whole at
    its first frame, without an error; every message that arrives has all its frames."""
    from zmq.backend.cython import _zmq

    frames_ext.bind(_zmq.__file__)
    context: zmq.Context[Any] = zmq.Context()
    router = context.socket(zmq.ROUTER)
    dealer = context.socket(zmq.DEALER)
    try:
        for sock in (router, dealer):
            sock.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.SNDHWM, 2)
        dealer.setsockopt(zmq.RCVHWM, 2)
        dealer.setsockopt(zmq.IDENTITY, b"slow")
        # inproc: one pipe between the two sockets, with room for both marks (4 messages)
        # and no kernel buffers or I/O thread in between, so some must be dropped.
        router.bind("inproc://high-water-mark")
        dealer.connect("inproc://high-water-mark")
        dealer.send(b"hello")
        receive(router)
        sent = 1_000
        for n in range(sent):
            frames_ext.send_message(router.underlying, b"slow", [b"%d" % n, b"middle", b"end"])
        received = []
        end = time.monotonic() + DEADLINE
        while True:  # the last message, sent until the drained queue takes it
            assert time.monotonic() < end, f"the last message never arrived ({received[-3:]})"
            frames_ext.send_message(router.underlying, b"slow", [b"last"])
            if not dealer.poll(100):
                continue
            message = dealer.recv_multipart()
            if message == [b"last"]:
                break
            received.append(message)
        numbers = [int(message[0]) for message in received]
        assert all(message[1:] == [b"middle", b"end"] for message in received), received[:5]
        assert numbers == sorted(set(numbers)), "in order, each once"
        assert len(numbers) < sent, "some were dropped at the mark"
    finally:
        dealer.close()
        router.close()
        context.term()


def test_a_message_to_an_unknown_peer_is_dropped(
    pair: tuple[zmq.Socket[Any], zmq.Socket[Any]],
) -> None:
    router, _ = pair
    frames_ext.send_message(router.underlying, b"nobody", [b"lost"])  # ROUTER's rule: no error


def test_a_null_socket_is_refused() -> None:
    with pytest.raises(ValueError):
        frames_ext.recv_message(0)


def test_only_a_library_already_loaded_is_used(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="not loaded"):
        frames_ext.bind(tmp_path / "libzmq-never-loaded.so")


def test_a_loaded_library_without_libzmq_is_refused() -> None:
    import _json  # a loaded extension that does not link libzmq

    with pytest.raises(OSError, match="not found"):
        frames_ext.bind(_json.__file__)


PATHS = {"whole messages (C)": "1", "pyzmq frames": "0"}


@pytest.fixture(params=sorted(PATHS))
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, Zmq]]:
    """A server on each path, with peers connected to it; yields the path's name."""
    path: str = request.param
    server: ServerProcess = start_jobwire(
        ["--mdp-heartbeat", "10", "--max-packet-size", "2000000", "--verbose", "INFO"],
        zmq=True,
        env={"JOBWIRE_ZMQFRAMES": PATHS[path]},
    )
    peers = Zmq(server)
    try:
        yield path, peers
    finally:
        peers.close()
        code = server.stop()
        assert code == 0, f"jobwire exited with {code}:\n{server.log()}"


def echo_once(worker: Peer, version: Version) -> None:
    request = take_request(worker)
    worker.send(mdp.worker_reply(version, request.client, list(request.body)))


def test_the_server_runs_the_chosen_path(served: tuple[str, Zmq]) -> None:
    path, peers = served
    log = peers.server.log()  # the startup line names the path
    assert f"zeromq {path}" in log
    other = next(name for name in PATHS if name != path)
    assert f"zeromq {other}" not in log


@pytest.mark.parametrize("version", [V1, V2])
def test_bodies_of_many_frames_and_sizes_cross_the_broker_intact(
    served: tuple[str, Zmq], version: Version
) -> None:
    _, peers = served
    worker = peers.worker(b"echo", version)
    client = peers.peer(zmq.DEALER)
    bodies = [[b""], [b"a", b"", b"c"], [b"z" * 1_500_000], [bytes(range(256))] * 40]
    for body in bodies:
        client.send(mdp.request(version, b"echo", body))
        echo_once(worker, version)
        assert list(mdp.decode_reply(client.recv()).body) == body


def test_bad_input_is_dropped_and_the_socket_keeps_serving(served: tuple[str, Zmq]) -> None:
    _, peers = served
    bad = peers.peer(zmq.DEALER)
    for frames in ([b"junk"], [b"", b"MDPC01"], [b"", b"MDPW01", b"\x09"], [b"x" * 3_000_000]):
        bad.send(frames)  # the last is over --max-packet-size: libzmq drops that connection
    worker = peers.worker(b"echo")
    client = peers.peer(zmq.DEALER)
    client.send(mdp.request(V1, b"echo", [b"still"]))
    echo_once(worker, V1)
    assert mdp.decode_reply(client.recv()).body == (b"still",)
