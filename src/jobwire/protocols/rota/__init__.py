"""The Rota worker protocol, sans-IO: JSON messages over the `/work` WebSocket.

Nothing here knows about sockets, aiohttp or the engine; `jobwire.server.rota` does the wiring
and `jobwire.sdk.ws_worker` is a worker that speaks it. docs/rota.md is the wire reference.
"""

from jobwire.protocols.rota.decode import (
    DEFAULT_MAX_MESSAGE,
    decode_server_message,
    decode_worker_message,
    result_bytes,
)
from jobwire.protocols.rota.encode import encode, job_copy_json, to_json
from jobwire.protocols.rota.errors import FATAL, CloseCode, ErrorCode, RotaError
from jobwire.protocols.rota.messages import (
    ALERT_LEVELS,
    NO_VALUE,
    VERSION,
    Ack,
    Alert,
    Assignment,
    ErrorMessage,
    Failure,
    Heartbeat,
    JobCopy,
    LogBatch,
    Progress,
    Registration,
    Result,
    Revoke,
    ServerMessage,
    SpecRef,
    SpecsChanged,
    SpecVerdict,
    Status,
    Success,
    Welcome,
)
from jobwire.protocols.rota.specs import SpecError, canonical, checksum, load_spec, validate_spec

__all__ = [
    "ALERT_LEVELS",
    "DEFAULT_MAX_MESSAGE",
    "FATAL",
    "NO_VALUE",
    "VERSION",
    "Ack",
    "Alert",
    "Assignment",
    "CloseCode",
    "ErrorCode",
    "ErrorMessage",
    "Failure",
    "Heartbeat",
    "JobCopy",
    "LogBatch",
    "Progress",
    "Registration",
    "Result",
    "Revoke",
    "RotaError",
    "ServerMessage",
    "SpecError",
    "SpecRef",
    "SpecVerdict",
    "SpecsChanged",
    "Status",
    "Success",
    "Welcome",
    "canonical",
    "checksum",
    "decode_server_message",
    "decode_worker_message",
    "encode",
    "job_copy_json",
    "load_spec",
    "result_bytes",
    "to_json",
    "validate_spec",
]
