"""Requests to the OJS binding's fixed paths, served without aiohttp's router and
middleware chain once the router has shown where they go.

For every request aiohttp resolves its route (a match object per request, after a walk
of the router's resources), then wraps the handler in each middleware layer and in one
of its own that sets the current app: a partial and a coroutine per layer (together
about 5 % of the server's samples under a stream of pushes, py-spy). The OJS edges
(`app.Edges`) are the app's only middleware unless CORS or auth is configured,
and the busiest requests (push, fetch, ack) go to plain paths, without variables. So the
first request to a (method, plain path) takes the usual way, and the route the router
found for it is kept with a match object made once; later requests to it call the edges
with that route's handler directly: the same code runs in the same order, minus the
lookups. Nothing else changes: with another middleware (CORS, auth), routes of a sub-
application, or an `Expect` header (aiohttp answers 100-continue), every request takes
the usual way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.web_urldispatcher import PlainResource, UrlMappingMatchInfo

RequestHandler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
Edges = Callable[
    [web.Request, Callable[[web.Request], Awaitable[web.StreamResponse]]],
    Awaitable[web.StreamResponse],
]

#: A route kept: its match object, made once, and its handler beside it.
Route = tuple[UrlMappingMatchInfo, Callable[[web.Request], Awaitable[web.StreamResponse]]]

#: Plain routes kept at most (the app has a few dozen; a bound all the same).
MAX_ROUTES = 256


def direct_handler(app: web.Application, edges: Edges, usual: RequestHandler) -> RequestHandler:
    """The server's request handler: `usual` (the app's), or the shortcut above when the
    edges are the app's only middleware."""
    if tuple(app.middlewares) != (edges,):
        return usual
    known: dict[tuple[str, str], Route] = {}

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        route = known.get((request.method, request.path))
        if route is None or "Expect" in request.headers:
            response: web.StreamResponse = await usual(request)
            _learn(request, app, known)
            return response
        assert isinstance(request, web.Request)
        match_info, handler = route
        request._match_info = match_info
        reply: web.StreamResponse = await edges(request, handler)
        return reply

    return handle


def _learn(
    request: web.BaseRequest,
    app: web.Application,
    known: dict[tuple[str, str], Route],
) -> None:
    """Keep the route of a request the router sent to a plain resource of `app` itself."""
    match_info = getattr(request, "_match_info", None)
    if not isinstance(match_info, UrlMappingMatchInfo) or len(known) >= MAX_ROUTES:
        return
    route = match_info.route
    if (
        not isinstance(route.resource, PlainResource)
        or match_info.apps != (app,)
        or route.method != request.method
        or route.resource.canonical != request.path
    ):
        return
    kept = UrlMappingMatchInfo({}, route)
    kept.add_app(app)
    kept.freeze()
    known[(request.method, request.path)] = (kept, kept.handler)
