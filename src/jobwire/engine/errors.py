"""Errors the engine raises; adapters turn them into each protocol's error replies."""


class EngineError(Exception):
    """Base of every refusal the engine makes."""


class QueueFull(EngineError):
    """The function's maxqueue limit for this priority is reached."""


class JobNotHeld(EngineError):
    """A work update names a job the worker does not hold.

    `holder` says where the job is instead, never who holds it: "leased to another
    worker", "available", "retryable", "completed", ..., or "unknown" (no such job)."""

    def __init__(self, message: str, holder: str = "unknown") -> None:
        super().__init__(message)
        self.holder = holder


class UnknownJob(EngineError):
    """No job has this id."""


class IllegalTransition(EngineError):
    """The job's state does not allow the requested change."""


class StoreUnavailable(EngineError):
    """The durable store cannot accept writes now (disk full, locked, corrupt)."""
