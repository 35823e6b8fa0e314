"""One timer heap for every deadline: leases, scheduled jobs, retries, worker liveness.

Entries are never removed; each carries the value it was set for and is ignored when it
fires if its owner has moved on (the owner's deadline no longer equals the entry's).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

TimerCallback = Callable[[Any, float], None]


class TimerHeap:
    __slots__ = ("_heap", "_seq", "on_earlier")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, TimerCallback, Any]] = []
        self._seq = itertools.count()
        # Told when a new entry becomes the earliest, so the event loop can re-arm its timer.
        self.on_earlier: Callable[[float], None] | None = None

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, when: float, callback: TimerCallback, owner: Any) -> None:
        earliest = not self._heap or when < self._heap[0][0]
        heapq.heappush(self._heap, (when, next(self._seq), callback, owner))
        if earliest and self.on_earlier is not None:
            self.on_earlier(when)

    def next_deadline(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def run_due(self, now: float) -> float | None:
        """Fire every entry due at `now`; return the next deadline."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            when, _, callback, owner = heapq.heappop(heap)
            callback(owner, when)
        return heap[0][0] if heap else None
