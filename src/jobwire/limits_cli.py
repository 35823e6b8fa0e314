"""`jobwire serve`'s resource-limit flags (README "Limits", docs/limits.md), gathered into one
`limits: Limits` argument so that the serve command's signature grows by one name."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from jobwire.server.limits import Limits

F = TypeVar("F", bound=Callable[..., Any])

_DEFAULTS = Limits()

#: (flag, Limits field, click type, help)
_FLAGS: list[tuple[str, str, Any, str]] = [
    (
        "--max-connections",
        "max_connections",
        click.IntRange(min=0),
        "Open connections on the Gearman and HTTP ports together; more are refused. 0: no bound.",
    ),
    (
        "--max-connections-per-ip",
        "max_connections_per_ip",
        click.IntRange(min=0),
        "Open connections from one source address; more are refused. 0: no bound.",
    ),
    (
        "--idle-timeout",
        "idle_timeout",
        click.FloatRange(min=0),
        "Seconds a new connection may stay without sending anything before it is closed. "
        "0: forever.",
    ),
    (
        "--max-output",
        "max_output",
        click.IntRange(min=0),
        "Bytes of replies a Gearman or WebSocket peer may leave unread before it is closed. "
        "0: no bound.",
    ),
    (
        "--http-header-timeout",
        "http_header_timeout",
        click.FloatRange(min=0),
        "Seconds an HTTP request's header may take to arrive, from its first byte (408). "
        "0: no bound.",
    ),
    (
        "--http-body-timeout",
        "http_body_timeout",
        click.FloatRange(min=0),
        "Seconds an HTTP request's body may take to arrive (408). 0: no bound.",
    ),
    (
        "--http-max-header-size",
        "http_max_header_size",
        click.IntRange(min=256),
        "Longest HTTP request line or header field, in bytes (400 beyond).",
    ),
    (
        "--http-max-headers",
        "http_max_headers",
        click.IntRange(min=1),
        "Most header fields in one HTTP request (400 beyond).",
    ),
    (
        "--ws-rate",
        "ws_rate",
        click.IntRange(min=0),
        "WebSocket messages per second one connection may send; over it the socket is closed "
        "with 1008. 0: no bound.",
    ),
]


def limit_options(command: F) -> F:
    """Add the flags to `command` and hand it `limits=Limits(...)` instead of them."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {field: kwargs.pop(field) for _, field, _, _ in _FLAGS}
        return command(*args, limits=Limits(**values), **kwargs)

    decorated: Any = wrapper
    for flag, field, kind, text in reversed(_FLAGS):
        decorated = click.option(
            flag, field, type=kind, default=getattr(_DEFAULTS, field), show_default=True, help=text
        )(decorated)
    result: F = decorated
    return result
