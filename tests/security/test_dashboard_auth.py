"""With --auth the dashboard is the admin's: a Bearer token, or a browser session from the
sign-in form at /ui/login."""

from __future__ import annotations

import http.client
import urllib.parse

from tests.security.conftest import TOKENS
from tests.servers import ServerProcess


def request(
    server: ServerProcess,
    method: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    form: dict[str, str] | None = None,
) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    body = None
    headers = dict(headers or {})
    if form is not None:
        body = urllib.parse.urlencode(form)
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


def test_the_dashboard_sends_a_browser_without_a_session_to_sign_in(authed: ServerProcess) -> None:
    for path in ("/", "/ui/queues", "/ui/workers"):
        response = request(authed, "GET", path)
        assert response.status == 303
        assert response.getheader("Location") == "/ui/login"
    assert request(authed, "GET", "/ui/login").status == 200


def test_only_an_admin_token_signs_in_and_the_session_opens_the_dashboard(
    authed: ServerProcess,
) -> None:
    for name in ("submitter", "runner"):
        refused = request(authed, "POST", "/ui/login", form={"token": TOKENS[name]})
        assert refused.status == 401
        assert refused.getheader("Set-Cookie") is None
    assert request(authed, "POST", "/ui/login", form={"token": "nobody"}).status == 401

    signed_in = request(authed, "POST", "/ui/login", form={"token": TOKENS["operator"]})
    assert signed_in.status == 303
    cookie = signed_in.getheader("Set-Cookie") or ""
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert TOKENS["operator"] not in cookie  # a session id, not the token
    session = cookie.split(";", 1)[0]
    assert request(authed, "GET", "/ui/queues", headers={"Cookie": session}).status == 200
    # A made-up session is no session.
    forged = {"Cookie": "jobwire_session=forged"}
    assert request(authed, "GET", "/ui/queues", headers=forged).status == 303
    # The session is the dashboard's only: the OJS API still wants a Bearer token.
    assert request(authed, "GET", "/ojs/v1/admin/queues", headers={"Cookie": session}).status == 401


def test_bearer_tokens_reach_the_dashboard_by_role(authed: ServerProcess) -> None:
    admin = {"Authorization": f"Bearer {TOKENS['operator']}"}
    client = {"Authorization": f"Bearer {TOKENS['submitter']}"}
    assert request(authed, "GET", "/ui/workers", headers=admin).status == 200
    assert request(authed, "GET", "/ui/workers", headers=client).status == 403
