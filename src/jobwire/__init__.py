"""jobwire: one job server, every worker protocol, one engine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobwire import native

__version__ = "0.1.0"

# Before any hot module is imported: pick the compiled build or the pure sources.
native.choose()

if TYPE_CHECKING:
    from jobwire.sdk import (
        AsyncClient,
        Client,
        Job,
        JobException,
        JobFailed,
        ServerUnavailable,
        Timeout,
        Worker,
    )


# The SDK is imported on first use, so the server (and `import jobwire`) does not pay for it.
__all__ = [
    "AsyncClient",
    "Client",
    "Job",
    "JobException",
    "JobFailed",
    "ServerUnavailable",
    "Timeout",
    "Worker",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name in __all__ and name != "__version__":
        from jobwire import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'jobwire' has no attribute {name!r}")
