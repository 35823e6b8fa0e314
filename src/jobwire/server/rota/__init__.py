"""The Rota worker protocol on the HTTP server: `/work` WebSocket workers and `/rota/v1`.

docs/rota.md is the reference; `jobwire.protocols.rota` is the codec.
"""

from jobwire.server.rota.service import ROTA_SERVICE, RotaOptions, RotaService

__all__ = ["ROTA_SERVICE", "RotaOptions", "RotaService"]
