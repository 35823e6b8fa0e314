"""The Gearman binary protocol and its admin text protocol."""

from jobwire.protocols.gearman.decoder import AdminCommand, Decoder, ProtocolError
from jobwire.protocols.gearman.packets import (
    REQUEST_ARGC,
    RESPONSE_ARGC,
    Packet,
    PacketType,
    encode,
    encode_request,
)

__all__ = [
    "REQUEST_ARGC",
    "RESPONSE_ARGC",
    "AdminCommand",
    "Decoder",
    "Packet",
    "PacketType",
    "ProtocolError",
    "encode",
    "encode_request",
]
