"""jobwire's framing of the Worker-Manager Protocol (WMP, ZeroMQ RFC 14), sans-IO.

RFC 14 defines commands and flow but no wire format; this is ours, version 1 (docs/wmp.md).
A message is a routing envelope, an empty delimiter, then the body:

    [hop ..., b"", b"WMP01", COMMAND, HEADER, payload ...]

- the envelope: the ROUTER identities the message picked up on its way up (worker to
  manager), as in a REQ/ROUTER envelope; a worker's DEALER sends none (just the delimiter),
  each ROUTER it passes through (devices, the manager) adds one, and replies retrace it;
- `WMP01`: the signature and version;
- COMMAND: the command's ASCII name (`READY`, `WAKE`, ...);
- HEADER: UTF-8 `key=value` lines joined by `\\n` (may be empty); keys are lower-case
  `[a-z0-9-]+` and appear once; values hold no line break; unknown keys are ignored;
- payload: any number of frames (a job's body, a result).

Errors: a message whose body does not start with the signature is not WMP (`answerable`
False: dropped); a WMP message with an unknown command or a bad header is answered ERROR.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Final

SIGNATURE: Final = b"WMP01"
#: The most routing hops an envelope may carry (chained devices).
MAX_HOPS: Final = 32
#: The most roles a worker may announce (each subset becomes an engine function).
MAX_ROLES: Final = 4

# Commands: worker -> manager
READY: Final = b"READY"
GIVE: Final = b"GIVE"
DONE: Final = b"DONE"
STATUS: Final = b"STATUS"
# manager -> worker
WAKE: Final = b"WAKE"
TAKE: Final = b"TAKE"
NO: Final = b"NO"
CANCEL: Final = b"CANCEL"
ERROR: Final = b"ERROR"
# both ways
HEARTBEAT: Final = b"HEARTBEAT"
DISCONNECT: Final = b"DISCONNECT"

WORKER_COMMANDS: Final = frozenset({READY, GIVE, DONE, STATUS, HEARTBEAT, DISCONNECT})
MANAGER_COMMANDS: Final = frozenset({WAKE, TAKE, NO, CANCEL, ERROR, HEARTBEAT, DISCONNECT})
COMMANDS: Final = WORKER_COMMANDS | MANAGER_COMMANDS
#: What a device forwards to all its managers; every other upward command goes by `via`.
BROADCAST: Final = frozenset({READY, HEARTBEAT, DISCONNECT})

_KEY = re.compile(r"[a-z0-9-]+\Z")


class WmpError(ValueError):
    """An invalid message. `answerable`: it was WMP (signature right), so the sender is
    told with ERROR; otherwise it is dropped."""

    def __init__(self, reason: str, *, answerable: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.answerable = answerable


@dataclass(frozen=True, slots=True)
class Message:
    command: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    payload: tuple[bytes, ...] = ()

    def get(self, key: str, default: str = "") -> str:
        return self.headers.get(key, default)

    def number(self, key: str, default: float | None = None) -> float | None:
        """A header as a finite non-negative number; `default` if absent; WmpError if bad."""
        raw = self.headers.get(key)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise WmpError(f"header {key} is not a number") from None
        if not 0 <= value < float("inf"):
            raise WmpError(f"header {key} is out of range")
        return value

    def items(self, key: str) -> list[str]:
        """A comma-separated header as its non-empty items."""
        return [item.strip() for item in self.get(key).split(",") if item.strip()]


# ---------------------------------------------------------------- headers


def encode_headers(headers: Mapping[str, object] | None) -> bytes:
    if not headers:
        return b""
    lines = []
    for key, value in headers.items():
        if value is None:
            continue
        text = str(value)
        if not _KEY.match(key):
            raise ValueError(f"bad header key {key!r}")
        if "\n" in text or "\r" in text:
            raise ValueError(f"header {key} holds a line break")
        lines.append(f"{key}={text}")
    return "\n".join(lines).encode()


def decode_headers(raw: bytes) -> dict[str, str]:
    if not raw:
        return {}
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise WmpError("the header frame is not UTF-8") from None
    headers: dict[str, str] = {}
    for line in text.split("\n"):
        if not line:
            continue
        key, sep, value = line.partition("=")
        if not sep or not _KEY.match(key):
            raise WmpError(f"bad header line {line[:40]!r}")
        if "\r" in value:
            raise WmpError(f"header {key} holds a line break")
        if key in headers:
            raise WmpError(f"header {key} appears twice")
        headers[key] = value
    return headers


# ---------------------------------------------------------------- messages


def encode(
    command: bytes, headers: Mapping[str, object] | None = None, payload: Sequence[bytes] = ()
) -> list[bytes]:
    """The body of a message: signature, command, header frame, payload frames."""
    return [SIGNATURE, command, encode_headers(headers), *payload]


def decode(body: Sequence[bytes]) -> Message:
    """The message of a body (after the envelope and its delimiter). Raises WmpError."""
    if not body or body[0] != SIGNATURE:
        raise WmpError("not a WMP01 message", answerable=False)
    if len(body) < 3:
        raise WmpError("too few frames: a command and a header frame are required")
    command = body[1]
    if command not in COMMANDS:
        raise WmpError(f"unknown command {command[:20]!r}")
    return Message(command, decode_headers(body[2]), tuple(body[3:]))


def split_envelope(frames: Sequence[bytes]) -> tuple[tuple[bytes, ...], list[bytes]]:
    """(the routing hops, the body) of a message; raises WmpError (not answerable) without
    a delimiter within MAX_HOPS frames."""
    for index, frame in enumerate(frames):
        if not frame:
            return tuple(frames[:index]), list(frames[index + 1 :])
        if index >= MAX_HOPS:
            break
    raise WmpError("no envelope delimiter", answerable=False)


def with_envelope(hops: Iterable[bytes], body: Sequence[bytes]) -> list[bytes]:
    return [*hops, b"", *body]


# ---------------------------------------------------------------- via: the way back up


def push_via(message: Message, link: int) -> Message:
    """A device passing a message down adds the manager link it came from."""
    via = message.get("via")
    headers = dict(message.headers)
    headers["via"] = f"{via}.{link}" if via else str(link)
    return Message(message.command, headers, message.payload)


def pop_via(message: Message) -> tuple[int, Message]:
    """A device passing a message up takes its own link off `via`. Raises WmpError."""
    via = message.get("via")
    if not via:
        raise WmpError(f"{message.command.decode()} without via cannot be routed")
    rest, _, last = via.rpartition(".")
    if not last.isdigit():
        raise WmpError("bad via header")
    headers = dict(message.headers)
    if rest:
        headers["via"] = rest
    else:
        del headers["via"]
    return int(last), Message(message.command, headers, message.payload)


# ---------------------------------------------------------------- roles


def role_functions(function: str, roles: Iterable[str]) -> list[str]:
    """The engine functions a worker with `roles` serves for `function`: the function itself
    and `function@r1+r2...` for every non-empty subset of its roles, in sorted order (the
    role rule, docs/wmp.md)."""
    names = sorted(set(roles))
    out = [function]
    for size in range(1, len(names) + 1):
        out.extend(f"{function}@{'+'.join(combo)}" for combo in combinations(names, size))
    return out


def split_function(function: str) -> tuple[str, tuple[str, ...]]:
    """`resize@eu+gpu` -> (`resize`, (`eu`, `gpu`)): a job's function and required roles."""
    name, sep, roles = function.partition("@")
    if not sep:
        return function, ()
    return name, tuple(role for role in roles.split("+") if role)


def valid_name(name: str) -> bool:
    """A function or role name that fits a comma-separated header and the role rule."""
    return bool(name) and not any(c in name for c in ",@+\n\r=") and name.strip() == name
