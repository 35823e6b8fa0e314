from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwire.server.auth import hash_token
from tests.security.pki import PKI, make_pki
from tests.servers import ServerProcess, start_jobwire

#: One token per principal; the --auth file holds only their hashes.
TOKENS = {
    "submitter": "tok-client-4f1c2a",
    "runner": "tok-worker-9b7e11",
    "operator": "tok-admin-0d3c55",
}
ROLES = {"submitter": ["client"], "runner": ["worker"], "operator": ["admin"]}
#: Principals named by a TLS client certificate's subject.
SUBJECTS = {"cert-runner": ("/O=Example/CN=runner-1", "O=Example,CN=runner-1", ["worker"])}


def write_auth(path: Path) -> Path:
    lines = []
    for name, token in TOKENS.items():
        lines += [
            f"[principals.{name}]",
            f'token_sha256 = "{hash_token(token)}"',
            f"roles = {ROLES[name]!r}".replace("'", '"'),
            "",
        ]
    for name, (_, subject, roles) in SUBJECTS.items():
        lines += [
            f"[principals.{name}]",
            f'subject = "{subject}"',
            f"roles = {roles!r}".replace("'", '"'),
            "",
        ]
    path.write_text("\n".join(lines))
    return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def auth_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_auth(tmp_path_factory.mktemp("auth") / "auth.toml")


@pytest.fixture(scope="module")
def authed(auth_file: Path) -> Iterator[ServerProcess]:
    """A server with --auth, plain TCP, Gearman and HTTP."""
    server = start_jobwire(["--auth", str(auth_file)], http=True)
    yield server
    assert server.stop() == 0, server.log()
