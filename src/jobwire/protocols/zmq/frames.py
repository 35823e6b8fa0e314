"""The one rule between multipart bodies and a job's payload bytes (and back).

A job's payload is bytes; a ZeroMQ body is one or more frames. The payload is the frames
concatenated, so a one-frame body (the common case) is the payload itself, and a worker of
any other protocol (Gearman, OJS, Rota) sees the bytes it would expect. When a body has
several frames, their sizes are kept beside the job (`FRAME_SIZES` in its protocol
attributes), so a ZeroMQ worker gets the same frames back. A result from a worker of
another protocol is one frame; a ZeroMQ worker's multi-frame reply keeps its sizes the same
way for the client.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

#: The key of a job's (or result's) frame sizes in `Job.ext`.
FRAME_SIZES: Final = "zmq_frames"
RESULT_FRAME_SIZES: Final = "zmq_result_frames"


def join(frames: Sequence[bytes]) -> tuple[bytes, list[int] | None]:
    """The payload of a body, and its frame sizes if it has more than one frame."""
    if len(frames) == 1:
        return frames[0], None
    return b"".join(frames), [len(frame) for frame in frames]


def split(payload: bytes, sizes: Sequence[int] | None) -> list[bytes]:
    """The frames of a payload: one frame, unless sizes say how it was cut (and add up)."""
    if not sizes or sum(sizes) != len(payload) or any(size < 0 for size in sizes):
        return [payload]
    frames = []
    at = 0
    for size in sizes:
        frames.append(payload[at : at + size])
        at += size
    return frames
