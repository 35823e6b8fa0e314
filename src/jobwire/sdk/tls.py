"""The SDK's `tls=` and `token=` arguments (docs/security.md).

`tls=`: an `ssl.SSLContext` as is; a CA file (str or Path) to verify the server against; or a
sequence (ca, cert, key) of paths for mutual TLS, the certificate naming this program's
principal. `token=`: the bearer token of a principal of the server's --auth file: sent as
`Authorization: Bearer` over HTTP and WebSocket, and as `OPTION_REQ auth:TOKEN` on Gearman.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import TypeAlias

TLSOption: TypeAlias = ssl.SSLContext | str | Path | Sequence[str | Path] | None


def client_context(tls: TLSOption) -> ssl.SSLContext | None:
    """An SSLContext for `tls=` (None: plain TCP)."""
    if tls is None or isinstance(tls, ssl.SSLContext):
        return tls
    if isinstance(tls, (str, Path)):
        return ssl.create_default_context(cafile=str(tls))
    paths = [str(path) for path in tls]
    if len(paths) not in (1, 3):
        raise ValueError("tls= takes an SSLContext, a CA file, or (ca, cert, key) paths")
    context = ssl.create_default_context(cafile=paths[0])
    if len(paths) == 3:
        context.load_cert_chain(paths[1], paths[2])
    return context


def bearer_header(token: str | None) -> dict[str, str] | None:
    """The HTTP headers that carry `token` (None: none)."""
    return {"Authorization": f"Bearer {token}"} if token else None
