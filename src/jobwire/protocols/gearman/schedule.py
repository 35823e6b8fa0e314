"""Next run time for Gearman's SUBMIT_JOB_SCHED fields (minute hour mday month wday).

Each field is a number or empty (any), as in a one-value crontab line; times are the
server's local time, as cron's are.
"""

from __future__ import annotations

from datetime import datetime, timedelta

# Valid ranges; wday follows cron: 0 (or 7) is Sunday.
RANGES = {"minute": (0, 59), "hour": (0, 23), "mday": (1, 31), "month": (1, 12), "wday": (0, 7)}


def parse_field(name: str, raw: bytes) -> int | None:
    """None for an empty (wildcard) field; ValueError for junk or out of range."""
    text = raw.strip()
    if not text or text == b"*":
        return None
    if not text.isdigit():
        raise ValueError(f"{name} must be a number, got {raw!r}")
    value = int(text)
    low, high = RANGES[name]
    if not low <= value <= high:
        raise ValueError(f"{name} must be in {low}..{high}, got {value}")
    return value


def next_run(
    now: float,
    minute: int | None,
    hour: int | None,
    mday: int | None,
    month: int | None,
    wday: int | None,
) -> float:
    """The first whole minute strictly after `now` that matches every given field."""
    # The next whole minute. When DST ends its wall time goes back an hour (to repeat it);
    # when DST starts, wall time jumps ahead (times in the gap then run late, as in cron).
    # Starting from the earlier of the two covers both.
    wall_next = datetime.fromtimestamp(now).replace(second=0, microsecond=0) + timedelta(minutes=1)
    start = min(wall_next, datetime.fromtimestamp((now // 60 + 1) * 60))
    cron_wday = None if wday is None else wday % 7
    candidate = start
    # Walk day by day, then minute by minute within a matching day: at most ~4 years of days.
    for _ in range(366 * 5):
        day_ok = (
            (month is None or candidate.month == month)
            and (mday is None or candidate.day == mday)
            and (cron_wday is None or (candidate.isoweekday() % 7) == cron_wday)
        )
        if day_ok:
            for hh in range(candidate.hour, 24):
                if hour is not None and hh != hour:
                    continue
                first_minute = candidate.minute if hh == candidate.hour else 0
                for mm in range(first_minute, 60):
                    if minute is None or mm == minute:
                        # A wall time repeated when DST ends exists twice (fold 0, then 1).
                        for fold in (0, 1):
                            when = candidate.replace(hour=hh, minute=mm, fold=fold).timestamp()
                            if when > now:
                                return when
        candidate = (candidate + timedelta(days=1)).replace(hour=0, minute=0)
    raise ValueError("no time matches this schedule")
