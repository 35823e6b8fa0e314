"""CPU cost of decoding and validating one typical OJS PUSH body, in microseconds.

Measures what `POST /ojs/v1/jobs` does before it reaches the engine: JSON decode (exact
integers), the depth and 64-bit integer checks, and the validation of the envelope with its
retry and unique options into a `PushRequest` (`protocols/ojs/messages.py`). Also prints the
typed decode alone (bytes straight into the `Envelope` struct) for reference.

    .venv/bin/python bench/ojs_decode.py

Measured on the 2-core development VM: the hand-written checks on orjson that this replaced
took 12.3 us per envelope (orjson.loads, depth check, parse_push, parse_unique).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec

from jobwire.protocols.ojs.envelope import parse_push
from jobwire.protocols.ojs.messages import Envelope, _dec_hook
from jobwire.server.ojs.http import decode_json

RAW = msgspec.json.encode(
    {
        "type": "email.send",
        "args": [{"to": "a@example.com", "subject": "hi", "n": 3}],
        "meta": {"trace_id": "abc"},
        "options": {
            "queue": "email",
            "priority": 10,
            "timeout_ms": 30000,
            "tags": ["x"],
            "retry": {
                "max_attempts": 5,
                "initial_interval": "PT1S",
                "backoff_coefficient": 2.0,
                "max_interval": "PT5M",
            },
            "unique": {"keys": ["type", "args"], "period": "PT1H"},
        },
    }
)
ROUNDS = 50_000


def push() -> None:
    parse_push(decode_json(RAW))


def typed_only() -> None:
    msgspec.json.decode(RAW, type=Envelope, dec_hook=_dec_hook)


def measure(name: str, work: Callable[[], None]) -> None:
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(ROUNDS):
            work()
        best = min(best, (time.process_time() - start) / ROUNDS)
    print(f"{name}: {best * 1e6:.2f} us per envelope ({len(RAW)} bytes)")


if __name__ == "__main__":
    measure("decode + validate (POST /ojs/v1/jobs)", push)
    measure("typed decode alone (bytes -> Envelope)", typed_only)
