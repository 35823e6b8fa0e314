"""The Open Job Spec HTTP binding (`/ojs/v1`), served by aiohttp on the engine's event loop."""

from jobwire.server.ojs.app import OJSOptions, OJSService

__all__ = ["OJSOptions", "OJSService"]
