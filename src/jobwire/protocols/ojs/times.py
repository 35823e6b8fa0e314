"""RFC 3339 timestamps and ISO-8601 durations as OJS uses them."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

_DURATION_RE = re.compile(
    r"^P(?:(?P<d>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?$"
)


def format_time(ts: float) -> str:
    """Seconds since the epoch -> `2026-01-02T03:04:05.678Z`."""
    dt = datetime.fromtimestamp(ts, UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def parse_time(text: str, now: float | None = None) -> float:
    """RFC 3339 (a timezone is required) -> seconds since the epoch; ValueError if invalid.

    `+DURATION` (ISO-8601, e.g. `+PT5S`, as the conformance suite sends) means that long
    after `now` (default: the current time).
    """
    if isinstance(text, str) and text.startswith("+"):
        return (time.time() if now is None else now) + parse_duration(text[1:])
    if not isinstance(text, str) or "T" not in text:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")
    dt = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    if dt.tzinfo is None:
        raise ValueError(f"timestamp has no timezone: {text!r}")
    return dt.timestamp()


def parse_duration(text: str) -> float:
    """ISO-8601 duration (`PT1S`, `PT5M`, `P1DT2H`) -> seconds; ValueError if invalid."""
    match = _DURATION_RE.match(text) if isinstance(text, str) else None
    if match is None or text in ("P", "PT") or text.endswith("T"):
        raise ValueError(f"not an ISO-8601 duration: {text!r}")
    parts = {k: float(v) for k, v in match.groupdict().items() if v is not None}
    return (
        parts.get("d", 0.0) * 86400
        + parts.get("h", 0.0) * 3600
        + parts.get("m", 0.0) * 60
        + parts.get("s", 0.0)
    )
