"""Durability behind a small interface; see `jobwire.store.base`."""

#: Where `jobwire serve` keeps jobs unless told otherwise.
DEFAULT_STORE = "sqlite:jobwire-data/jobwire.db"
