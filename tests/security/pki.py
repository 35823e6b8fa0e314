"""Throwaway certificates made at test time with the openssl command (never committed)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@dataclass
class PKI:
    """A CA, a server certificate for 127.0.0.1/localhost, and client certificates."""

    root: Path

    @property
    def ca(self) -> Path:
        return self.root / "ca.pem"

    def server(self, name: str = "server") -> tuple[Path, Path]:
        """A server certificate (and key) signed by the CA; `name` tells them apart."""
        return self._issue(
            name,
            f"/CN=localhost/O={name}",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        )

    def client(self, name: str, subject: str) -> tuple[Path, Path]:
        return self._issue(name, subject, "extendedKeyUsage=clientAuth\n")

    def _issue(self, name: str, subject: str, extensions: str) -> tuple[Path, Path]:
        cert, key = self.root / f"{name}.pem", self.root / f"{name}.key"
        ext = self.root / f"{name}.ext"
        ext.write_text(extensions)
        _openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key.name,
            "-out", f"{name}.csr", "-subj", subject, cwd=self.root,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-out", cert.name, "-extfile", ext.name,
            cwd=self.root,
        )  # fmt: skip
        return cert, key


def make_pki(root: Path) -> PKI:
    root.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=jobwire test CA", cwd=root,
    )  # fmt: skip
    return PKI(root)
