"""Microseconds to decode and validate one typical Rota result heartbeat.

A worker with four slots reports two finished jobs (one success with a small JSON result,
one failure), progress for a third, CPU and RAM, and its `wants`: what the server decodes
most. `python bench/rota_decode.py` prints the best of several rounds, per message.
"""

from __future__ import annotations

import time

import orjson

from jobwire.protocols.rota import decode_worker_message

JOB = "0190f3a2-7c1e-7b3d-9a4f-1c2d3e4f5a6b"
FRAME = orjson.dumps(
    {
        "v": 1,
        "type": "heartbeat",
        "seq": 1234,
        "wants": 4,
        "status": {
            "cpu": 37.5,
            "ram": 123_456_789,
            "progress": [{"job": JOB[:-1] + "c", "current": 3, "total": 10}],
        },
        "results": [
            {"job": JOB, "outcome": "success", "data": {"width": 64, "path": "a.png"}},
            {
                "job": JOB[:-1] + "d",
                "outcome": "failure",
                "error": {"code": "bad_image", "message": "not a PNG", "retryable": False},
            },
        ],
    }
)


def per_message(n: int = 20_000, rounds: int = 7) -> float:
    best = float("inf")
    decode = decode_worker_message
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            decode(FRAME)
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


if __name__ == "__main__":
    decode_worker_message(FRAME)  # warm up, and fail loudly if the frame is refused
    print(f"{len(FRAME)} bytes: {per_message():.2f} µs per result heartbeat")
