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

from jobwire.protocols.ojs.messages import Unique, convert

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


def unique_policy(raw: Unique) -> UniquePolicy:
    """A validated `unique` option -> UniquePolicy."""
    return UniquePolicy(
        keys=tuple(raw.keys) if raw.keys else DEFAULT_KEYS,
        args_keys=tuple(raw.args_keys) if raw.args_keys is not None else None,
        meta_keys=tuple(raw.meta_keys or ()),
        period=float(raw.period) if raw.period is not None else None,
        states=frozenset(raw.states) if raw.states is not None else frozenset(DEFAULT_STATES),
        on_conflict=raw.on_conflict,
    )


def parse_unique(raw: Any) -> UniquePolicy | None:
    """The `unique` option -> UniquePolicy (None when absent); raises OJSError."""
    if raw is None:
        return None
    return unique_policy(convert(raw, Unique, "$.options.unique"))
