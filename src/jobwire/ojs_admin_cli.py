"""`jobwire worker-state ID quiet|terminate|running`: an operator directs a worker.

It calls the server's HTTP admin endpoint `POST /ojs/v1/admin/workers/{id}/state`. An OJS
worker learns its new state from its next heartbeat reply; a Rota worker (id `rota:N`) is
sent it over its `/work` socket at once.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import click

from jobwire.sdk.cli_security import security_options, tls_context

DEFAULT_URL = "http://127.0.0.1:8080"


def set_worker_state(
    url: str,
    worker_id: str,
    state: str,
    timeout: float = 10.0,
    *,
    tls: ssl.SSLContext | None = None,
    token: str | None = None,
) -> dict[str, object]:
    """POST the state; returns the reply's worker object; raises click.ClickException.
    `tls`: the context for an https:// URL; `token`: an admin principal's bearer token."""
    path = f"/ojs/v1/admin/workers/{urllib.parse.quote(worker_id, safe='')}/state"
    headers = {"Content-Type": "application/openjobspec+json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(
        url.rstrip("/") + path,
        data=json.dumps({"state": state}).encode(),
        headers=headers,
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=tls) as response:
            body = json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = exc.reason
        raise click.ClickException(f"{exc.code}: {message}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise click.ClickException(f"cannot reach {url}: {exc}") from None
    worker: dict[str, object] = body.get("worker", {})
    return worker


@click.command("worker-state")
@click.argument("worker_id")
@click.argument("state", type=click.Choice(["quiet", "terminate", "running"]))
@click.option(
    "--url", default=DEFAULT_URL, show_default=True, help="The jobwire server's HTTP address."
)
@security_options
def worker_state_command(
    worker_id: str,
    state: str,
    url: str,
    token: str | None,
    tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
) -> None:
    """Tell worker WORKER_ID (OJS, or Rota `rota:N`) to go quiet, terminate, or run again.
    With --auth on the server, --token (or $JOBWIRE_TOKEN) names an admin principal."""
    tls = tls_context(tls_ca, tls_cert, tls_key)
    worker = set_worker_state(url, worker_id, state, tls=tls, token=token)
    click.echo(f"{worker.get('worker_id', worker_id)}: {worker.get('state', state)}")
