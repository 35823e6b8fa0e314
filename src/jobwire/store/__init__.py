"""Durability behind a small interface; see `jobwire.store.base`."""

#: Where `jobwire serve` keeps jobs unless told otherwise.
DEFAULT_STORE = "sqlite:jobwire-data/jobwire.db"


def is_postgres(spec: str) -> bool:
    """A `--store` naming a PostgreSQL database (`jobwire.store.postgres`)."""
    return spec.startswith(("postgresql://", "postgres://"))
