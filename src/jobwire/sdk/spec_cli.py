"""`jobwire spec register | checksum | list`: Rota job specs on the command line.

Registering is what a deployment does: it makes the spec in FILE the status quo, so only
workers built from the same spec (same checksum) get its jobs. The command talks to the
server's HTTP port (`POST /rota/v1/specs`).
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import click

from jobwire.protocols.rota import SpecError, checksum, load_spec

DEFAULT_URL = "http://127.0.0.1:8080"

url_option = click.option(
    "--url",
    default=DEFAULT_URL,
    show_default=True,
    envvar="JOBWIRE_URL",
    help="The jobwire server's HTTP address.",
)


def _read_spec(path: Path) -> dict[str, Any]:
    try:
        return load_spec(path.read_bytes())
    except OSError as exc:
        raise click.FileError(str(path), hint=str(exc)) from None
    except SpecError as exc:
        raise click.ClickException(f"{path}: {exc}") from None


def _call(method: str, url: str, body: bytes | None = None) -> Any:
    request = urllib.request.Request(
        url, data=body, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        text = exc.read().decode("utf-8", "replace")
        with contextlib.suppress(ValueError, KeyError, TypeError):
            text = json.loads(text)["error"]["message"]
        raise click.ClickException(f"{url}: HTTP {exc.code}: {text}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise click.ClickException(f"cannot reach {url}: {exc}") from None


@click.group("spec")
def spec_command() -> None:
    """Rota job specs: register them on a server, compute their checksums."""


@spec_command.command("register")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@url_option
def register(files: tuple[Path, ...], url: str) -> None:
    """Register the job spec in each FILE (JSON) as the status quo for its name."""
    specs = [_read_spec(path) for path in files]  # all valid before any is sent
    for spec in specs:
        body = json.dumps(spec).encode()
        reply = _call("POST", url.rstrip("/") + "/rota/v1/specs", body)["spec"]
        note = f" (replaced {reply['replaced']})" if reply.get("replaced") else ""
        click.echo(f"{reply['name']}\t{reply['checksum']}{note}")


@spec_command.command("checksum")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
def checksum_command(files: tuple[Path, ...]) -> None:
    """Print the checksum a worker built from each FILE must offer (no server needed)."""
    for path in files:
        spec = _read_spec(path)
        click.echo(f"{spec['name']}\t{checksum(spec)}")


@spec_command.command("list")
@url_option
def list_command(url: str) -> None:
    """The specs registered on the server."""
    for entry in _call("GET", url.rstrip("/") + "/rota/v1/specs")["specs"]:
        click.echo(f"{entry['name']}\t{entry['checksum']}\t{entry['registered_at']}")
