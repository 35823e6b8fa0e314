"""Cron expressions: parse them, and find the next time one fires in an IANA timezone.

Accepted: 5 fields (minute hour day-of-month month day-of-week) or 6 (seconds first); in each
field `*`, lists `a,b`, ranges `a-b`, steps `*/n`, `a-b/n`, `a/n`; month and weekday names
(JAN..DEC, SUN..SAT, any case); 0 and 7 are Sunday. Aliases @yearly @annually @monthly
@weekly @daily @midnight @hourly, and `@every <duration>` (Go style: 1h30m, 45s, 500ms),
which fires every interval from its anchor (registration or last run). When both day fields
are restricted, a day matching either one fires (POSIX cron). Times that do not exist when
DST starts are skipped; times that exist twice when DST ends fire once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
_DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
_NAMES = {
    "month": {name: n + 1 for n, name in enumerate(_MONTHS)},
    "weekday": {name: n for n, name in enumerate(_DAYS)},
}
_BOUNDS = {
    "second": (0, 59),
    "minute": (0, 59),
    "hour": (0, 23),
    "day": (1, 31),
    "month": (1, 12),
    "weekday": (0, 7),
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
#: How far ahead to look for a match (an expression like 0 0 30 2 * never fires).
_SEARCH_DAYS = 366 * 5
#: The latest time a schedule may fire: the end of year 9999, the last one a timestamp can
#: write (the OJS binding's `limits.MAX_TIME`).
LATEST = 253402300799.0
#: The longest `@every` interval: 100 years (the OJS binding's `limits.MAX_DURATION_S`).
MAX_EVERY = 36500 * 86400


class CronError(ValueError):
    """An expression or timezone that cannot be used."""


@dataclass(frozen=True, slots=True)
class CronExpression:
    text: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # day-of-month was `*`
    any_weekday: bool
    every: float | None = None  # @every: seconds between runs

    def next_after(self, after: float, tz: ZoneInfo, anchor: float | None = None) -> float:
        """The first firing time strictly after `after` (seconds since the epoch)."""
        if self.every is not None:
            start = after if anchor is None else anchor
            if start > after:
                return start
            runs = int((after - start) // self.every) + 1
            return start + runs * self.every
        local = datetime.fromtimestamp(after, tz)
        day = local.date()
        for _ in range(_SEARCH_DAYS):
            if self._day_matches(day):
                found = self._first_in_day(day, after, tz)
                if found is not None:
                    return found
            day += timedelta(days=1)
        raise CronError(f"{self.text!r} never fires")

    def first_run(self, now: float, tz: ZoneInfo, anchor: float | None = None) -> float:
        """`next_after(now)`, refused (CronError) when it never comes or comes after
        `LATEST`: a schedule the engine keeps always has a next time it can write."""
        when = self.next_after(now, tz, anchor)
        if not when <= LATEST:
            raise CronError(f"{self.text!r} would not fire before the year 10000")
        return when

    def _day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        in_month = day.day in self.days
        on_weekday = (day.isoweekday() % 7) in self.weekdays
        if self.any_day and self.any_weekday:
            return True
        if self.any_day:
            return on_weekday
        if self.any_weekday:
            return in_month
        return in_month or on_weekday

    def _first_in_day(self, day: date, after: float, tz: ZoneInfo) -> float | None:
        for hour in sorted(self.hours):
            for minute in sorted(self.minutes):
                for second in sorted(self.seconds):
                    wall = datetime(day.year, day.month, day.day, hour, minute, second, tzinfo=tz)
                    when = wall.timestamp()
                    if when <= after:
                        continue
                    # A wall time in the DST gap does not exist: it comes back shifted.
                    back = datetime.fromtimestamp(when, tz)
                    if (back.hour, back.minute) != (hour, minute):
                        continue
                    return when
        return None


def zone(name: str | None) -> ZoneInfo:
    """An IANA timezone (UTC when None); fixed offsets and abbreviations are refused."""
    if name is None or name == "UTC":
        return ZoneInfo("UTC")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_+\-]*(/[\w+\-]+)*", name):
        raise CronError(f"timezone must be an IANA name such as Europe/Paris, not {name!r}")
    if re.fullmatch(r"(UTC|GMT)?[+\-]\d.*", name):
        raise CronError(f"timezone must be an IANA name, not a fixed offset: {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise CronError(f"unknown timezone {name!r}") from None


def parse(text: str) -> CronExpression:
    """Parse an expression; raises CronError saying what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise CronError("the cron expression is empty")
    source = text.strip()
    lowered = source.lower()
    if lowered.startswith("@every"):
        return _every(source)
    if lowered.startswith("@"):
        if lowered not in ALIASES:
            raise CronError(f"unknown cron alias {source!r}; use one of {', '.join(ALIASES)}")
        source_fields = ALIASES[lowered].split()
    else:
        source_fields = source.split()
    if len(source_fields) == 5:
        source_fields = ["0", *source_fields]
    elif len(source_fields) != 6:
        raise CronError(
            f"a cron expression has 5 fields (minute hour day month weekday) or 6 (seconds "
            f"first), not {len(source_fields)}"
        )
    names = ("second", "minute", "hour", "day", "month", "weekday")
    values = [_field(name, raw) for name, raw in zip(names, source_fields, strict=True)]
    weekdays = frozenset(v % 7 for v in values[5])
    return CronExpression(
        text=text,
        seconds=values[0],
        minutes=values[1],
        hours=values[2],
        days=values[3],
        months=values[4],
        weekdays=weekdays,
        any_day=source_fields[3] in ("*", "?"),
        any_weekday=source_fields[5] in ("*", "?"),
    )


def _every(text: str) -> CronExpression:
    spec = text[len("@every") :].strip()
    total = 0.0
    pos = 0
    for match in _DURATION_PART.finditer(spec):
        if match.start() != pos:
            break
        value, unit = float(match.group(1)), match.group(2)
        total += value * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
        pos = match.end()
    if not spec or pos != len(spec) or total < 1:
        raise CronError(f"@every needs a duration of at least 1s such as 30m or 1h30m: {text!r}")
    if total > MAX_EVERY:
        raise CronError(f"@every is at most {MAX_EVERY // 3600}h (100 years): {text!r}")
    empty: frozenset[int] = frozenset()
    return CronExpression(text, empty, empty, empty, empty, empty, empty, True, True, total)


def _field(name: str, raw: str) -> frozenset[int]:
    low, high = _BOUNDS[name]
    out: set[int] = set()
    for part in raw.split(","):
        out.update(_part(name, part, low, high))
    return frozenset(out)


def _part(name: str, part: str, low: int, high: int) -> range:
    if not part:
        raise CronError(f"empty value in the {name} field")
    base, slash, step_text = part.partition("/")
    step = 1
    if slash:
        if not step_text.isdigit() or int(step_text) == 0:
            raise CronError(f"the step in {name} field {part!r} must be a positive integer")
        step = int(step_text)
    if base in ("*", "?"):
        start, end = low, high
    elif "-" in base:
        first, _, last = base.partition("-")
        start, end = _value(name, first, low, high), _value(name, last, low, high)
        if start > end:
            raise CronError(f"the range {part!r} in the {name} field runs backwards")
    else:
        start = _value(name, base, low, high)
        end = high if slash else start
    return range(start, end + 1, step)


def _value(name: str, text: str, low: int, high: int) -> int:
    named = _NAMES.get(name, {}).get(text.upper())
    if named is not None:
        return named
    if not text.isdigit():
        raise CronError(f"{text!r} is not a valid {name} (allowed {low}-{high})")
    value = int(text)
    if not low <= value <= high:
        raise CronError(f"{name} {value} is out of range {low}-{high}")
    return value
