"""TLS on the Gearman and HTTP ports, mutual TLS with roles by certificate subject, and
certificates re-read on SIGHUP without dropping connections."""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwire.sdk import AsyncClient, Client, Worker
from jobwire.sdk.errors import NotAcknowledged, ServerUnavailable
from tests.security.conftest import SUBJECTS, TOKENS
from tests.security.http_util import call
from tests.security.pki import PKI
from tests.security.test_gearman_auth import packet
from tests.servers import ServerProcess, start_jobwire

DEADLINE = 30.0
ECHO_REQ, ECHO_RES, SUBMIT_JOB_BG, ERROR = 16, 17, 18, 19


@pytest.fixture(scope="module")
def tls_server(pki: PKI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    cert, key = pki.server()
    server = start_jobwire(
        ["--tls-cert", str(cert), "--tls-key", str(key)],
        http=True,
        workdir=tmp_path_factory.mktemp("tls"),
    )
    yield server
    assert server.stop() == 0, server.log()


def tls_socket(port: int, context: ssl.SSLContext) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
    return context.wrap_socket(raw, server_hostname="127.0.0.1")


def read_packet(sock: ssl.SSLSocket) -> tuple[int, bytes]:
    data = b""
    while len(data) < 12 or len(data) < 12 + int.from_bytes(data[8:12], "big"):
        chunk = sock.recv(65536)
        assert chunk, "closed"
        data += chunk
    return int.from_bytes(data[4:8], "big"), data[12:]


def test_sdk_client_and_worker_run_a_job_over_tls(tls_server: ServerProcess, pki: PKI) -> None:
    async def main() -> None:
        worker = Worker([tls_server.address], tls=pki.ca, heartbeat=60)

        @worker.task("tls-job")
        def task(job) -> bytes:  # type: ignore[no-untyped-def]
            return job.payload[::-1]

        running = asyncio.create_task(worker.serve())
        try:
            async with AsyncClient([tls_server.address], tls=pki.ca) as client:
                assert await client.submit("tls-job", b"abc", timeout=DEADLINE) == b"cba"
        finally:
            worker.stop()
            await running

    asyncio.run(main())


def test_plain_gearman_is_not_served_on_a_tls_port(tls_server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", tls_server.port), timeout=DEADLINE) as sock:
        sock.sendall(packet(ECHO_REQ, b"clear"))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        assert b"clear" not in data  # no ECHO_RES: the server wanted a TLS handshake


def test_an_untrusted_server_certificate_fails_the_sdk(tls_server: ServerProcess) -> None:
    client = Client([tls_server.address], tls=ssl.create_default_context(), retries=0)
    try:
        with pytest.raises(ServerUnavailable, match="certificate"):
            client.submit_background("x", b"y", wait=True)
        # A pipelined submission fails the same way, at flush.
        client.submit_background("x", b"y")
        with pytest.raises(NotAcknowledged) as refused:
            client.flush()
        assert isinstance(refused.value.failures[0][1], ServerUnavailable)
    finally:
        client.close()


def test_https_serves_ojs(tls_server: ServerProcess, pki: PKI) -> None:
    context = ssl.create_default_context(cafile=str(pki.ca))
    url = f"https://127.0.0.1:{tls_server.http_port}/ojs/v1/health"
    status, _, body = call(url, context=context)
    assert status == 200 and body["status"] == "ok"


@pytest.mark.interop
def test_debian_gearman_tools_are_built_without_ssl(
    tls_server: ServerProcess, jobwire: ServerProcess
) -> None:
    """`gearadmin -S` is accepted but does nothing in Debian's build (libgearman8 links no TLS
    library): it speaks clear text to a plain server, and cannot talk to a TLS one. The stock
    tools therefore cannot be used against --tls-cert; the SDK (and any libgearman built with
    SSL, which sends its GEARMAN_CLIENT_PEM/KEY certificate) can."""
    gearadmin = shutil.which("gearadmin")
    if gearadmin is None:
        pytest.skip("gearman-tools is not installed")
    plain = subprocess.run(
        [gearadmin, "-S", "-h", "127.0.0.1", "-p", str(jobwire.port), "--status"],
        capture_output=True,
        timeout=DEADLINE,
    )
    assert plain.returncode == 0 and plain.stdout.strip().endswith(b".")
    over_tls = subprocess.run(
        [gearadmin, "-S", "-h", "127.0.0.1", "-p", str(tls_server.port), "--status"],
        capture_output=True,
        timeout=DEADLINE,
    )
    assert over_tls.returncode != 0 or not over_tls.stdout.strip().endswith(b".")


# -- mutual TLS ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mtls_server(
    pki: PKI, auth_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    cert, key = pki.server("mtls-server")
    server = start_jobwire(
        [
            "--tls-cert", str(cert), "--tls-key", str(key), "--tls-client-ca", str(pki.ca),
            "--auth", str(auth_file),
        ],
        http=True,
        workdir=tmp_path_factory.mktemp("mtls"),
    )  # fmt: skip
    yield server
    assert server.stop() == 0, server.log()


def client_context(pki: PKI, name: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if name is not None:
        subject = SUBJECTS[name][0] if name in SUBJECTS else f"/CN={name}"
        cert, key = pki.client(name, subject)
        context.load_cert_chain(cert, key)
    return context


def test_mutual_tls_refuses_a_client_without_a_certificate(
    mtls_server: ServerProcess, pki: PKI
) -> None:
    with pytest.raises((ssl.SSLError, ConnectionError, AssertionError)):
        sock = tls_socket(mtls_server.port, client_context(pki, None))
        # TLS 1.3: the refusal arrives after the client's handshake ends.
        sock.sendall(packet(ECHO_REQ, b"x"))
        read_packet(sock)


def test_the_certificate_subject_names_the_principal_and_its_role(
    mtls_server: ServerProcess, pki: PKI
) -> None:
    sock = tls_socket(mtls_server.port, client_context(pki, "cert-runner"))
    try:
        # A worker by its certificate: no token needed, and worker packets go through.
        sock.sendall(packet(ECHO_REQ, b"hi"))
        assert read_packet(sock) == (ECHO_RES, b"hi")
        sock.sendall(packet(SUBMIT_JOB_BG, b"f", b"", b"x"))
        kind, body = read_packet(sock)
        assert kind == ERROR and body.startswith(b"PERMISSION_DENIED")
    finally:
        sock.close()
    # Over HTTPS the same certificate is the same principal.
    context = client_context(pki, "cert-runner")
    url = f"https://127.0.0.1:{mtls_server.http_port}/ojs/v1"
    status, _, body = call(url + "/workers/fetch", "POST", {"queues": ["none"]}, context=context)
    assert status == 200, body
    status, _, body = call(url + "/jobs", "POST", {"type": "t", "args": []}, context=context)
    assert status == 403, body


def test_an_unknown_certificate_still_needs_a_token(mtls_server: ServerProcess, pki: PKI) -> None:
    sock = tls_socket(mtls_server.port, client_context(pki, "stranger"))
    try:
        sock.sendall(packet(26, b"auth:" + TOKENS["submitter"].encode()))
        assert read_packet(sock) == (27, b"auth")
        sock.sendall(packet(SUBMIT_JOB_BG, b"f", b"", b"x"))
        assert read_packet(sock)[0] == 8  # JOB_CREATED
    finally:
        sock.close()


# -- SIGHUP ----------------------------------------------------------------------------------


def peer_organisation(port: int, pki: PKI) -> str:
    context = ssl.create_default_context(cafile=str(pki.ca))
    with tls_socket(port, context) as sock:
        cert = sock.getpeercert()
    assert cert is not None
    return dict(rdn[0] for rdn in cert["subject"])["organizationName"]


def test_sighup_rereads_the_certificate_and_keeps_connections(pki: PKI, tmp_path: Path) -> None:
    first_cert, first_key = pki.server("first")
    second_cert, second_key = pki.server("second")
    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    shutil.copy(first_cert, cert)
    shutil.copy(first_key, key)
    server = start_jobwire(
        ["--tls-cert", str(cert), "--tls-key", str(key)], workdir=tmp_path, http=True
    )
    try:
        assert peer_organisation(server.port, pki) == "first"
        kept = tls_socket(server.port, ssl.create_default_context(cafile=str(pki.ca)))
        kept.sendall(packet(ECHO_REQ, b"before"))
        assert read_packet(kept) == (ECHO_RES, b"before")
        shutil.copy(second_cert, cert)
        shutil.copy(second_key, key)
        server.proc.send_signal(signal.SIGHUP)
        end = time.monotonic() + DEADLINE
        while peer_organisation(server.port, pki) != "second":
            assert time.monotonic() < end, server.log()
            time.sleep(0.02)
        https = f"https://127.0.0.1:{server.http_port}/ojs/v1/health"
        assert call(https, context=ssl.create_default_context(cafile=str(pki.ca)))[0] == 200
        kept.sendall(packet(ECHO_REQ, b"after"))
        assert read_packet(kept) == (ECHO_RES, b"after")
        kept.close()
        # A broken file keeps the old certificate (and the server): a new certificate with
        # a key that is not its own.
        shutil.copy(first_cert, cert)
        key.write_text("not a key")
        server.proc.send_signal(signal.SIGHUP)
        end = time.monotonic() + DEADLINE
        while "kept the old TLS certificate" not in server.log():
            assert time.monotonic() < end, server.log()
            time.sleep(0.02)
        assert peer_organisation(server.port, pki) == "second"
    finally:
        assert server.stop() == 0, server.log()


def test_rota_worker_runs_a_job_over_wss(tls_server: ServerProcess, pki: PKI) -> None:
    from jobwire.sdk.ws_worker import RotaJob, RotaWorker

    base = f"https://127.0.0.1:{tls_server.http_port}"
    context = ssl.create_default_context(cafile=str(pki.ca))
    spec = {"name": "tls.rota"}
    worker = RotaWorker(base, tls=pki.ca, grace_period=5)

    @worker.task("tls.rota", spec=spec)
    async def task(job: RotaJob) -> str:
        return f"wss {job.args[0]}"

    async def scenario() -> None:
        status, _, body = await asyncio.to_thread(
            call, base + "/rota/v1/specs", "POST", spec, context=context
        )
        assert status in (200, 201), body
        serving = asyncio.create_task(worker.serve())
        try:
            status, _, body = await asyncio.to_thread(
                call, base + "/ojs/v1/jobs", "POST", {"type": "tls.rota", "args": [5]},
                context=context,
            )  # fmt: skip
            assert status == 201, body
            job_id = body["job"]["id"]
            end = time.monotonic() + DEADLINE
            while True:
                _, _, job = await asyncio.to_thread(
                    call, base + f"/ojs/v1/jobs/{job_id}", context=context
                )
                if job["job"]["state"] == "completed":
                    break
                assert time.monotonic() < end, job
                await asyncio.sleep(0.05)
            assert job["job"]["result"] == "wss 5"
        finally:
            worker.stop()
            await serving

    asyncio.run(scenario())
