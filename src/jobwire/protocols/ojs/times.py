"""RFC 3339 timestamps and ISO-8601 durations as OJS uses them, within `limits`."""

from __future__ import annotations

import functools
import math
import re
import time
from datetime import UTC, datetime
from typing import Any

from jobwire.protocols.ojs.limits import MAX_DURATION_S, MAX_TIME, MAX_TIME_TEXT, MIN_TIME

_DURATION_RE = re.compile(
    r"^P(?:(?P<d>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?$"
)


def format_time(ts: float) -> str:
    """Seconds since the epoch -> `2026-01-02T03:04:05.678Z`.

    Every job rendered shows a few timestamps, mostly of the same second: the text up to the
    second is kept for the last second seen (strftime was 5 % of the server's CPU under a
    stream of OJS pushes). Rounds as `datetime.fromtimestamp` does (to the microsecond, half
    to even), then truncates to the millisecond."""
    frac, whole = math.modf(ts)
    micro = round(frac * 1e6)
    second = int(whole)
    if micro >= 1_000_000:
        second += 1
        micro -= 1_000_000
    elif micro < 0:
        second -= 1
        micro += 1_000_000
    cached = _second_text
    if cached[0] != second:
        text = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        cached = _second_text[:] = [second, text]
    return f"{cached[1]}{micro // 1000:03d}Z"


#: [the second, its text up to the seconds' dot] of the last `format_time` call's second.
_second_text: list[Any] = [None, ""]


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
