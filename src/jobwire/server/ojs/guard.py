"""Roles and the request rate on the HTTP port (OJS, the Rota `/work` WebSocket, /metrics).

`Authorization: Bearer TOKEN` (or, with mutual TLS, the client certificate) names the
principal: no or an unknown token is 401, a role that may not use the route 403, both with an
OJS error body. The dashboard (`/`, `/ui/...`) needs the admin role; a browser signs in at
`/ui/login` with an admin token and gets a session cookie (kept in memory: a restart signs
everyone out). With `--rate-limit N`, each principal (each peer address without --auth) may
make N requests a second; more are answered 429 with Retry-After.
"""

from __future__ import annotations

import html
import math
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web

from jobwire.protocols.ojs.errors import OJSError
from jobwire.server.auth import (
    ADMIN,
    CLIENT,
    WORKER,
    Principal,
    Security,
    bearer_token,
)
from jobwire.server.ojs.http import BASE

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: The principal of a request, once known (`request[PRINCIPAL]`).
PRINCIPAL: Final = web.RequestKey("jobwire_principal", Principal)

#: Routes anyone may use: what a load balancer or a client's discovery needs.
PUBLIC: Final = frozenset(
    {
        ("GET", "/ojs/manifest"),
        ("GET", BASE + "/health"),
        ("GET", "/health"),
        ("GET", "/ready"),
        ("GET", BASE + "/openapi.json"),
        ("GET", "/rota/v1/schema.json"),
    }
)

#: Routes of the worker role (by method and route pattern).
WORKER_ROUTES: Final = frozenset(
    {
        ("GET", "/work"),
        ("POST", BASE + "/workers/fetch"),
        ("POST", BASE + "/workers/ack"),
        ("POST", BASE + "/workers/nack"),
        ("POST", BASE + "/workers/heartbeat"),
        ("POST", BASE + "/workers/beat"),
        ("POST", BASE + "/workers/register"),
        ("POST", BASE + "/workers/deregister"),
        ("GET", BASE + "/workers/{worker_id}/health"),
        ("POST", BASE + "/jobs/fetch"),
        ("POST", BASE + "/jobs/{id}/ack"),
        ("POST", BASE + "/jobs/{id}/nack"),
        ("PUT", BASE + "/jobs/{id}/progress"),
    }
)

#: Requests that change state and belong to clients; any other change is the admin's.
CLIENT_CHANGES: Final = frozenset(
    {
        ("POST", BASE + "/jobs"),
        ("POST", BASE + "/jobs/batch"),
        ("DELETE", BASE + "/jobs/{id}"),
        ("POST", BASE + "/jobs/{id}/activate"),
        ("POST", BASE + "/workflows"),
        ("DELETE", BASE + "/workflows/{id}"),
    }
)

_READS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
#: Not a role: any authenticated principal may (reads outside the admin routes).
ANY: Final = "any"


#: The dashboard's sign-in page, and the cookie of a signed-in browser.
LOGIN: Final = "/ui/login"
SESSION_COOKIE: Final = "jobwire_session"
#: Signed-in browsers remembered at once; the oldest session ends past this.
MAX_SESSIONS: Final = 1000


def is_dashboard(route: str) -> bool:
    return route == "/" or route == "/ui" or route.startswith("/ui/")


def required_role(method: str, route: str) -> str | None:
    """The role a request needs: `ANY` principal, or None: none, it is public."""
    key = (method, route)
    if key in PUBLIC or (method == "HEAD" and ("GET", route) in PUBLIC):
        return None
    if is_dashboard(route):
        return ADMIN
    if key in WORKER_ROUTES:
        return WORKER
    if route.startswith(BASE + "/admin/") or route == "/metrics":
        return ADMIN
    if method in _READS:
        return ANY
    if key in CLIENT_CHANGES:
        return CLIENT
    return ADMIN


def _refusal(status: int, code: str, message: str, role: str | None = None) -> OJSError:
    headers = {"WWW-Authenticate": 'Bearer realm="jobwire"'} if status == 401 else None
    details = {"required_role": role} if role else None
    return OJSError(code, message, status=status, details=details, headers=headers)


class Guard:
    """The middleware; installed inside the OJS error middleware, so refusals are OJS bodies."""

    def __init__(self, security: Security) -> None:
        self.auth = security.auth
        self.limiter = security.rate_limiter()
        #: Dashboard sessions: cookie value -> principal.
        self.sessions: OrderedDict[str, Principal] = OrderedDict()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        key = request.remote or "-"
        auth = self.auth
        if auth is not None:
            if request.path == LOGIN:
                return await self.login(request)
            resource = request.match_info.route.resource
            route = resource.canonical if resource is not None else request.path
            role = required_role(request.method, route)
            if role is not None:
                principal = None
                token = bearer_token(request.headers.get("Authorization"))
                if token is not None:
                    principal = auth.by_token(token)
                    if principal is None:
                        raise _refusal(401, "unauthenticated", "unknown bearer token")
                elif is_dashboard(route) and SESSION_COOKIE in request.cookies:
                    principal = self.sessions.get(request.cookies[SESSION_COOKIE])
                if principal is None and token is None and request.transport is not None:
                    ssl_object = request.transport.get_extra_info("ssl_object")
                    if ssl_object is not None:
                        principal = auth.by_certificate(ssl_object.getpeercert())
                if principal is None and is_dashboard(route) and request.method == "GET":
                    return web.Response(status=303, headers={"Location": LOGIN})
                if principal is None:
                    raise _refusal(401, "unauthenticated", "send Authorization: Bearer TOKEN", role)
                if role != ANY and not principal.may(role):
                    raise _refusal(
                        403,
                        "forbidden",
                        f"principal {principal.name!r} lacks the {role} role",
                        role,
                    )
                request[PRINCIPAL] = principal
                key = principal.name
                settle = getattr(request.protocol, "settle", None)
                if settle is not None:  # authenticated: the idle timeout no longer applies
                    settle()
        limiter = self.limiter
        if limiter is not None:
            wait = limiter.take(key)
            if wait:
                raise OJSError(
                    "rate_limited",
                    "too many requests; slow down",
                    status=429,
                    retryable=True,
                    headers={"Retry-After": str(max(1, math.ceil(wait)))},
                )
        return await handler(request)

    async def login(self, request: web.Request) -> web.StreamResponse:
        """The dashboard's sign-in: a form for an admin token; a session cookie once right."""
        auth = self.auth
        assert auth is not None
        if self.limiter is not None and self.limiter.take(request.remote or "-"):
            return _login_page("Too many attempts; wait a moment.", 429)
        if request.method == "POST":
            form = await request.post()
            token = form.get("token")
            principal = auth.by_token(token) if isinstance(token, str) and token else None
            if principal is not None and principal.may(ADMIN):
                session = secrets.token_urlsafe(32)
                self.sessions[session] = principal
                while len(self.sessions) > MAX_SESSIONS:
                    self.sessions.popitem(last=False)
                response = web.Response(status=303, headers={"Location": "/"})
                response.set_cookie(
                    SESSION_COOKIE,
                    session,
                    path="/",
                    httponly=True,
                    samesite="Strict",
                    secure=request.secure,
                )
                return response
            return _login_page("That token is not an admin's.", 401)
        if request.method not in _READS:
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"])
        return _login_page("", 200)


def _login_page(message: str, status: int) -> web.Response:
    note = f'<p role="alert">{html.escape(message)}</p>' if message else ""
    body = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>jobwire: sign in</title></head><body><main><h1>jobwire</h1>"
        f'{note}<form method="post" action="{LOGIN}">'
        '<label>Admin token <input type="password" name="token" autocomplete="off" '
        'required></label> <button type="submit">Sign in</button></form></main></body></html>'
    )
    return web.Response(
        text=body,
        status=status,
        content_type="text/html",
        headers={"Cache-Control": "no-store", "X-Frame-Options": "DENY"},
    )
