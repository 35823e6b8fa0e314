"""The protocol-neutral engine: jobs, queues, workers, leases, timers."""

from jobwire.engine.engine import Engine, EngineConfig, QueueInfo
from jobwire.engine.errors import (
    EngineError,
    IllegalTransition,
    JobNotHeld,
    QueueFull,
    StoreUnavailable,
    UnknownJob,
)
from jobwire.engine.job import (
    PRIORITY_HIGH,
    PRIORITY_LOW,
    PRIORITY_NORMAL,
    Job,
    JobState,
    Output,
    Subscriber,
)
from jobwire.engine.lanes import FunctionInfo, Lane
from jobwire.engine.worker import Dispatch, WorkerHandler, WorkerSession, WorkerState

__all__ = [
    "PRIORITY_HIGH",
    "PRIORITY_LOW",
    "PRIORITY_NORMAL",
    "Dispatch",
    "Engine",
    "EngineConfig",
    "EngineError",
    "FunctionInfo",
    "IllegalTransition",
    "Job",
    "JobNotHeld",
    "JobState",
    "Lane",
    "Output",
    "QueueFull",
    "QueueInfo",
    "StoreUnavailable",
    "Subscriber",
    "UnknownJob",
    "WorkerHandler",
    "WorkerSession",
    "WorkerState",
]
