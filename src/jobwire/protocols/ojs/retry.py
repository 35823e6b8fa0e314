"""Retry policies (ojs-retry): parse the `retry` option and compute backoff delays."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from jobwire.protocols.ojs.messages import Retry, convert

STRATEGIES = ("exponential", "linear", "constant", "none", "polynomial")
EXHAUSTION = ("discard", "dead_letter")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 3
    initial_interval: float = 1.0
    backoff_coefficient: float = 2.0
    max_interval: float = 300.0
    jitter: bool = True
    strategy: str = "exponential"
    non_retryable_errors: tuple[str, ...] = ()
    on_exhaustion: str = "discard"

    def delay(self, attempt: int, rand: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        n = max(1, attempt)
        base = self.initial_interval
        try:
            if self.strategy in ("constant", "none"):
                raw = base
            elif self.strategy == "linear":
                raw = base * n
            elif self.strategy == "polynomial":
                raw = base * float(n) ** self.backoff_coefficient
            else:
                raw = base * self.backoff_coefficient ** float(n - 1)
        except OverflowError:  # a huge attempt count and coefficient: capped below
            raw = self.max_interval
        raw = min(raw, self.max_interval)
        if self.jitter:
            # Up to ±50% around the computed delay, never past max_interval.
            raw = min(raw * (0.5 + (rand or random).random()), self.max_interval)
        return max(0.0, raw)

    def is_non_retryable(self, code: str | None) -> bool:
        """An error code matching an entry (exact, or `Prefix.*` / regex) is never retried."""
        if not code:
            return False
        for pattern in self.non_retryable_errors:
            if pattern == code:
                return True
            if pattern.endswith("*"):
                if code.startswith(pattern.rstrip("*").rstrip(".")):
                    return True
                continue
            try:
                if re.fullmatch(pattern, code):
                    return True
            except re.error:
                continue
        return False

    def to_json(self) -> dict[str, Any]:
        return {
            "max_attempts": self.max_attempts,
            "initial_interval_ms": int(self.initial_interval * 1000),
            "backoff_coefficient": self.backoff_coefficient,
            "max_interval_ms": int(self.max_interval * 1000),
            "jitter": self.jitter,
            "backoff_strategy": self.strategy,
            "non_retryable_errors": list(self.non_retryable_errors),
            "on_exhaustion": self.on_exhaustion,
        }


def policy_of(raw: Retry) -> RetryPolicy:
    """A validated `retry` option -> RetryPolicy."""
    if raw.initial_interval is not None:
        initial = float(raw.initial_interval)
    elif raw.initial_interval_ms is not None:
        initial = raw.initial_interval_ms / 1000
    else:
        initial = 1.0
    if raw.max_interval is not None:
        maximum = float(raw.max_interval)
    elif raw.max_interval_ms is not None:
        maximum = raw.max_interval_ms / 1000
    else:
        maximum = 300.0
    return RetryPolicy(
        max_attempts=raw.max_attempts,
        initial_interval=initial,
        backoff_coefficient=float(raw.backoff_coefficient),
        max_interval=maximum,
        jitter=raw.jitter,
        strategy=raw.backoff_strategy or raw.backoff_type or "exponential",
        non_retryable_errors=tuple(raw.non_retryable_errors),
        on_exhaustion=raw.on_exhaustion,
    )


def parse_retry(raw: Any) -> RetryPolicy:
    """The `retry` option -> RetryPolicy; raises OJSError (422) naming the bad field."""
    if raw is None:
        return RetryPolicy()
    return policy_of(convert(raw, Retry, "$.options.retry"))
