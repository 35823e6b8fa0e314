"""A small HTTP client for the dashboard's tests: keeps the CSRF cookie, posts forms, does not
follow redirects (a test asserts where an action sends the browser)."""

from __future__ import annotations

import http.client
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlencode

DEADLINE = 30.0
T = TypeVar("T")


@dataclass
class Page:
    status: int
    headers: dict[str, str]
    text: str

    def csrf(self) -> str:
        found = re.search(r'name="csrf" value="([^"]+)"', self.text)
        assert found, "the page has no form token"
        return found.group(1)


class Browser:
    def __init__(self, port: int) -> None:
        self.port = port
        self.cookies: dict[str, str] = {}

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Page:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=DEADLINE)
        try:
            sent = dict(headers or {})
            if self.cookies:
                sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            text = response.read().decode()
            for key, value in response.getheaders():
                if key.lower() == "set-cookie":
                    name, _, rest = value.partition("=")
                    self.cookies[name] = rest.split(";", 1)[0]
            return Page(response.status, {k.lower(): v for k, v in response.getheaders()}, text)
        finally:
            conn.close()

    def get(self, path: str) -> Page:
        return self.request("GET", path)

    def post_form(
        self, path: str, fields: dict[str, Any] | list[tuple[str, str]], **headers: str
    ) -> Page:
        body = urlencode(fields).encode()
        sent = {"Content-Type": "application/x-www-form-urlencoded", **headers}
        return self.request("POST", path, body, sent)

    def json(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        page = self.request(method, path, data, {"Content-Type": "application/json"})
        assert page.status < 300, (page.status, page.text)
        return json.loads(page.text) if page.text else None


def wait_until(probe: Callable[[], T | None], what: str, deadline: float = DEADLINE) -> T:
    """Poll `probe` until it returns something other than None (or fail after `deadline`)."""
    end = time.monotonic() + deadline
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
