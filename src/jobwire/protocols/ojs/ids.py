"""UUIDv7 job ids (RFC 9562): 48-bit Unix milliseconds, version 7, 74 random bits."""

from __future__ import annotations

import os
import re
import time
from typing import Final

UUID7_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\Z")

#: An id's text after its timestamp: `h` a random hex digit, `v` a random digit of the
#: variant (`10xx`), anything else itself.
_TAIL: Final = "-7hhh-vhhh-hhhhhhhhhhhh"
_TAIL_LEN: Final = len(_TAIL)
#: Tails made per refill, from one read of OS random bytes.
_BATCH: Final = 512
#: A random byte -> a hex digit (its low 4 bits), or a variant digit (its low 2 bits).
_HEX_OF_BYTE: Final = b"0123456789abcdef" * 16
_VARIANT_OF_BYTE: Final = b"89ab" * 64
#: Each byte value's two hex digits.
_BYTE_HEX: Final = tuple(f"{i:02x}" for i in range(256))
_MS_MASK: Final = (1 << 48) - 1


class _Ids:
    """Random tails made a batch at a time from one read of OS random bytes (a few C calls
    fill one column of every tail), and the text of the timestamp's upper 32 bits (it
    changes every 65.5 s): per id a clock read, a slice and one concatenation, where
    formatting the digits took most of the time."""

    def __init__(self) -> None:
        self.tails = ""
        self.at = 0
        self.high = (-1, "")

    def refill(self) -> None:
        n = _BATCH
        random = os.urandom(_TAIL_LEN * n)
        digits = random.translate(_HEX_OF_BYTE)
        out = bytearray(_TAIL_LEN * n)
        for column, char in enumerate(_TAIL):
            if char == "h":
                out[column::_TAIL_LEN] = digits[column * n : (column + 1) * n]
            elif char == "v":
                out[column::_TAIL_LEN] = random[column * n : (column + 1) * n].translate(
                    _VARIANT_OF_BYTE
                )
            else:
                out[column::_TAIL_LEN] = char.encode() * n
        self.tails = out.decode("ascii")
        self.at = 0


_IDS: Final = _Ids()


def uuid7(now: float | None = None) -> str:
    ms = int((time.time() if now is None else now) * 1000) & _MS_MASK
    ids = _IDS
    high, high_text = ids.high  # one read: another thread may replace the pair
    if high != ms >> 16:
        high = ms >> 16
        high_text = f"{high:08x}"
        ids.high = (high, high_text)
    at = ids.at
    if at >= len(ids.tails):
        ids.refill()
        at = 0
    ids.at = at + _TAIL_LEN
    tail = ids.tails[at : at + _TAIL_LEN]
    return f"{high_text}-{_BYTE_HEX[(ms >> 8) & 255]}{_BYTE_HEX[ms & 255]}{tail}"


def is_uuid7(text: str) -> bool:
    return UUID7_RE.match(text) is not None
