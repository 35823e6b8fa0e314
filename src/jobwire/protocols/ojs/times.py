"""RFC 3339 timestamps and ISO-8601 durations as OJS uses them, within `limits`."""

from __future__ import annotations

import functools
import math
import re
import time
from datetime import UTC, datetime
from typing import Final

from jobwire.protocols.ojs.limits import MAX_DURATION_S, MAX_TIME, MAX_TIME_TEXT, MIN_TIME

_DURATION_RE = re.compile(
    r"^P(?:(?P<d>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?$"
)


def format_time(ts: float) -> str:
    """Seconds since the epoch -> `2026-01-02T03:04:05.678Z`.

    Every job rendered shows a few timestamps, mostly of the same second: the text up to the
    second is kept for the last second seen (strftime was 5 % of the server's CPU under a
    stream of OJS pushes), the milliseconds come from a table. Rounds as
    `datetime.fromtimestamp` does (to the microsecond, half to even), then truncates to the
    millisecond. Written for mypyc: `math.modf`, `round` and a format spec are Python calls
    there, `int`, float arithmetic and `math.floor` are not."""
    second = int(ts)  # toward zero, as modf splits
    scaled = (ts - second) * 1e6  # the subtraction is exact
    micro = math.floor(scaled)
    rest = scaled - micro
    if rest > 0.5 or (rest == 0.5 and micro % 2 == 1):  # half to even
        micro += 1
    if micro >= 1_000_000:
        second += 1
        micro -= 1_000_000
    elif micro < 0:
        second -= 1
        micro += 1_000_000
    last, text = _LAST_SECOND.pair  # one read: another thread may replace the pair
    if last != second:
        text = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        _LAST_SECOND.pair = (second, text)
    return text + _MILLIS[micro // 1000]


class _Second:
    """The last second `format_time` wrote, and its text up to the seconds' dot."""

    def __init__(self) -> None:
        self.pair = (0, "1970-01-01T00:00:00.")


_LAST_SECOND: Final = _Second()
#: Each millisecond's text, "000Z" to "999Z".
_MILLIS: Final = tuple(f"{ms:03d}Z" for ms in range(1000))


def check_time(ts: float) -> float:
    """`ts` if it lies within [MIN_TIME, MAX_TIME] (1970 to the end of 9999); else ValueError."""
    if not MIN_TIME <= ts <= MAX_TIME:  # NaN fails too
        raise ValueError("must lie between 1970-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z")
    return ts


def parse_time(text: str, now: float | None = None) -> float:
    """RFC 3339 (a timezone is required) -> seconds since the epoch; ValueError if invalid
    or outside 1970 to 9999.

    `+DURATION` (ISO-8601, e.g. `+PT5S`, as the conformance suite sends) means that long
    after `now` (default: the current time).
    """
    if not isinstance(text, str) or len(text) > MAX_TIME_TEXT:
        raise ValueError("must be an RFC 3339 timestamp with a timezone")
    if text.startswith("+"):
        return check_time((time.time() if now is None else now) + parse_duration(text[1:]))
    if "T" not in text:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        if dt.tzinfo is None:
            raise ValueError(f"timestamp has no timezone: {text!r}")
        ts = dt.timestamp()
    except OverflowError:
        raise ValueError("must lie between 1970 and 9999") from None
    return check_time(ts)


@functools.lru_cache(maxsize=1024)
def parse_duration(text: str) -> float:
    """ISO-8601 duration (`PT1S`, `PT5M`, `P1DT2H`) -> seconds; ValueError if invalid or
    longer than `MAX_DURATION_S` (100 years)."""
    if not isinstance(text, str) or len(text) > MAX_TIME_TEXT:
        raise ValueError("must be an ISO-8601 duration such as PT5M")
    match = _DURATION_RE.match(text)
    if match is None or text in ("P", "PT") or text.endswith("T"):
        raise ValueError(f"not an ISO-8601 duration: {text!r}")
    parts = {k: float(v) for k, v in match.groupdict().items() if v is not None}
    seconds = (
        parts.get("d", 0.0) * 86400
        + parts.get("h", 0.0) * 3600
        + parts.get("m", 0.0) * 60
        + parts.get("s", 0.0)
    )
    if not math.isfinite(seconds) or seconds > MAX_DURATION_S:
        raise ValueError(f"a duration is at most P{MAX_DURATION_S // 86400}D (100 years)")
    return seconds
