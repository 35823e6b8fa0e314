"""Report the OJS conformance level reached by the conformance run."""

from __future__ import annotations

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from tests.ojs.test_conformance import RESULTS
    from tests.ojs.test_extensions import EXT_RESULTS

    if not RESULTS and not EXT_RESULTS:
        return
    terminalreporter.write_sep("=", "OJS conformance")
    for store, results in RESULTS.items():
        lines, level_reached = _levels(results)
        terminalreporter.write_line(f"{store} store: " + "; ".join(lines))
        terminalreporter.write_line(f"{store} store: conformant level: {level_reached}")
    for store, extensions in EXT_RESULTS.items():
        counts = [
            f"{name} {sum(tests.values())}/{len(tests)}"
            for name, tests in sorted(extensions.items())
        ]
        terminalreporter.write_line(f"{store} store, extensions: " + "; ".join(counts))


def _levels(results: dict[str, tuple[int, bool]]) -> tuple[list[str], int]:
    """A line per level, and the highest level passed whole along with every level below."""
    lines = []
    level_reached = -1
    broken = False
    for level in range(5):
        passed = [ok for lvl, ok in results.values() if lvl == level]
        if not passed:
            broken = True
            continue
        lines.append(f"level {level}: {sum(passed)}/{len(passed)} passed")
        if not broken and all(passed):
            level_reached = level
        else:
            broken = True
    return lines, level_reached
