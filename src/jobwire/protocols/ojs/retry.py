"""Retry policies (ojs-retry): parse the `retry` option and compute backoff delays."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from jobwire.protocols.ojs.errors import OJSError, invalid
from jobwire.protocols.ojs.times import parse_duration

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
        if self.strategy in ("constant", "none"):
            raw = base
        elif self.strategy == "linear":
            raw = base * n
        elif self.strategy == "polynomial":
            raw = base * n**self.backoff_coefficient
        else:
            raw = base * self.backoff_coefficient ** (n - 1)
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


def _bad(message: str) -> OJSError:
    # The retry tests expect 422 for a well-formed but unacceptable policy.
    return invalid(message, status=422)


def _interval(raw: dict[str, Any], name: str, default: float) -> float:
    if name in raw:
        value = raw[name]
        try:
            seconds = parse_duration(value)
        except ValueError:
            raise _bad(f"retry.{name} must be an ISO-8601 duration") from None
        return seconds
    ms_name = name + "_ms"
    if ms_name in raw:
        ms = raw[ms_name]
        if not isinstance(ms, int | float) or isinstance(ms, bool) or ms < 0:
            raise _bad(f"retry.{ms_name} must be a non-negative number")
        return float(ms) / 1000
    return default


def parse_retry(raw: Any) -> RetryPolicy:
    """The `retry` option -> RetryPolicy; raises OJSError(invalid_request) on bad values."""
    if raw is None:
        return RetryPolicy()
    if not isinstance(raw, dict):
        raise _bad("retry must be an object")
    max_attempts = raw.get("max_attempts", 3)
    if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 0:
        raise _bad("retry.max_attempts must be a non-negative integer")
    coefficient = raw.get("backoff_coefficient", 2.0)
    if not isinstance(coefficient, int | float) or isinstance(coefficient, bool) or coefficient < 1:
        raise _bad("retry.backoff_coefficient must be a number >= 1")
    jitter = raw.get("jitter", True)
    if not isinstance(jitter, bool):
        raise _bad("retry.jitter must be a boolean")
    strategy = raw.get("backoff_strategy", raw.get("backoff_type", "exponential"))
    if strategy not in STRATEGIES:
        raise _bad(f"retry.backoff_strategy must be one of {', '.join(STRATEGIES)}")
    non_retryable = raw.get("non_retryable_errors", [])
    if not isinstance(non_retryable, list) or not all(isinstance(x, str) for x in non_retryable):
        raise _bad("retry.non_retryable_errors must be an array of strings")
    on_exhaustion = raw.get("on_exhaustion", "discard")
    if on_exhaustion not in EXHAUSTION:
        raise _bad("retry.on_exhaustion must be discard or dead_letter")
    initial = _interval(raw, "initial_interval", 1.0)
    maximum = _interval(raw, "max_interval", 300.0)
    return RetryPolicy(
        max_attempts=max_attempts,
        initial_interval=initial,
        backoff_coefficient=float(coefficient),
        max_interval=max(maximum, 0.0),
        jitter=jitter,
        strategy=str(strategy),
        non_retryable_errors=tuple(non_retryable),
        on_exhaustion=on_exhaustion,
    )
