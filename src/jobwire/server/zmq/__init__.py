"""The ZeroMQ listener: Majordomo 0.1/0.2 + MMI, Titanic, and the Paranoid Pirate queue."""

from jobwire.server.zmq.server import ZmqOptions, ZmqServer

__all__ = ["ZmqOptions", "ZmqServer"]
