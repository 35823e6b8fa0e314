"""The command line's `--token`, `--tls-ca`, `--tls-cert` and `--tls-key` (docs/security.md).

Shared by `jobwire submit`, `jobwire worker`, `jobwire status` and `jobwire worker-state`:
the token (also from the environment variable JOBWIRE_TOKEN, which keeps it out of `ps`)
goes to the SDK's `token=`, the files to its `tls=`.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


def security_options(command: F) -> F:
    """Add the four options; the command takes `token`, `tls_ca`, `tls_cert`, `tls_key`."""
    for option in reversed(
        [
            click.option(
                "--token",
                envvar="JOBWIRE_TOKEN",
                metavar="TOKEN",
                help="The bearer token of a principal of the server's --auth file "
                "(default: $JOBWIRE_TOKEN).",
            ),
            click.option(
                "--tls-ca",
                type=_FILE,
                help="Connect over TLS, verifying the server against this CA file.",
            ),
            click.option(
                "--tls-cert",
                type=_FILE,
                help="Connect over TLS with this client certificate (mutual TLS; with --tls-key).",
            ),
            click.option("--tls-key", type=_FILE, help="The key of --tls-cert."),
        ]
    ):
        command = option(command)
    return command


def tls_context(ca: Path | None, cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    """The SDK's `tls=` for the options (None: plain TCP)."""
    if (cert is None) != (key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if ca is None and cert is None:
        return None
    try:
        context = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
        if cert is not None and key is not None:
            context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise click.UsageError(f"cannot use the TLS files: {exc}") from exc
    return context


def secure(worker: Any, tls: ssl.SSLContext | None, token: str | None) -> None:
    """Give an SDK worker the options that were given (the others stay as its code set them)."""
    if tls is not None:
        worker.tls = tls
    if token is not None:
        worker.token = token
