"""Unique jobs (ojs-unique-jobs): parse the `unique` option and fingerprint a job.

The fingerprint is SHA-256 of the canonical JSON of the selected parts (type, queue, args
or some of its top-level keys, chosen meta keys), so equal jobs get equal keys whatever the
order of their object keys.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from jobwire.protocols.ojs.errors import invalid
from jobwire.protocols.ojs.times import parse_duration

KEY_PARTS = ("type", "queue", "args", "meta")
DEFAULT_KEYS = ("type", "queue", "args")
STATES = (
    "scheduled",
    "available",
    "pending",
    "active",
    "retryable",
    "completed",
    "cancelled",
    "discarded",
)
DEFAULT_STATES = ("available", "active", "scheduled", "retryable", "pending")
ON_CONFLICT = ("reject", "ignore", "replace")


@dataclass(frozen=True, slots=True)
class UniquePolicy:
    keys: tuple[str, ...] = DEFAULT_KEYS
    args_keys: tuple[str, ...] | None = None
    meta_keys: tuple[str, ...] = ()
    period: float | None = None  # seconds the lock lasts after enqueue; None: while live
    states: frozenset[str] = frozenset(DEFAULT_STATES)
    on_conflict: str = "reject"

    def fingerprint(
        self, job_type: str, queue: str, args: list[Any], meta: dict[str, Any] | None
    ) -> str:
        parts: dict[str, Any] = {}
        if "type" in self.keys:
            parts["type"] = job_type
        if "queue" in self.keys:
            parts["queue"] = queue
        if "args" in self.keys:
            parts["args"] = args if self.args_keys is None else _select_args(args, self.args_keys)
        if "meta" in self.keys:
            meta = meta or {}
            parts["meta"] = {k: meta.get(k) for k in self.meta_keys}
        canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()


def _select_args(args: list[Any], names: tuple[str, ...]) -> dict[str, Any]:
    """Top-level keys of the first object in args (OJS args are an array)."""
    for arg in args:
        if isinstance(arg, dict):
            return {k: arg.get(k) for k in names}
    return {}


def _strings(
    raw: dict[str, Any], name: str, allowed: tuple[str, ...] | None = None
) -> tuple[str, ...] | None:
    value = raw.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise invalid(f"unique.{name} must be an array of strings")
    if allowed is not None:
        for v in value:
            if v not in allowed:
                raise invalid(f"unique.{name} entries must be among {', '.join(allowed)}")
    return tuple(value)


def parse_unique(raw: Any) -> UniquePolicy | None:
    """The `unique` option -> UniquePolicy (None when absent); raises OJSError."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise invalid("options.unique must be an object")
    keys = _strings(raw, "keys", KEY_PARTS) or DEFAULT_KEYS
    meta_keys = _strings(raw, "meta_keys") or ()
    if "meta" in keys and not meta_keys:
        raise invalid("unique.meta_keys is required when unique.keys contains meta")
    states = _strings(raw, "states", STATES)
    on_conflict = raw.get("on_conflict", "reject")
    if on_conflict not in ON_CONFLICT:
        raise invalid(f"unique.on_conflict must be one of {', '.join(ON_CONFLICT)}")
    period = None
    if raw.get("period") is not None:
        try:
            period = parse_duration(raw["period"])
        except ValueError:
            raise invalid("unique.period must be an ISO-8601 duration such as PT1H") from None
    return UniquePolicy(
        keys=keys,
        args_keys=_strings(raw, "args_keys"),
        meta_keys=meta_keys,
        period=period,
        states=frozenset(states) if states is not None else frozenset(DEFAULT_STATES),
        on_conflict=str(on_conflict),
    )
