"""Durability behind a small interface; see `jobwire.store.base`."""
