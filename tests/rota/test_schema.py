"""The server publishes the schema its decoder uses (generated from protocols/rota/wire.py)."""

from __future__ import annotations

from jobwire.protocols.rota import REVISION, schema
from tests.rota.support import Rota, run
from tests.servers import ServerProcess


def test_the_schema_is_served(server: ServerProcess) -> None:
    async def scenario(rota: Rota) -> None:
        status, body = await rota.http.request("GET", "/rota/v1/schema.json")
        assert status == 200
        assert body == schema()
        assert body["x-rota-revision"] == REVISION

    run(server, scenario)
