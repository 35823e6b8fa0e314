"""CURVE on the ZeroMQ endpoints: keys allowed by the ZAP handler, roles by client key."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

import zmq
from jobwire.protocols.zmq import wmp
from jobwire.server.auth import hash_token
from tests.servers import ServerProcess, free_port, start_jobwire

DEADLINE_MS = 30_000


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[bytes, bytes]]:
    root = tmp_path_factory.mktemp("curve")
    pairs = {}
    for name in ("server", "zclient", "zworker", "stranger"):
        _, secret_file = zmq.auth.create_certificates(root, name)
        public, secret = zmq.auth.load_certificate(secret_file)
        assert secret is not None
        pairs[name] = (public, secret)
    return pairs


@pytest.fixture(scope="module")
def curve_server(
    keys: dict[str, tuple[bytes, bytes]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("curve-server")
    auth = root / "auth.toml"
    auth.write_text(
        f"""
[principals.zclient]
curve_public_key = "{keys["zclient"][0].decode()}"
roles = ["client"]

[principals.zworker]
curve_public_key = "{keys["zworker"][0].decode()}"
roles = ["worker"]

[principals.http-only]
token_sha256 = "{hash_token("unused")}"
roles = ["admin"]
"""
    )
    secret = root / "server.key_secret"
    zmq.auth.create_certificates(root, "unused")  # a directory of keys, as in practice
    public, secret_key = keys["server"]
    secret.write_text(
        "metadata\ncurve\n"
        f'    public-key = "{public.decode()}"\n'
        f'    secret-key = "{secret_key.decode()}"\n'
    )
    freelance_port, frontend, backend = free_port(), free_port(), free_port()
    wmp_port = free_port()
    server = start_jobwire(
        [
            "--auth", str(auth), "--zmq-curve-secret", str(secret),
            "--freelance-port", str(freelance_port), "--verbose", "WARNING",
            "--ppp-frontend", f"tcp://127.0.0.1:{frontend}",
            "--ppp-backend", f"tcp://127.0.0.1:{backend}",
            "--wmp-port", str(wmp_port), "--wmp-heartbeat", "10",
        ],
        zmq=True,
        workdir=root,
    )  # fmt: skip
    server.extra["freelance_port"] = freelance_port
    server.extra["wmp"] = f"tcp://127.0.0.1:{wmp_port}"
    server.extra["ppp_frontend"] = f"tcp://127.0.0.1:{frontend}"
    server.extra["ppp_backend"] = f"tcp://127.0.0.1:{backend}"
    yield server
    assert server.stop() == 0, server.log()


def dealer(
    context: zmq.Context[zmq.Socket[bytes]],
    server: ServerProcess,
    keys: dict[str, tuple[bytes, bytes]],
    name: str,
) -> zmq.Socket[bytes]:
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, DEADLINE_MS)
    sock.curve_serverkey = keys["server"][0]
    sock.curve_publickey, sock.curve_secretkey = keys[name]
    return sock


@pytest.fixture
def context() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def endpoint(server: ServerProcess) -> str:
    return f"tcp://127.0.0.1:{server.extra['zmq_port']}"


def test_a_client_key_runs_a_job_served_by_a_worker_key(
    curve_server: ServerProcess, keys: dict[str, tuple[bytes, bytes]], context: zmq.Context
) -> None:  # type: ignore[type-arg]
    worker = dealer(context, curve_server, keys, "zworker")
    worker.connect(endpoint(curve_server))
    worker.send_multipart([b"", b"MDPW01", b"\x01", b"curve.echo"])
    client = dealer(context, curve_server, keys, "zclient")
    client.connect(endpoint(curve_server))
    client.send_multipart([b"", b"MDPC01", b"curve.echo", b"secret payload"])
    while True:
        frames = worker.recv_multipart()
        if frames[2] == b"\x02":  # REQUEST (skip heartbeats)
            break
    address, body = frames[3], frames[-1]
    assert body == b"secret payload"
    worker.send_multipart([b"", b"MDPW01", b"\x03", address, b"", b"done"])
    assert client.recv_multipart() == [b"", b"MDPC01", b"curve.echo", b"done"]


def test_a_worker_key_may_not_request(
    curve_server: ServerProcess, keys: dict[str, tuple[bytes, bytes]], context: zmq.Context
) -> None:  # type: ignore[type-arg]
    sock = dealer(context, curve_server, keys, "zworker")
    sock.connect(endpoint(curve_server))
    sock.send_multipart([b"", b"MDPC01", b"curve.other", b"x"])
    frames = sock.recv_multipart()
    assert frames[:3] == [b"", b"MDPC01", b"curve.other"]
    assert frames[4] == b"403"


def test_a_client_key_may_not_serve(
    curve_server: ServerProcess, keys: dict[str, tuple[bytes, bytes]], context: zmq.Context
) -> None:  # type: ignore[type-arg]
    sock = dealer(context, curve_server, keys, "zclient")
    sock.connect(endpoint(curve_server))
    sock.send_multipart([b"", b"MDPW01", b"\x01", b"curve.steal"])
    assert sock.recv_multipart() == [b"", b"MDPW01", b"\x05"]  # DISCONNECT


def test_an_unknown_key_fails_the_handshake(
    curve_server: ServerProcess, keys: dict[str, tuple[bytes, bytes]], context: zmq.Context
) -> None:  # type: ignore[type-arg]
    sock = dealer(context, curve_server, keys, "stranger")
    monitor = sock.get_monitor_socket(
        zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    )
    monitor.setsockopt(zmq.RCVTIMEO, DEADLINE_MS)
    sock.connect(endpoint(curve_server))
    event = recv_monitor_message(monitor)
    assert event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH
    sock.disable_monitor()
    monitor.close(linger=0)


def test_a_plain_socket_gets_nothing(
    curve_server: ServerProcess, context: zmq.Context, tmp_path: Path
) -> None:  # type: ignore[type-arg]
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    monitor = sock.get_monitor_socket(
        zmq.EVENT_HANDSHAKE_SUCCEEDED
        | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
        | zmq.EVENT_DISCONNECTED
    )
    monitor.setsockopt(zmq.RCVTIMEO, DEADLINE_MS)
    sock.connect(endpoint(curve_server))
    event = recv_monitor_message(monitor)
    assert event["event"] != zmq.EVENT_HANDSHAKE_SUCCEEDED
    sock.disable_monitor()
    monitor.close(linger=0)


def test_without_auth_the_clients_file_decides_who_connects(
    keys: dict[str, tuple[bytes, bytes]], tmp_path: Path, context: zmq.Context
) -> None:  # type: ignore[type-arg]
    public, secret_key = keys["server"]
    secret = tmp_path / "server.key_secret"
    secret.write_text(
        f'curve\n    public-key = "{public.decode()}"\n    secret-key = "{secret_key.decode()}"\n'
    )
    clients = tmp_path / "clients"
    clients.write_text(f"# the render fleet\n{keys['zclient'][0].decode()}\n")
    server = start_jobwire(
        ["--zmq-curve-secret", str(secret), "--zmq-curve-clients", str(clients)],
        zmq=True,
        workdir=tmp_path,
    )
    try:
        listed = dealer(context, server, keys, "zclient")
        listed.connect(endpoint(server))
        listed.send_multipart([b"", b"MDPC01", b"mmi.service", b"nobody"])
        assert listed.recv_multipart() == [b"", b"MDPC01", b"mmi.service", b"404"]
        unlisted = dealer(context, server, keys, "zworker")
        monitor = unlisted.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
        )
        monitor.setsockopt(zmq.RCVTIMEO, DEADLINE_MS)
        unlisted.connect(endpoint(server))
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH
        unlisted.disable_monitor()
        monitor.close(linger=0)
    finally:
        assert server.stop() == 0, server.log()


def test_freelance_serves_client_keys_and_drops_worker_keys(
    curve_server: ServerProcess, keys: dict[str, tuple[bytes, bytes]], context: zmq.Context
) -> None:  # type: ignore[type-arg]
    address = f"tcp://127.0.0.1:{curve_server.extra['freelance_port']}"
    client = dealer(context, curve_server, keys, "zclient")
    client.connect(address)
    client.send_multipart([b"PING"])
    assert client.recv_multipart() == [b"PONG"]
    worker = dealer(context, curve_server, keys, "zworker")
    worker.connect(address)
    worker.send_multipart([b"PING"])
    # Freelance has no refusal: the message is dropped, and the server says so in its log.
    wait_for_log(curve_server, "freelance: refused a message of a key without the client role")
    assert worker.poll(0) == 0


def wait_for_log(server: ServerProcess, text: str) -> None:
    end = time.monotonic() + DEADLINE_MS / 1000
    while text not in server.log():
        assert time.monotonic() < end, server.log()
        time.sleep(0.02)


def test_paranoid_pirate_roles_by_key(
    curve_server: ServerProcess, keys: dict[str, tuple[bytes, bytes]], context: zmq.Context
) -> None:  # type: ignore[type-arg]
    frontend, backend = curve_server.extra["ppp_frontend"], curve_server.extra["ppp_backend"]
    # Refused, dropped and logged: a client key on the backend, a worker key on the frontend.
    intruder = dealer(context, curve_server, keys, "zclient")
    intruder.connect(str(backend))
    intruder.send_multipart([b"\x01"])
    wait_for_log(curve_server, "pirate backend: refused a message of a key without the worker")
    impostor = dealer(context, curve_server, keys, "zworker")
    impostor.connect(str(frontend))
    impostor.send_multipart([b"", b"from a worker key"])
    wait_for_log(curve_server, "pirate frontend: refused a message of a key without the client")
    # Allowed: the worker key serves the client key's request.
    worker = dealer(context, curve_server, keys, "zworker")
    worker.connect(str(backend))
    worker.send_multipart([b"\x01"])  # READY
    client = dealer(context, curve_server, keys, "zclient")
    client.connect(str(frontend))
    client.send_multipart([b"", b"hello"])
    while True:
        frames = worker.recv_multipart()
        if len(frames) > 1:  # not a heartbeat
            break
    assert frames[-1] == b"hello"
    worker.send_multipart([*frames[:-1], b"world"])
    assert client.recv_multipart() == [b"", b"world"]
    assert intruder.poll(0) == 0  # the refused client key was never given the job


def test_a_clients_file_key_may_start_with_a_hash(
    keys: dict[str, tuple[bytes, bytes]], tmp_path: Path
) -> None:
    from jobwire.server.zmq.curve import CurveOptions

    secret = tmp_path / "server.key_secret"
    public, secret_key = keys["server"]
    secret.write_text(
        f'curve\n    public-key = "{public.decode()}"\n    secret-key = "{secret_key.decode()}"\n'
    )
    hashed = "#" + "a" * 39
    clients = tmp_path / "clients"
    clients.write_text(f"# two keys\n{hashed}\n\n  {keys['zclient'][0].decode()}  \n")
    loaded = CurveOptions.load(secret, clients, None)
    assert loaded.clients == {hashed.encode(), keys["zclient"][0]}
    clients.write_text("not a key\n")
    with pytest.raises(ValueError, match="clients:1"):
        CurveOptions.load(secret, clients, None)


def wmp_recv(sock: zmq.Socket[bytes]) -> wmp.Message:
    """The next WMP message on a worker's DEALER, heartbeats skipped."""
    while True:
        frames = sock.recv_multipart()
        hops, body = wmp.split_envelope(frames)
        assert hops == (), frames
        message = wmp.decode(body)
        if message.command != wmp.HEARTBEAT:
            return message


def wmp_send(sock: zmq.Socket[bytes], command: bytes, headers: dict[str, object]) -> None:
    sock.send_multipart([b"", *wmp.encode(command, headers)])


def test_wmp_serves_worker_keys_and_answers_client_keys_error(
    curve_server: ServerProcess, keys: dict[str, tuple[bytes, bytes]], context: zmq.Context
) -> None:  # type: ignore[type-arg]
    address = str(curve_server.extra["wmp"])
    # A client key may not act as a WMP worker: READY and GIVE are answered ERROR.
    impostor = dealer(context, curve_server, keys, "zclient")
    impostor.connect(address)
    wmp_send(impostor, wmp.READY, {"slot": "0", "functions": "curve.wmp"})
    refused = wmp_recv(impostor)
    assert refused.command == wmp.ERROR
    assert refused.get("reason").startswith("forbidden"), refused
    wait_for_log(curve_server, "wmp: refused a message of a key without the worker role")
    # A worker key may: it is woken for the client key's Majordomo request and serves it.
    worker = dealer(context, curve_server, keys, "zworker")
    worker.connect(address)
    wmp_send(worker, wmp.READY, {"slot": "0", "functions": "curve.wmp"})
    client = dealer(context, curve_server, keys, "zclient")
    client.connect(endpoint(curve_server))
    client.send_multipart([b"", b"MDPC01", b"curve.wmp", b"for a worker key"])
    assert wmp_recv(worker).command == wmp.WAKE
    # The refused client key asks for the job before the worker does: ERROR, not TAKE.
    wmp_send(impostor, wmp.GIVE, {"slot": "0"})
    refused = wmp_recv(impostor)
    assert refused.command == wmp.ERROR, refused
    wmp_send(worker, wmp.GIVE, {"slot": "0"})
    take = wmp_recv(worker)
    assert take.command == wmp.TAKE, take
    assert take.payload == (b"for a worker key",)
    worker.send_multipart(
        [b"", *wmp.encode(wmp.DONE, {"slot": "0", "job": take.get("job")}, [b"served"])]
    )
    assert client.recv_multipart() == [b"", b"MDPC01", b"curve.wmp", b"served"]
    # The other way: the worker key may not act as a client (Majordomo answers 403).
    worker_as_client = dealer(context, curve_server, keys, "zworker")
    worker_as_client.connect(endpoint(curve_server))
    worker_as_client.send_multipart([b"", b"MDPC01", b"curve.wmp", b"x"])
    assert worker_as_client.recv_multipart()[4] == b"403"
