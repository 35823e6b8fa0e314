"""Registering job specs: the HTTP endpoint, `jobwire spec`, and the registry file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from jobwire.protocols.rota import checksum
from tests.rota.support import Rota, run
from tests.servers import ServerProcess, start_jobwire

SPEC = {"name": "resize", "params": {"width": "integer"}, "version": 1}


def test_register_is_idempotent_and_a_new_version_replaces(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        first = await rota.http.post("/rota/v1/specs", SPEC, 201)
        assert first["spec"]["checksum"] == checksum(SPEC)
        assert first["spec"]["replaced"] is None
        again = await rota.http.post("/rota/v1/specs", SPEC, 200)
        assert again["spec"]["checksum"] == checksum(SPEC)
        v2 = {**SPEC, "version": 2}
        replaced = await rota.http.post("/rota/v1/specs", v2, 201)
        assert replaced["spec"]["replaced"] == checksum(SPEC)
        listed = (await rota.http.get("/rota/v1/specs"))["specs"]
        assert [(s["name"], s["checksum"]) for s in listed] == [("resize", checksum(v2))]
        one = await rota.http.get("/rota/v1/specs/resize")
        assert one["spec"]["spec"] == v2
        status, body = await rota.http.request("GET", "/rota/v1/specs/nope")
        assert (status, body["error"]["code"]) == (404, "not_found")

    run(server, scenario)


def test_invalid_specs_are_refused(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        for bad in ([1], {"version": 1}, {"name": "a", "ratio": 0.5}):
            status, body = await rota.http.request("POST", "/rota/v1/specs", bad)
            assert (status, body["error"]["code"]) == (400, "invalid_request"), bad
        async with rota.session.post(rota.http.base + "/rota/v1/specs", data=b"{nope") as resp:
            assert resp.status == 400

    run(server, scenario)


def jobwire_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobwire", *args], capture_output=True, text=True, timeout=60
    )


def test_spec_cli_registers_and_computes_checksums(server: ServerProcess, tmp_path: Path) -> None:
    path = tmp_path / "resize.json"
    path.write_text(json.dumps(SPEC, indent=2))
    offline = jobwire_cli("spec", "checksum", str(path))
    assert offline.returncode == 0, offline.stderr
    assert offline.stdout == f"resize\t{checksum(SPEC)}\n"
    url = f"http://127.0.0.1:{server.http_port}"
    registered = jobwire_cli("spec", "register", str(path), "--url", url)
    assert registered.returncode == 0, registered.stderr
    assert registered.stdout == f"resize\t{checksum(SPEC)}\n"
    listed = jobwire_cli("spec", "list", "--url", url)
    assert listed.stdout.startswith(f"resize\t{checksum(SPEC)}\t")
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x", "ratio": 0.5}')
    refused = jobwire_cli("spec", "register", str(bad), "--url", url)
    assert refused.returncode == 1
    assert "not allowed" in refused.stderr


def test_registered_specs_survive_a_restart(tmp_path: Path) -> None:
    store = f"sqlite:{tmp_path / 'data' / 'jobwire.db'}"
    (tmp_path / "data").mkdir()
    first = start_jobwire(http=True, store=store)
    try:
        url = f"http://127.0.0.1:{first.http_port}"
        spec_file = tmp_path / "resize.json"
        spec_file.write_text(json.dumps(SPEC))
        assert jobwire_cli("spec", "register", str(spec_file), "--url", url).returncode == 0
    finally:
        assert first.stop() == 0, first.log()
    assert (tmp_path / "data" / "rota-specs.json").exists()
    second = start_jobwire(http=True, store=store)
    try:
        url = f"http://127.0.0.1:{second.http_port}"
        listed = jobwire_cli("spec", "list", "--url", url)
        assert listed.stdout.startswith(f"resize\t{checksum(SPEC)}\t"), listed
    finally:
        assert second.stop() == 0, second.log()
