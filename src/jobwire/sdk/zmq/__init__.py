"""ZeroMQ in the SDK: Majordomo (RFC 7 and 18) clients and worker, MMI, and Titanic.

- `MdpClient`: blocking, Lazy Pirate (timeout 2.5 s, 3 attempts, a new socket each time).
- `AsyncMdpClient`: asyncio, many requests in flight, a DEALER each; PARTIALs streamed.
- `MdpWorker`: the Gearman `Worker`'s task API over Majordomo, with heartbeats (also while
  a task runs), reconnects with back-off and a new READY after DISCONNECT.
- `TitanicClient`: request / reply / wait / close (RFC 9).

They speak the RFCs' wire format through `jobwire.protocols.zmq`, so they work with
jobwire and with other Majordomo brokers; jobwire's error reply (`ServiceError`) and
`mmi.services` are extras that other brokers do not send.
"""

from jobwire.sdk.errors import ServerUnavailable, ServiceError
from jobwire.sdk.zmq.client import AsyncMdpClient, BadReply, MdpClient
from jobwire.sdk.zmq.common import DEFAULT_ENDPOINT, ERROR_MARK, Frames
from jobwire.sdk.zmq.titanic import TitanicClient
from jobwire.sdk.zmq.worker import MdpJob, MdpWorker

__all__ = [
    "DEFAULT_ENDPOINT",
    "ERROR_MARK",
    "AsyncMdpClient",
    "BadReply",
    "Frames",
    "MdpClient",
    "MdpJob",
    "MdpWorker",
    "ServerUnavailable",
    "ServiceError",
    "TitanicClient",
]
