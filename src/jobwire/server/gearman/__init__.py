"""The Gearman listener (TCP 4730): decode packets, call the engine, encode replies.

- `server`: options and the state the connections share (`GearmanServer`).
- `transport`: a connection's reads and batched, ordered output (`Transport`).
- `handlers`: the requests, each one engine call (`GearmanConnection`), and the engine's
  callbacks, turned into replies.
- `acks`: replies held until the store commits what they announce, retracted if it fails.
- `admin`: the admin text protocol's replies.

Framing and encoding are `jobwire.protocols.gearman`'s (`scanner`, `replies`).
"""

from jobwire.server.gearman.handlers import GearmanConnection
from jobwire.server.gearman.server import GearmanOptions, GearmanServer

__all__ = ["GearmanConnection", "GearmanOptions", "GearmanServer"]
