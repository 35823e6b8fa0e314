"""Open Job Spec, sans-IO: envelope validation and serialisation, errors, retry policy math.

Nothing here knows about sockets, aiohttp or the engine; `jobwire.server.ojs` does the wiring.
"""
