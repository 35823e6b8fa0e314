"""`jobwire db migrate | status`: the PostgreSQL store's tables, from the command line."""

from __future__ import annotations

import json

import click

_STORE = click.option(
    "--store",
    envvar="JOBWIRE_STORE",
    required=True,
    metavar="postgresql://USER:PASS@HOST:PORT/DB",
    help="The PostgreSQL store (also $JOBWIRE_STORE).",
)


def _postgres(store: str) -> str:
    from jobwire.store import is_postgres

    if not is_postgres(store):
        raise click.BadParameter("only a postgresql:// store has a schema", param_hint="--store")
    return store


@click.group("db")
def db_command() -> None:
    """The PostgreSQL store's schema: create or upgrade it, or show its state."""


@db_command.command("migrate")
@_STORE
def migrate_command(store: str) -> None:
    """Create jobwire's tables, or upgrade them to this jobwire's version."""
    from jobwire.store.postgres import connect, migrate
    from jobwire.store.sqlite import StoreError

    try:
        with connect(_postgres(store)) as conn:
            before, after = migrate(conn)
    except StoreError as exc:
        raise click.ClickException(str(exc)) from exc
    if before == after:
        click.echo(f"schema version {after}: up to date")
    else:
        click.echo(f"schema version {before} -> {after}")


@db_command.command("status")
@_STORE
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status_command(store: str, as_json: bool) -> None:
    """Schema version, jobs by state, records, and the cluster's nodes."""
    from jobwire.engine.job import JobState
    from jobwire.store.postgres import SCHEMA_VERSION, status
    from jobwire.store.sqlite import StoreError

    try:
        info = status(_postgres(store))
    except StoreError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(info, sort_keys=True))
        return
    version = info["version"]
    click.echo(f"schema {info['schema']}: version {version} (this jobwire: {SCHEMA_VERSION})")
    if version < SCHEMA_VERSION:
        click.echo("  needs `jobwire db migrate` (or a `jobwire serve` on it)")
    for state, count in sorted(info.get("jobs", {}).items()):
        click.echo(f"  jobs {JobState(state).name.lower()}: {count}")
    if "records" in info:
        click.echo(f"  records: {info['records']}")
    if "unowned" in info:
        click.echo(f"  jobs in the shared queue (no node's): {info['unowned']}")
    if not info["nodes"]:
        click.echo("  nodes: none running")
    for node in info["nodes"]:
        state = "alive" if node["alive"] else "lease ran out"
        if node.get("peer"):
            state += f", peer links at {node['peer']}"
        click.echo(
            f"  node {node['id']} at {node['address']} (pid {node['pid']}, {state}):"
            f" {node['jobs']} jobs"
        )
