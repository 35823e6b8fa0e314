"""Next run times for SUBMIT_JOB_SCHED's crontab-like fields (protocols/gearman/schedule.py).

Times are local, so every test pins the process time zone and restores it afterwards.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from jobwire.protocols.gearman.schedule import RANGES, next_run, parse_field

#: US Eastern with its DST rules, as a POSIX TZ string (needs no tz database).
EASTERN = "EST5EDT,M3.2.0,M11.1.0"


def set_tz(value: str | None) -> None:
    if value is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = value
    time.tzset()


@pytest.fixture
def tz() -> Iterator[None]:
    """Local time is UTC for the test; the previous zone is restored afterwards."""
    saved = os.environ.get("TZ")
    set_tz("UTC")
    try:
        yield
    finally:
        set_tz(saved)


@pytest.fixture
def eastern() -> Iterator[None]:
    saved = os.environ.get("TZ")
    set_tz(EASTERN)
    try:
        yield
    finally:
        set_tz(saved)


def at(text: str) -> float:
    """A UTC time as a timestamp: at("2024-01-01 10:15:20")."""
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()


def show(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S %a")


def run(
    now: str,
    minute: int | None = None,
    hour: int | None = None,
    mday: int | None = None,
    month: int | None = None,
    wday: int | None = None,
) -> str:
    return show(next_run(at(now), minute, hour, mday, month, wday))


# 2024-01-01 was a Monday; 2024 is a leap year.


@pytest.mark.usefixtures("tz")
class TestNextRun:
    def test_no_fields_is_the_next_whole_minute(self) -> None:
        assert run("2024-01-01 10:15:20") == "2024-01-01 10:16:00 Mon"

    def test_strictly_after_now(self) -> None:
        assert run("2024-01-01 10:15:00") == "2024-01-01 10:16:00 Mon"
        assert run("2024-01-01 10:15:59") == "2024-01-01 10:16:00 Mon"

    def test_fractional_seconds(self) -> None:
        assert show(next_run(at("2024-01-01 10:15:00") + 0.5, 16, None, None, None, None)) == (
            "2024-01-01 10:16:00 Mon"
        )

    def test_minute(self) -> None:
        assert run("2024-01-01 10:15:20", minute=30) == "2024-01-01 10:30:00 Mon"
        assert run("2024-01-01 10:30:00", minute=30) == "2024-01-01 11:30:00 Mon"
        assert run("2024-01-01 10:45:00", minute=30) == "2024-01-01 11:30:00 Mon"
        assert run("2024-01-01 23:45:00", minute=30) == "2024-01-02 00:30:00 Tue"
        assert run("2024-01-01 10:15:00", minute=0) == "2024-01-01 11:00:00 Mon"

    def test_hour(self) -> None:
        assert run("2024-01-01 01:59:30", hour=2) == "2024-01-01 02:00:00 Mon"
        assert run("2024-01-01 02:10:00", hour=2) == "2024-01-01 02:11:00 Mon"
        assert run("2024-01-01 02:59:00", hour=2) == "2024-01-02 02:00:00 Tue"
        assert run("2024-01-01 23:00:00", hour=2) == "2024-01-02 02:00:00 Tue"

    def test_hour_and_minute(self) -> None:
        assert run("2024-01-01 10:00:00", minute=15, hour=3) == "2024-01-02 03:15:00 Tue"
        assert run("2024-01-01 03:14:59", minute=15, hour=3) == "2024-01-01 03:15:00 Mon"
        assert run("2024-01-01 03:15:00", minute=15, hour=3) == "2024-01-02 03:15:00 Tue"
        assert run("2024-01-01 00:00:00", minute=0, hour=0) == "2024-01-02 00:00:00 Tue"

    def test_mday(self) -> None:
        assert run("2024-01-05 12:00:00", mday=10) == "2024-01-10 00:00:00 Wed"
        assert run("2024-01-10 12:00:00", mday=10) == "2024-01-10 12:01:00 Wed"
        assert run("2024-01-11 00:00:00", mday=10) == "2024-02-10 00:00:00 Sat"

    def test_mday_31_skips_short_months(self) -> None:
        assert run("2024-02-01 00:00:00", mday=31) == "2024-03-31 00:00:00 Sun"
        assert run("2024-04-01 00:00:00", mday=31) == "2024-05-31 00:00:00 Fri"
        assert run("2024-05-31 23:59:00", mday=31) == "2024-07-31 00:00:00 Wed"

    def test_mday_30_skips_february(self) -> None:
        assert run("2024-01-31 00:00:00", minute=0, hour=9, mday=30) == "2024-03-30 09:00:00 Sat"

    def test_leap_day(self) -> None:
        assert run("2025-01-01 00:00:00", mday=29, month=2) == "2028-02-29 00:00:00 Tue"
        assert run("2024-02-28 23:59:00", mday=29, month=2) == "2024-02-29 00:00:00 Thu"

    def test_month(self) -> None:
        assert run("2024-12-15 08:00:00", month=1) == "2025-01-01 00:00:00 Wed"
        assert run("2024-03-15 08:00:00", month=3) == "2024-03-15 08:01:00 Fri"
        assert run("2024-03-31 23:59:00", month=3) == "2025-03-01 00:00:00 Sat"

    def test_year_boundary(self) -> None:
        assert run("2024-12-31 23:59:00") == "2025-01-01 00:00:00 Wed"
        assert run("2024-12-31 23:59:59", minute=0, hour=0, mday=1, month=1) == (
            "2025-01-01 00:00:00 Wed"
        )

    def test_wday(self) -> None:
        assert run("2024-01-01 12:00:00", wday=3) == "2024-01-03 00:00:00 Wed"
        assert run("2024-01-03 12:00:00", wday=3) == "2024-01-03 12:01:00 Wed"
        assert run("2024-01-03 23:59:00", wday=3) == "2024-01-10 00:00:00 Wed"
        assert run("2024-01-01 12:00:00", wday=1) == "2024-01-01 12:01:00 Mon"
        assert run("2024-01-01 12:00:00", wday=6) == "2024-01-06 00:00:00 Sat"

    def test_sunday_is_0_or_7(self) -> None:
        assert run("2024-01-01 12:00:00", wday=0) == "2024-01-07 00:00:00 Sun"
        assert run("2024-01-01 12:00:00", wday=7) == "2024-01-07 00:00:00 Sun"

    def test_wday_across_a_month_boundary(self) -> None:
        assert run("2024-01-29 00:00:00", minute=0, hour=6, wday=5) == "2024-02-02 06:00:00 Fri"

    def test_wday_across_a_year_boundary(self) -> None:
        assert run("2024-12-29 00:00:00", minute=30, hour=1, wday=4) == "2025-01-02 01:30:00 Thu"

    def test_wday_and_mday_must_both_match(self) -> None:
        # Unlike cron (which ORs a restricted mday and wday), every given field must match.
        assert run("2024-01-01 00:00:00", mday=13, wday=5) == "2024-09-13 00:00:00 Fri"

    def test_every_field(self) -> None:
        assert run("2024-01-01 00:00:00", minute=45, hour=17, mday=25, month=12, wday=3) == (
            "2024-12-25 17:45:00 Wed"
        )

    def test_impossible_dates_raise(self) -> None:
        with pytest.raises(ValueError, match="no time matches"):
            next_run(at("2024-01-01 00:00:00"), None, None, 30, 2, None)
        with pytest.raises(ValueError):
            next_run(at("2024-01-01 00:00:00"), None, None, 31, 4, None)


@pytest.mark.usefixtures("eastern")
class TestLocalTime:
    def test_fields_are_local_time(self) -> None:
        # 14:00 UTC in January is 09:00 EST.
        assert run("2024-01-15 12:00:00", minute=0, hour=9) == "2024-01-15 14:00:00 Mon"
        # In July (EDT) 09:00 local is 13:00 UTC.
        assert run("2024-07-15 12:00:00", minute=0, hour=9) == "2024-07-15 13:00:00 Mon"

    def test_repeated_hour_after_fall_back_stays_in_the_future(self) -> None:
        # 2024-11-03: 02:00 EDT becomes 01:00 EST; 06:15:30 UTC is the second 01:15 local.
        now = at("2024-11-03 06:15:30")
        when = next_run(now, None, None, None, None, None)
        assert when > now
        assert show(when) == "2024-11-03 06:16:00 Sun"

    def test_every_minute_through_fall_back_moves_forward(self) -> None:
        now = at("2024-11-03 04:30:00")  # 00:30 EDT
        for _ in range(200):
            later = next_run(now, None, None, None, None, None)
            assert later == (now // 60 + 1) * 60
            now = later

    def test_every_minute_through_spring_forward_moves_forward(self) -> None:
        now = at("2024-03-10 05:30:00")  # 00:30 EST
        for _ in range(200):
            later = next_run(now, None, None, None, None, None)
            assert later == (now // 60 + 1) * 60
            now = later

    def test_fixed_time_in_the_repeated_hour_runs_once(self) -> None:
        first = next_run(at("2024-11-03 05:00:00"), 30, 1, None, None, None)  # from 01:00 EDT
        assert show(first) == "2024-11-03 05:30:00 Sun"  # 01:30 EDT
        again = next_run(first, 30, 1, None, None, None)
        assert show(again) == "2024-11-04 06:30:00 Mon"  # 01:30 EST the next day

    def test_spring_forward_gap(self) -> None:
        # 2024-03-10: 02:00 EST becomes 03:00 EDT; 02:30 local does not exist that day.
        now = at("2024-03-10 06:59:30")  # 01:59:30 EST
        assert show(next_run(now, None, None, None, None, None)) == "2024-03-10 07:00:00 Sun"
        when = next_run(now, 30, 2, None, None, None)
        assert when > now
        assert show(when) == "2024-03-10 07:30:00 Sun"  # 03:30 EDT


def test_the_fixture_restores_the_zone() -> None:
    before = (os.environ.get("TZ"), time.timezone)
    saved = os.environ.get("TZ")
    set_tz(EASTERN)
    assert time.timezone == 5 * 3600
    set_tz(saved)
    assert (os.environ.get("TZ"), time.timezone) == before


# ---------------------------------------------------------------------- parse_field


@pytest.mark.parametrize("raw", [b"", b" ", b"*", b" * "])
def test_parse_field_wildcards(raw: bytes) -> None:
    assert parse_field("minute", raw) is None


@pytest.mark.parametrize(
    ("name", "raw", "value"),
    [
        ("minute", b"0", 0),
        ("minute", b"59", 59),
        ("minute", b" 7 ", 7),
        ("hour", b"23", 23),
        ("mday", b"1", 1),
        ("mday", b"31", 31),
        ("month", b"12", 12),
        ("wday", b"0", 0),
        ("wday", b"7", 7),
        ("minute", b"007", 7),
    ],
)
def test_parse_field_values(name: str, raw: bytes, value: int) -> None:
    assert parse_field(name, raw) == value


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("minute", b"60"),
        ("hour", b"24"),
        ("mday", b"0"),
        ("mday", b"32"),
        ("month", b"0"),
        ("month", b"13"),
        ("wday", b"8"),
        ("minute", b"-1"),
        ("minute", b"1.5"),
        ("minute", b"*/5"),
        ("minute", b"1,2"),
        ("minute", b"x"),
        ("minute", b"\xff"),
        ("minute", "\u0663".encode()),  # a non-ASCII digit
    ],
)
def test_parse_field_rejects_junk(name: str, raw: bytes) -> None:
    with pytest.raises(ValueError, match=name):
        parse_field(name, raw)


def test_ranges() -> None:
    assert RANGES == {
        "minute": (0, 59),
        "hour": (0, 23),
        "mday": (1, 31),
        "month": (1, 12),
        "wday": (0, 7),
    }
