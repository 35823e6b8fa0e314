"""How deeply a JSON document may nest: one bound for every protocol that reads JSON.

orjson reads documents nested up to 1,024 levels but writes only up to 254, and the store
keeps a job's attributes with orjson or, where orjson refuses them, the standard library's
encoder, which the interpreter's recursion limit bounds. A document that can be read but
not written back would be accepted and fail later: in the reply (after the job was created)
or in the store's next frame. So requests are held to `MAX_DEPTH` levels as they are read,
well inside both.
"""

from __future__ import annotations

from typing import Any, Final

#: Levels of arrays and objects a request may nest; the outermost counts as one.
MAX_DEPTH: Final = 128


def too_deep(raw: bytes | str, value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether `value`, parsed from `raw`, nests more than `limit` levels."""
    # A document cannot nest deeper than it has opening brackets (those in strings count
    # too): the usual request is answered by two counts in C, without a walk.
    opening = (
        raw.count(b"[") + raw.count(b"{")
        if isinstance(raw, bytes)
        else (raw.count("[") + raw.count("{"))
    )
    if opening <= limit:
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False
