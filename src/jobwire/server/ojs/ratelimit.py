"""Per-queue delivery rate limits: at most N jobs handed out per queue in any one second.

A sliding one-second window of delivery times per limited queue; fetches ask how many jobs
they may take (`allowance`) and report what they took (`taken`). Unlimited queues cost one
dict look-up.
"""

from __future__ import annotations

from collections import deque

WINDOW = 1.0


class QueueRateLimits:
    def __init__(self) -> None:
        self._limits: dict[str, int] = {}
        self._recent: dict[str, deque[float]] = {}

    def set(self, queue: str, per_second: int | None) -> None:
        """Limit `queue` to `per_second` deliveries per second; None lifts the limit."""
        if per_second is None:
            self._limits.pop(queue, None)
            self._recent.pop(queue, None)
        else:
            self._limits[queue] = per_second
            self._recent.setdefault(queue, deque())

    def limit(self, queue: str) -> int | None:
        return self._limits.get(queue)

    def allowance(self, queue: str, now: float) -> int | None:
        """Jobs `queue` may still hand out now; None when it is not limited."""
        limit = self._limits.get(queue)
        if limit is None:
            return None
        recent = self._recent[queue]
        while recent and recent[0] <= now - WINDOW:
            recent.popleft()
        return max(0, limit - len(recent))

    def taken(self, queue: str, count: int, now: float) -> None:
        recent = self._recent.get(queue)
        if recent is not None:
            recent.extend([now] * count)

    def clear(self) -> None:
        self._limits.clear()
        self._recent.clear()
