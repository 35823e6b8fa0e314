"""Cron expressions (parsing, next run in IANA zones across DST) and the scheduler on a fake
clock: firing, overlap policies, upsert, persistence through a key-value store."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from jobwire.engine import Job, JobState
from jobwire.engine.cron import CronEntry, CronScheduler, new_entry
from jobwire.engine.cronexpr import CronError, parse, zone
from tests.engine.fakes import Harness

UTC_ZONE = ZoneInfo("UTC")


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def iso(value: float) -> str:
    return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%dT%H:%M:%S")


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        ("* * * * *", "2026-03-01T10:00:30", "2026-03-01T10:01:00"),
        ("*/5 * * * *", "2026-03-01T10:01:00", "2026-03-01T10:05:00"),
        ("30 2 * * *", "2026-03-01T10:00:00", "2026-03-02T02:30:00"),
        ("0 0 1 1 *", "2026-03-01T10:00:00", "2027-01-01T00:00:00"),
        ("@daily", "2026-03-01T10:00:00", "2026-03-02T00:00:00"),
        ("@hourly", "2026-03-01T10:00:00", "2026-03-01T11:00:00"),
        ("@weekly", "2026-03-02T10:00:00", "2026-03-08T00:00:00"),  # a Monday -> Sunday
        ("0 9 * * MON-FRI", "2026-03-06T10:00:00", "2026-03-09T09:00:00"),  # Fri -> Mon
        ("0 0 * JAN,JUL *", "2026-03-01T00:00:00", "2026-07-01T00:00:00"),
        ("15,45 8-9 * * *", "2026-03-01T08:20:00", "2026-03-01T08:45:00"),
        ("0 0 13 * 5", "2026-03-01T00:00:00", "2026-03-06T00:00:00"),  # 13th OR a Friday
        ("*/20 * * * * *", "2026-03-01T10:00:05", "2026-03-01T10:00:20"),  # seconds field
    ],
)
def test_next_run(expression: str, after: str, expected: str) -> None:
    assert iso(parse(expression).next_after(ts(after), UTC_ZONE)) == expected


def test_next_run_in_a_timezone() -> None:
    tokyo = zone("Asia/Tokyo")  # 09:00 JST is 00:00 UTC
    assert iso(parse("0 9 * * *").next_after(ts("2026-03-01T01:00:00"), tokyo)) == (
        "2026-03-02T00:00:00"
    )


def test_dst_gap_is_skipped_and_repeated_hour_fires_once() -> None:
    new_york = zone("America/New_York")
    # 2026-03-08 02:30 does not exist in New York: the next 02:30 is the day after (EDT).
    spring = parse("30 2 * * *").next_after(ts("2026-03-08T05:00:00"), new_york)
    assert iso(spring) == "2026-03-09T06:30:00"
    # 2026-11-01 01:30 happens twice; the first one fires, then the next day's.
    first = parse("30 1 * * *").next_after(ts("2026-11-01T04:00:00"), new_york)
    assert iso(first) == "2026-11-01T05:30:00"
    assert iso(parse("30 1 * * *").next_after(first, new_york)) == "2026-11-02T06:30:00"


def test_every_counts_from_its_anchor() -> None:
    every = parse("@every 1h30m")
    assert every.next_after(1000.0, UTC_ZONE, anchor=1000.0) == 1000.0 + 5400
    assert every.next_after(1000.0 + 6000, UTC_ZONE, anchor=1000.0) == 1000.0 + 10800


@pytest.mark.parametrize(
    "expression",
    [
        "",
        "not a valid cron",
        "0 0 0 0 0 0 0",
        "99 25 32 13 8",
        "*/0 * * * *",
        "5-1 * * * *",
        "@fortnightly",
        "@every 0s",
        "0 0 L * *",
    ],
)
def test_invalid_expressions_are_refused(expression: str) -> None:
    with pytest.raises(CronError):
        parse(expression)


@pytest.mark.parametrize("name", ["+05:00", "UTC+5", "Mars/Olympus", "../etc/passwd"])
def test_invalid_timezones_are_refused(name: str) -> None:
    with pytest.raises(CronError):
        zone(name)


class MemoryKV:
    def __init__(self) -> None:
        self.records: dict[tuple[str, str], bytes] = {}

    def kv_load(self, namespace: str) -> dict[str, bytes]:
        return {k: v for (ns, k), v in self.records.items() if ns == namespace}

    def kv_put(self, namespace: str, key: str, value: bytes | None) -> None:
        if value is None:
            self.records.pop((namespace, key), None)
        else:
            self.records[(namespace, key)] = value


def scheduler(
    h: Harness, kv: MemoryKV | None = None, catch_up: str = "skip"
) -> tuple[CronScheduler, list[Job]]:
    made: list[Job] = []

    def trigger(entry: CronEntry, when: float) -> Job:
        job, _ = h.engine.submit(entry.template["type"], b"", queue="cron")
        job.ext = {"scheduled_for": when}
        made.append(job)
        return job

    return CronScheduler(h.engine, trigger, kv=kv, catch_up=catch_up), made


def test_fires_every_minute_and_skips_while_the_last_run_is_unfinished(h: Harness) -> None:
    cron, made = scheduler(h)
    cron.register(new_entry("tick", "* * * * *", {"type": "tick"}))
    entry = cron.get("tick")
    assert entry is not None and entry.next_run_at is not None
    h.advance(entry.next_run_at - h.clock.now)
    assert len(made) == 1 and entry.run_count == 1
    h.advance(60)  # the first job is still queued: skipped
    assert len(made) == 1
    h.engine.cancel(made[0])
    h.advance(60)
    assert len(made) == 2


def test_allow_and_cancel_previous(h: Harness) -> None:
    cron, made = scheduler(h)
    cron.register(new_entry("a", "* * * * *", {"type": "a"}, overlap_policy="allow"))
    cron.register(new_entry("c", "* * * * *", {"type": "c"}, overlap_policy="cancel_previous"))
    h.advance(60)
    h.advance(60)
    kinds = [job.function for job in made]
    assert kinds.count("a") == 2 and kinds.count("c") == 2
    first_c = next(job for job in made if job.function == "c")
    assert first_c.state is JobState.CANCELLED


def test_remove_and_disable_stop_firing(h: Harness) -> None:
    cron, made = scheduler(h)
    cron.register(new_entry("gone", "* * * * *", {"type": "gone"}))
    cron.register(new_entry("off", "* * * * *", {"type": "off"}))
    cron.remove("gone")
    entry = cron.set_enabled("off", False)
    assert entry is not None and entry.next_run_at is None
    h.advance(600)
    assert made == []


def test_registrations_survive_through_the_key_value_store(h: Harness) -> None:
    kv = MemoryKV()
    cron, _ = scheduler(h, kv)
    cron.register(new_entry("nightly", "0 3 * * *", {"type": "n"}, timezone="Europe/Paris"))
    again, made = scheduler(h, kv)
    assert again.load() == 1
    entry = again.get("nightly")
    assert entry is not None and entry.timezone == "Europe/Paris"
    h.advance(86400)
    assert len(made) == 1
    again.remove("nightly")
    assert kv.records == {}


def down_for_three_runs(h: Harness, catch_up: str) -> tuple[Harness, list[Job], float]:
    """An hourly entry that ran once; the server is down for three of its runs, then starts
    again (a new engine) on the same store. Returns the new engine, the jobs made after the
    restart, and the first missed time."""
    kv = MemoryKV()
    cron, made = scheduler(h, kv)
    cron.register(new_entry("hourly", "0 * * * *", {"type": "h"}))
    entry = cron.get("hourly")
    assert entry is not None and entry.next_run_at is not None
    h.advance(entry.next_run_at - h.clock.now)
    assert len(made) == 1
    first_missed = entry.next_run_at
    restarted = Harness()
    restarted.clock.now = h.clock.now + 3 * 3600 + 60  # down: three runs missed
    again, made_again = scheduler(restarted, kv, catch_up)
    assert again.load() == 1
    restarted.advance(0)  # start-up: what is due now runs
    return restarted, made_again, first_missed


def test_missed_runs_are_skipped_by_default(h: Harness) -> None:
    restarted, made, _ = down_for_three_runs(h, "skip")
    assert made == []
    restarted.advance(3600)
    assert len(made) == 1  # the schedule goes on


def test_catch_up_once_runs_one_missed_run_at_start(h: Harness) -> None:
    restarted, made, first_missed = down_for_three_runs(h, "once")
    assert len(made) == 1  # one run for the three missed
    assert made[0].ext == {"scheduled_for": first_missed}
    restarted.advance(1)
    assert len(made) == 1
    restarted.engine.cancel(made[0])
    restarted.advance(3600)
    assert len(made) == 2  # then the schedule goes on


def test_catch_up_policy_is_checked() -> None:
    with pytest.raises(ValueError):
        CronScheduler(Harness().engine, lambda entry, when: None, catch_up="all")  # type: ignore[arg-type,return-value]
