"""The Gearman handlers (server/gearman/handlers.py); end to end: tests/server/test_gearman.py."""

from __future__ import annotations

from jobwire.engine import PRIORITY_HIGH, PRIORITY_LOW, PRIORITY_NORMAL
from jobwire.protocols.gearman import scanner


def test_the_scanners_priorities_are_the_engines() -> None:
    # submit_plain hands them to Engine.enqueue as they are.
    assert (scanner.HIGH, scanner.NORMAL, scanner.LOW) == (
        PRIORITY_HIGH,
        PRIORITY_NORMAL,
        PRIORITY_LOW,
    )
