"""The one payload rule, for everything the SDK sends: job payloads, results, data, warnings.

- `bytes`, `bytearray`, `memoryview`: sent as they are;
- `str`: UTF-8;
- `None`: empty (a task that returns nothing completes with an empty result);
- anything else: compact JSON (`json.dumps`, UTF-8). What JSON cannot encode is a `TypeError`.

What comes back (results, `Job.payload`, updates) is always `bytes`; decode it yourself, or use
`Job.text` / `Job.json()` on the worker side.
"""

from __future__ import annotations

import json
from typing import Any


def to_bytes(value: Any) -> bytes:
    """Encode `value` by the payload rule."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if value is None:
        return b""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"cannot send {type(value).__name__}: use bytes, str, None or JSON-able data ({exc})"
        ) from None
