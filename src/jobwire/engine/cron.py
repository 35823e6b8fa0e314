"""Cron: named schedules that create a job each time their expression fires.

`CronScheduler` keeps the registrations, arms one entry per registration on the engine's timer
heap, and on each firing applies the overlap policy and asks its `trigger` (supplied by the
protocol that registered it; OJS turns the stored job template into a job) to create the job.
The template is opaque here. Registrations are written to the store's key-value API when it
has one, so they survive a restart; after a restart each schedule continues from its next
time after now.

Missed runs (the server was down when an entry should have fired) follow the catch-up policy:
`skip` (default) does not run them; `once` runs the entry once at start-up, as of the first
time it missed, however many it missed, then goes on with its schedule.

Overlap policies (when the previous run's job has not finished):
`skip` (default) does not create a job; `allow` and `enqueue` create one anyway;
`cancel_previous` cancels the previous job first. `skip` counts a job that is still queued as
unfinished too, so a slow queue cannot pile up runs either.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobwire.engine.cronexpr import CronError, CronExpression, parse, zone
from jobwire.engine.errors import IllegalTransition
from jobwire.engine.job import Job
from jobwire.ports import KeyValueStore

if TYPE_CHECKING:
    from jobwire.engine.engine import Engine
    from jobwire.engine.events import EventLog

log = logging.getLogger("jobwire.cron")

NAMESPACE = "cron"
OVERLAP_POLICIES = ("skip", "allow", "cancel_previous", "enqueue")
CATCH_UP_POLICIES = ("skip", "once")

#: Creates the job for one firing: (entry, scheduled time) -> the job.
Trigger = Callable[["CronEntry", float], Job]
#: Several nodes share the registrations (`jobwire.store.pgshared`): asked at each tick,
#: (entry, scheduled time) -> (whether this node fires it, whether the entry's previous job
#: still lives on some node).
ClaimTick = Callable[["CronEntry", float], Awaitable[tuple[bool, bool]]]


@dataclass(slots=True)
class CronEntry:
    name: str
    expression: CronExpression
    timezone: str
    template: dict[str, Any]  # the protocol's description of the job to create
    overlap_policy: str = "skip"
    enabled: bool = True
    description: str | None = None
    created_at: float = 0.0
    last_run_at: float | None = None
    next_run_at: float | None = None
    run_count: int = 0
    last_job_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # protocol fields kept as sent

    def record(self) -> bytes:
        return json.dumps(
            {
                "name": self.name,
                "expression": self.expression.text,
                "timezone": self.timezone,
                "template": self.template,
                "overlap_policy": self.overlap_policy,
                "enabled": self.enabled,
                "description": self.description,
                "created_at": self.created_at,
                "last_run_at": self.last_run_at,
                "run_count": self.run_count,
                "last_job_id": self.last_job_id,
                "extra": self.extra,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_record(cls, raw: bytes) -> CronEntry:
        data = json.loads(raw)
        return cls(
            name=data["name"],
            expression=parse(data["expression"]),
            timezone=data["timezone"],
            template=data["template"],
            overlap_policy=data["overlap_policy"],
            enabled=data["enabled"],
            description=data.get("description"),
            created_at=data["created_at"],
            last_run_at=data.get("last_run_at"),
            run_count=data.get("run_count", 0),
            last_job_id=data.get("last_job_id"),
            extra=data.get("extra") or {},
        )


def new_entry(
    name: str,
    expression: str,
    template: dict[str, Any],
    *,
    timezone: str | None = None,
    overlap_policy: str | None = None,
    enabled: bool = True,
    description: str | None = None,
) -> CronEntry:
    """Validate and build a registration; raises CronError saying what is wrong."""
    if not name or len(name) > 255:
        raise CronError("a cron name is 1 to 255 characters")
    policy = overlap_policy or "skip"
    if policy not in OVERLAP_POLICIES:
        raise CronError(f"overlap_policy must be one of {', '.join(OVERLAP_POLICIES)}")
    tz_name = timezone or "UTC"
    zone(tz_name)
    return CronEntry(
        name=name,
        expression=parse(expression),
        timezone=tz_name,
        template=template,
        overlap_policy=policy,
        enabled=enabled,
        description=description,
    )


class CronScheduler:
    def __init__(
        self,
        engine: Engine,
        trigger: Trigger,
        *,
        kv: KeyValueStore | None = None,
        events: EventLog | None = None,
        catch_up: str = "skip",
    ) -> None:
        if catch_up not in CATCH_UP_POLICIES:
            raise ValueError(f"catch_up must be one of {', '.join(CATCH_UP_POLICIES)}")
        self.engine = engine
        self.trigger = trigger
        self.kv = kv
        self.events = events
        self.catch_up = catch_up
        self._entries: dict[str, CronEntry] = {}
        #: Set by a cluster: each tick fires on the one node that claims it.
        self.claim_tick: ClaimTick | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def load(self) -> int:
        """Re-register what the store kept (start-up); returns how many."""
        if self.kv is None:
            return 0
        for key, raw in self.kv.kv_load(NAMESPACE).items():
            try:
                entry = CronEntry.from_record(raw)
            except (CronError, KeyError, TypeError, ValueError) as exc:
                log.error("cron registration %r cannot be restored: %s", key, exc)
                continue
            try:
                self.check(entry)
            except CronError as exc:  # kept by an older version that checked less
                log.error("cron registration %r cannot be restored: %s", key, exc)
                continue
            self._entries[entry.name] = entry
            if self.catch_up == "once" and self.missed(entry) is not None:
                self.engine.timers.add(self.engine.clock(), self._catch_up, entry)
            self._arm(entry)
        return len(self._entries)

    def check(self, entry: CronEntry) -> float:
        """The first time `entry` fires from now; CronError if it never does (before the
        year 10000). `register` calls it before it changes anything."""
        return entry.expression.first_run(self.engine.clock(), zone(entry.timezone))

    def missed(self, entry: CronEntry) -> float | None:
        """The first time `entry` should have fired since its last run (or registration)
        that is already past, or None."""
        if not entry.enabled:
            return None
        anchor = entry.last_run_at if entry.last_run_at is not None else entry.created_at
        if not anchor:
            return None
        first = entry.expression.next_after(anchor, zone(entry.timezone), anchor)
        return first if first <= self.engine.clock() else None

    def _catch_up(self, entry: CronEntry, _now: float) -> None:
        """`once`: the run the server missed while it was down, at start-up."""
        if self._entries.get(entry.name) is not entry:
            return
        missed = self.missed(entry)
        if missed is None:
            return
        try:
            self._run(entry, missed)
        except Exception:
            log.exception("cron %r could not create its catch-up job", entry.name)
        self._save(entry)

    def register(self, entry: CronEntry) -> tuple[CronEntry, bool]:
        """Add or replace (upsert) the registration named `entry.name`; True if new.
        Raises CronError (and changes nothing) for a schedule that never fires."""
        self.check(entry)
        old = self._entries.get(entry.name)
        now = self.engine.clock()
        if old is None:
            entry.created_at = now
        else:
            entry.created_at = old.created_at
            entry.run_count = old.run_count
            entry.last_run_at = old.last_run_at
            entry.last_job_id = old.last_job_id
        self._entries[entry.name] = entry
        self._arm(entry)
        self._save(entry)
        return entry, old is None

    def get(self, name: str) -> CronEntry | None:
        return self._entries.get(name)

    def entries(self) -> list[CronEntry]:
        return sorted(self._entries.values(), key=lambda entry: entry.name)

    def remove(self, name: str) -> CronEntry | None:
        entry = self._entries.pop(name, None)
        if entry is not None:
            entry.next_run_at = None  # its armed timer entry goes stale
            if self.kv is not None:
                self.kv.kv_put(NAMESPACE, name, None)
        return entry

    def set_enabled(self, name: str, enabled: bool) -> CronEntry | None:
        entry = self._entries.get(name)
        if entry is not None:
            entry.enabled = enabled
            self._arm(entry)
            self._save(entry)
        return entry

    def clear(self) -> None:
        """Remove every registration (an admin reset)."""
        for name in list(self._entries):
            self.remove(name)

    # ------------------------------------------------------------------ firing

    def _arm(self, entry: CronEntry) -> None:
        if not entry.enabled:
            entry.next_run_at = None
            return
        now = self.engine.clock()
        anchor = entry.last_run_at if entry.last_run_at is not None else entry.created_at
        when = entry.expression.next_after(now, zone(entry.timezone), anchor or None)
        entry.next_run_at = when
        self.engine.timers.add(when, self._fire, entry)

    def _fire(self, entry: CronEntry, when: float) -> None:
        if self._entries.get(entry.name) is not entry or entry.next_run_at != when:
            return  # removed, replaced, disabled or re-armed since
        claim = self.claim_tick
        if claim is not None:
            self._arm(entry)
            asyncio.get_running_loop().create_task(self._fire_claimed(entry, when, claim))
            return
        try:
            self._run(entry, when)
        except Exception:  # a bad template must not stop the schedule
            log.exception("cron %r could not create its job", entry.name)
        self._arm(entry)
        self._save(entry)

    async def _fire_claimed(self, entry: CronEntry, when: float, claim: ClaimTick) -> None:
        """A tick on a node of a cluster: fired here only if this node claims it first."""
        try:
            mine, previous_live = await claim(entry, when)
        except Exception as exc:
            log.warning("cron %r: this node could not claim its tick: %s", entry.name, exc)
            return
        # The entry may have been read again meanwhile (another node's run changed its
        # record): the tick is this node's to fire all the same.
        current = self._entries.get(entry.name)
        if not mine or current is None:
            return
        try:
            self._run(current, when, previous_live)
        except Exception:
            log.exception("cron %r could not create its job", current.name)
        self._save(current)

    def sync(self, records: dict[str, bytes], keep: set[str] | None = None) -> None:
        """The registrations as another node left them (a cluster): entries added, changed
        (their last run too) or removed there are so here, without writing anything back.
        Those named in `keep` (written here, maybe not yet committed) stay as they are."""
        keep = keep or set()
        for name in list(self._entries):
            if name not in records and name not in keep:
                self._entries.pop(name).next_run_at = None  # its armed timer goes stale
        for name, raw in records.items():
            old = self._entries.get(name)
            if name in keep or (old is not None and old.record() == raw):
                continue
            try:
                entry = CronEntry.from_record(raw)
                self.check(entry)
            except (CronError, KeyError, TypeError, ValueError) as exc:
                log.error("cron registration %r cannot be read: %s", name, exc)
                continue
            if old is not None:
                old.next_run_at = None
            self._entries[name] = entry
            self._arm(entry)

    def _run(self, entry: CronEntry, when: float, previous_live: bool = False) -> None:
        previous = self.engine.jobs.get(entry.last_job_id) if entry.last_job_id else None
        unfinished = previous_live or (previous is not None and not previous.state.terminal)
        if unfinished and entry.last_job_id:
            if entry.overlap_policy == "skip":
                self._note("cron.skipped", entry, when, existing_job_id=entry.last_job_id)
                return
            if entry.overlap_policy == "cancel_previous" and previous is not None:
                with contextlib.suppress(IllegalTransition):
                    self.engine.cancel(previous)
        job = self.trigger(entry, when)
        entry.last_job_id = job.id
        entry.last_run_at = when
        entry.run_count += 1
        self._note("cron.triggered", entry, when, job_id=job.id, job_type=job.function)

    def _note(self, event: str, entry: CronEntry, when: float, **data: Any) -> None:
        if self.events is not None:
            data.update(cron_name=entry.name, cron_expr=entry.expression.text, scheduled_at=when)
            queue = entry.template.get("queue") if isinstance(entry.template, dict) else None
            self.events.record(event, entry.name, queue if isinstance(queue, str) else None, data)

    def _save(self, entry: CronEntry) -> None:
        if self.kv is not None and self._entries.get(entry.name) is entry:
            self.kv.kv_put(NAMESPACE, entry.name, entry.record())
