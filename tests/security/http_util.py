"""A small HTTP(S) caller for the security tests (urllib: no client library's own retries)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any


def call(
    url: str,
    method: str = "GET",
    body: Any = None,
    *,
    token: str | None = None,
    context: ssl.SSLContext | None = None,
) -> tuple[int, dict[str, str], Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            status, headers, raw = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        status, headers, raw = exc.code, dict(exc.headers), exc.read()
    if not raw:
        return status, headers, None
    try:
        return status, headers, json.loads(raw)
    except ValueError:
        return status, headers, raw.decode("utf-8", "replace")
