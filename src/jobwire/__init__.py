"""jobwire: one job server, every worker protocol, one engine."""

__version__ = "0.1.0"
